// Names the zone builder makes from text and addresses.
#include "dns/zone_names.h"

#include <algorithm>
#include <charconv>

namespace endpointd::dns::names {

using model::IpAddr;

WireName must_name(const std::string& text) {
  auto n = name_from_text(text);
  if (!n) return *name_from_text(".");
  lowercase_name({n->bytes.data(), n->len});
  return *n;
}

WireName reverse_name(const IpAddr& a) {
  static constexpr char kHex[] = "0123456789abcdef";
  WireName n;
  size_t p = 0;
  const uint8_t* b = a.data();
  if (a.is_v4()) {
    for (int i = 3; i >= 0; --i) {
      char digits[4];
      auto [end, ec] = std::to_chars(digits, digits + sizeof digits, b[i]);
      (void)ec;
      auto len = static_cast<size_t>(end - digits);
      n.bytes[p++] = static_cast<uint8_t>(len);
      std::memcpy(n.bytes.data() + p, digits, len);
      p += len;
    }
    static constexpr uint8_t kSuffix[] = {7,   'i', 'n', '-', 'a', 'd', 'd',
                                          'r', 4,   'a', 'r', 'p', 'a', 0};
    std::memcpy(n.bytes.data() + p, kSuffix, sizeof kSuffix);
    n.len = static_cast<uint8_t>(p + sizeof kSuffix);
    return n;
  }
  for (int i = 15; i >= 0; --i) {
    n.bytes[p++] = 1;
    n.bytes[p++] = static_cast<uint8_t>(kHex[b[i] & 0xF]);
    n.bytes[p++] = 1;
    n.bytes[p++] = static_cast<uint8_t>(kHex[b[i] >> 4]);
  }
  static constexpr uint8_t kSuffix[] = {3, 'i', 'p', '6', 4, 'a', 'r', 'p', 'a', 0};
  std::memcpy(n.bytes.data() + p, kSuffix, sizeof kSuffix);
  n.len = static_cast<uint8_t>(p + sizeof kSuffix);
  return n;
}

WireName wire_of(std::string_view v) {
  WireName n;
  n.len = static_cast<uint8_t>(std::min(v.size(), kMaxNameWire));
  std::memcpy(n.bytes.data(), v.data(), n.len);
  return n;
}

}  // namespace endpointd::dns::names
