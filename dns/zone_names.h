// Names the zone builder makes from text and addresses, in wire form and lower case. Private
// to dns/zone_*.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "dns/message.h"
#include "model/ip.h"

namespace endpointd::dns::names {

inline uint8_t lower(char c) {
  auto u = static_cast<uint8_t>(c);
  return (u >= 'A' && u <= 'Z') ? static_cast<uint8_t>(u + 32) : u;
}

// A name put together from text labels and a wire suffix, lower case.
class NameBuf {
 public:
  // Appends the labels of dotted `text`; `prefix` (when not 0) goes before the first label.
  NameBuf& text(std::string_view t, char prefix = 0) {
    while (ok_) {
      size_t dot = t.find('.');
      std::string_view label = t.substr(0, dot);
      size_t len = label.size() + (prefix ? 1 : 0);
      if (label.empty() || len > kMaxLabel || pos_ + 1 + len + 1 > kMaxNameWire) {
        ok_ = false;
        break;
      }
      n_.bytes[pos_++] = static_cast<uint8_t>(len);
      if (prefix) n_.bytes[pos_++] = static_cast<uint8_t>(prefix);
      for (char c : label) n_.bytes[pos_++] = lower(c);
      prefix = 0;
      if (dot == std::string_view::npos) break;
      t.remove_prefix(dot + 1);
    }
    return *this;
  }
  std::optional<WireName> finish(const WireName& suffix) {
    if (!ok_ || pos_ + suffix.len > kMaxNameWire) return std::nullopt;
    std::memcpy(n_.bytes.data() + pos_, suffix.bytes.data(), suffix.len);
    n_.len = static_cast<uint8_t>(pos_ + suffix.len);
    return n_;
  }

 private:
  WireName n_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// `text` as a name, lower case; the root when it is not one.
WireName must_name(const std::string& text);
// The reverse (PTR) name of `a`: in-addr.arpa or ip6.arpa.
WireName reverse_name(const model::IpAddr& a);
// Bytes that already are a wire name.
WireName wire_of(std::string_view v);

}  // namespace endpointd::dns::names
