// IP addresses and prefixes as small values: parsed once at decode time, compared and
// hashed cheaply, printed in canonical form.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace endpointd::model {

enum class IpFamily : uint8_t { kV4 = 4, kV6 = 6 };

std::string_view to_string(IpFamily f);

class IpAddr {
 public:
  IpAddr() = default;
  // Accepts the canonical text forms only ("10.0.0.1", "fd00::1"); no zones, no prefixes.
  static std::optional<IpAddr> parse(std::string_view text);
  static IpAddr v4(uint32_t host_order);
  static IpAddr from_bytes(IpFamily family, const uint8_t* bytes);

  IpFamily family() const { return family_; }
  bool is_v4() const { return family_ == IpFamily::kV4; }
  bool is_v6() const { return family_ == IpFamily::kV6; }
  // 4 bytes for IPv4, 16 for IPv6, network order.
  const uint8_t* data() const { return bytes_.data(); }
  size_t size() const { return is_v4() ? 4 : 16; }
  bool is_unspecified() const;
  bool is_loopback() const;
  std::string str() const;
  // "10-0-0-1" / "fd00--1": the form DNS uses for pod and endpoint names.
  std::string dashed() const;

  friend auto operator<=>(const IpAddr&, const IpAddr&) = default;
  friend bool operator==(const IpAddr&, const IpAddr&) = default;

 private:
  IpFamily family_ = IpFamily::kV4;
  std::array<uint8_t, 16> bytes_{};
};

class IpPrefix {
 public:
  static std::optional<IpPrefix> parse(std::string_view text);  // "10.0.0.0/8"
  const IpAddr& addr() const { return addr_; }
  int length() const { return length_; }
  IpFamily family() const { return addr_.family(); }
  bool contains(const IpAddr& a) const;
  std::string str() const;
  friend auto operator<=>(const IpPrefix&, const IpPrefix&) = default;
  friend bool operator==(const IpPrefix&, const IpPrefix&) = default;

 private:
  IpAddr addr_;
  int length_ = 0;
};

struct IpAddrHash {
  size_t operator()(const IpAddr& a) const;
};

}  // namespace endpointd::model
