// The checks both decoders share (decode_rules.h).
#include "watcher/decode_rules.h"

#include "model/time.h"

namespace endpointd::watcher::rules {

std::string describe(std::optional<model::ObjectKind> kind, std::string_view ns,
                     std::string_view name) {
  std::string out = kind ? std::string(model::to_string(*kind)) : std::string("object");
  if (ns.empty() && kind && *kind != model::ObjectKind::kNode) ns = "default";
  if (!name.empty()) {
    out += ' ';
    if (!ns.empty()) {
      out += ns;
      out += '/';
    }
    out += name;
  }
  return out;
}

void check_name(std::string_view name) {
  if (name.empty()) fail("metadata.name missing");
  if (name.size() > 253) fail("metadata.name longer than 253 characters");
}

model::IpAddr ip(std::string_view text, std::string_view path) {
  auto a = model::IpAddr::parse(text);
  if (!a) fail(std::string(path) + ": invalid IP address \"" + std::string(text) + "\"");
  return *a;
}

uint16_t port(int64_t v, std::string_view path, bool allow_zero) {
  if (v < (allow_zero ? 0 : 1) || v > 65535)
    fail(std::string(path) + ": port " + std::to_string(v) + " out of range");
  return static_cast<uint16_t>(v);
}

model::Protocol protocol(std::string_view p, std::string_view path) {
  auto proto = model::parse_protocol(p);
  if (!proto) fail(std::string(path) + ".protocol: unknown protocol \"" + std::string(p) + "\"");
  return *proto;
}

model::AddressType address_type(std::string_view at) {
  if (at == "IPv4") return model::AddressType::kIPv4;
  if (at == "IPv6") return model::AddressType::kIPv6;
  if (at == "FQDN") return model::AddressType::kFQDN;
  if (at.empty()) fail("addressType missing");
  fail("addressType: unknown value \"" + std::string(at) + "\"");
}

void add_address(model::Endpoint& e, model::AddressType type, std::string_view v) {
  if (type == model::AddressType::kFQDN) return;
  auto a = ip(v, ".addresses");
  const bool want_v4 = type == model::AddressType::kIPv4;
  if (a.is_v4() != want_v4)
    fail(".addresses: \"" + std::string(v) + "\" is not an " + (want_v4 ? "IPv4" : "IPv6") +
         " address");
  e.addresses.push_back(a);
}

void check_addresses(const model::Endpoint& e, model::AddressType type) {
  if (e.addresses.empty() && type != model::AddressType::kFQDN) fail(".addresses: empty");
}

void set_trigger_time(model::EndpointSlice& s, std::string_view value) {
  if (auto t = model::parse_rfc3339(std::string(value))) s.trigger_time = *t;
}

}  // namespace endpointd::watcher::rules
