// IP address parsing and printing on top of inet_pton/inet_ntop.
#include "model/ip.h"

#include <arpa/inet.h>

#include <cstring>

namespace endpointd::model {

std::string_view to_string(IpFamily f) {
  return f == IpFamily::kV4 ? "IPv4" : "IPv6";
}

std::optional<IpAddr> IpAddr::parse(std::string_view text) {
  if (text.empty() || text.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  char buf[INET6_ADDRSTRLEN];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  IpAddr a;
  if (text.find(':') == std::string_view::npos) {
    // inet_pton accepts only dotted quads with four parts for AF_INET, which is what we want.
    if (inet_pton(AF_INET, buf, a.bytes_.data()) != 1) return std::nullopt;
    a.family_ = IpFamily::kV4;
  } else {
    if (inet_pton(AF_INET6, buf, a.bytes_.data()) != 1) return std::nullopt;
    a.family_ = IpFamily::kV6;
    // An IPv4-mapped IPv6 address is the IPv4 address, as Kubernetes treats it.
    static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(a.bytes_.data(), kMapped, 12) == 0) {
      std::array<uint8_t, 16> v4{};
      std::memcpy(v4.data(), a.bytes_.data() + 12, 4);
      a.bytes_ = v4;
      a.family_ = IpFamily::kV4;
    }
  }
  return a;
}

IpAddr IpAddr::v4(uint32_t host_order) {
  IpAddr a;
  a.family_ = IpFamily::kV4;
  a.bytes_[0] = static_cast<uint8_t>(host_order >> 24);
  a.bytes_[1] = static_cast<uint8_t>(host_order >> 16);
  a.bytes_[2] = static_cast<uint8_t>(host_order >> 8);
  a.bytes_[3] = static_cast<uint8_t>(host_order);
  return a;
}

IpAddr IpAddr::from_bytes(IpFamily family, const uint8_t* bytes) {
  IpAddr a;
  a.family_ = family;
  std::memcpy(a.bytes_.data(), bytes, family == IpFamily::kV4 ? 4 : 16);
  return a;
}

bool IpAddr::is_unspecified() const {
  for (size_t i = 0; i < size(); ++i)
    if (bytes_[i] != 0) return false;
  return true;
}

bool IpAddr::is_loopback() const {
  if (is_v4()) return bytes_[0] == 127;
  for (size_t i = 0; i < 15; ++i)
    if (bytes_[i] != 0) return false;
  return bytes_[15] == 1;
}

std::string IpAddr::str() const {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(is_v4() ? AF_INET : AF_INET6, bytes_.data(), buf, sizeof buf);
  return buf;
}

std::string IpAddr::dashed() const {
  std::string s = str();
  for (char& c : s)
    if (c == '.' || c == ':') c = '-';
  return s;
}

std::optional<IpPrefix> IpPrefix::parse(std::string_view text) {
  auto slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  auto addr = IpAddr::parse(text.substr(0, slash));
  if (!addr) return std::nullopt;
  std::string_view len = text.substr(slash + 1);
  if (len.empty() || len.size() > 3) return std::nullopt;
  int n = 0;
  for (char c : len) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  int max = addr->is_v4() ? 32 : 128;
  if (n > max) return std::nullopt;
  IpPrefix p;
  // Normalise: clear host bits so that equal networks compare equal.
  std::array<uint8_t, 16> b{};
  std::memcpy(b.data(), addr->data(), addr->size());
  for (int bit = n; bit < max; ++bit) b[bit / 8] &= static_cast<uint8_t>(~(0x80u >> (bit % 8)));
  p.addr_ = IpAddr::from_bytes(addr->family(), b.data());
  p.length_ = n;
  return p;
}

bool IpPrefix::contains(const IpAddr& a) const {
  if (a.family() != addr_.family()) return false;
  int full = length_ / 8;
  if (std::memcmp(a.data(), addr_.data(), full) != 0) return false;
  int rest = length_ % 8;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff00u >> rest);
  return (a.data()[full] & mask) == (addr_.data()[full] & mask);
}

std::string IpPrefix::str() const {
  return addr_.str() + "/" + std::to_string(length_);
}

size_t IpAddrHash::operator()(const IpAddr& a) const {
  // FNV-1a over the address bytes and family.
  uint64_t h = 1469598103934665603ull ^ static_cast<uint8_t>(a.family());
  for (size_t i = 0; i < a.size(); ++i) {
    h ^= a.data()[i];
    h *= 1099511628211ull;
  }
  return static_cast<size_t>(h);
}

}  // namespace endpointd::model
