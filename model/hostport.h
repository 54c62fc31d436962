// "ADDR:PORT" as every listen flag, upstream and config key writes it: the one parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "model/result.h"

namespace endpointd::model {

struct HostPort {
  std::string host;  // an IP address, "localhost", or empty (every address)
  uint16_t port = 0;
  // "host:port", with brackets around an IPv6 host.
  std::string str() const;
  // Whether only this host can reach it: a loopback address or "localhost".
  bool loopback() const;
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

// Parses "ADDR:PORT", "[V6]:PORT", ":PORT" and "localhost:PORT". With a default port, a bare
// "ADDR", "V6" or "[V6]" is accepted too. The error names the value and the form it lacks.
Result<HostPort> parse_host_port(std::string_view s,
                                 std::optional<uint16_t> default_port = std::nullopt);

}  // namespace endpointd::model
