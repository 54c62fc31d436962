// Register-layout helpers and names for the endpointd table model.
#include "proxy/table.h"

#include <cstring>

namespace endpointd::proxy {

size_t Table::element_count() const {
  size_t n = 0;
  for (const auto& [_, s] : sets) n += s.elements.size();
  return n;
}

std::string addr_field(const model::IpAddr& a) {
  std::string s(a.size(), '\0');
  std::memcpy(s.data(), a.data(), a.size());
  return s;
}

std::string proto_field(uint8_t l4proto) {
  std::string s(4, '\0');
  s[0] = static_cast<char>(l4proto);
  return s;
}

std::string port_field(uint16_t port) {
  std::string s(4, '\0');
  s[0] = static_cast<char>(port >> 8);
  s[1] = static_cast<char>(port & 0xff);
  return s;
}

std::string u32_field(uint32_t v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);
  return s;
}

std::string prefix_last(const model::IpPrefix& p) {
  std::string bytes = addr_field(p.addr());
  int bits = p.length();
  for (size_t i = 0; i < bytes.size(); ++i) {
    int keep = bits - static_cast<int>(i) * 8;
    uint8_t mask = keep >= 8 ? 0xff : keep <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - keep));
    bytes[i] = static_cast<char>(static_cast<uint8_t>(bytes[i]) | static_cast<uint8_t>(~mask));
  }
  return bytes;
}

namespace names {
std::string backends(uint32_t n) {
  return "backends-" + std::to_string(n);
}
std::string local_backends(uint32_t n) {
  return "local-backends-" + std::to_string(n);
}
}  // namespace names

}  // namespace endpointd::proxy
