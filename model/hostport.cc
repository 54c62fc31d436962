// The ADDR:PORT parser (see hostport.h).
#include "model/hostport.h"

#include <charconv>

#include "model/ip.h"

namespace endpointd::model {

std::string HostPort::str() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool HostPort::loopback() const {
  if (host == "localhost") return true;
  auto ip = IpAddr::parse(host);
  return ip && ip->is_loopback();
}

Result<HostPort> parse_host_port(std::string_view s, std::optional<uint16_t> default_port) {
  auto bad = [&] {
    return Error{"\"" + std::string(s) + "\" is not " +
                 (default_port ? "ADDR, ADDR:PORT or [IPv6]:PORT" : "ADDR:PORT or [IPv6]:PORT")};
  };
  std::string_view host = s, port;
  bool has_port = false;
  if (!s.empty() && s.front() == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos) return bad();
    host = s.substr(1, close - 1);
    if (close + 1 < s.size()) {
      if (s[close + 1] != ':') return bad();
      port = s.substr(close + 2);
      has_port = true;
    }
  } else if (auto colon = s.rfind(':'); colon != std::string_view::npos) {
    if (s.find(':') == colon) {  // one colon: host:port
      host = s.substr(0, colon);
      port = s.substr(colon + 1);
      has_port = true;
    }  // several colons and no brackets: a bare IPv6 address
  }
  HostPort hp;
  if (has_port) {
    unsigned p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p > 65535)
      return bad();
    hp.port = static_cast<uint16_t>(p);
  } else {
    if (!default_port) return bad();
    hp.port = *default_port;
    if (host.empty()) return bad();
  }
  if (!host.empty() && host != "localhost" && !IpAddr::parse(host)) return bad();
  hp.host = std::string(host);
  return hp;
}

}  // namespace endpointd::model
