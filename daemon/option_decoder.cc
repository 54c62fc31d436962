// The Decoder: a setting from the command line, else the config file, checked by its kind.
#include "daemon/option_decoder.h"

#include <cctype>
#include <charconv>

namespace endpointd::daemon {

namespace {

std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

}  // namespace

Decoder::Decoder(const RawFlags& flags, std::map<std::string, Given> file)
    : file_(std::move(file)) {
  for (const auto& [name, values] : flags) flags_[name] = Given{"--" + name, values};
}

std::string Decoder::origin(const std::string& name) const {
  if (auto it = flags_.find(name); it != flags_.end()) return it->second.origin;
  if (auto it = file_.find(name); it != file_.end()) return it->second.origin;
  return {};
}

std::optional<Given> Decoder::take(const std::string& name) {
  taken_.insert(name);
  if (auto it = flags_.find(name); it != flags_.end()) return it->second;
  if (auto it = file_.find(name); it != file_.end()) return it->second;
  return std::nullopt;
}

void Decoder::fail(const std::string& message) {
  if (error_.empty()) error_ = message;
}

void Decoder::fail(const Given& g, std::string_view value, const std::string& what) {
  fail(g.origin + ": " + in_quotes(value) + " " + what);
}

std::optional<std::string> Decoder::one(const std::string& name) {
  auto g = take(name);
  if (!g) return std::nullopt;
  if (g->values.size() != 1) {
    fail(g->origin + ": expected one value, got " + std::to_string(g->values.size()));
    return std::nullopt;
  }
  last_ = *g;
  return trim(g->values[0]);
}

std::string Decoder::text(const std::string& name, std::string def) {
  auto v = one(name);
  return v ? *v : def;
}

bool Decoder::boolean(const std::string& name, bool def) {
  auto v = one(name);
  if (!v) return def;
  std::string s = *v;
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
  if (s == "false" || s == "no" || s == "off" || s == "0") return false;
  fail(last_, *v, "is not true or false");
  return def;
}

std::optional<size_t> Decoder::choice(const std::string& name,
                                      const std::vector<std::string>& names) {
  auto v = one(name);
  if (!v) return std::nullopt;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == *v) return i;
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : "|") + n;
  fail(last_, *v, "is not one of " + all);
  return std::nullopt;
}

int64_t Decoder::integer(const std::string& name, int64_t lo, int64_t hi, int64_t def) {
  auto v = one(name);
  if (!v) return def;
  int64_t n = 0;
  auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
  if (v->empty() || ec != std::errc() || end != v->data() + v->size() || n < lo || n > hi) {
    fail(last_, *v, "is not a whole number in " + std::to_string(lo) + ".." + std::to_string(hi));
    return def;
  }
  return n;
}

std::optional<model::HostPort> Decoder::listen(const std::string& name, Host host,
                                               std::optional<model::HostPort> def) {
  auto v = one(name);
  if (!v) return def;
  if (v->empty()) return std::nullopt;
  auto hp = model::parse_host_port(*v);
  if (!hp) {
    fail(last_.origin + ": " + hp.error());
    return def;
  }
  if (host == Host::kRequired && hp->host.empty()) {
    fail(last_, *v, "has no address (0.0.0.0 or [::] for every address)");
    return def;
  }
  if (host == Host::kIp && !model::IpAddr::parse(hp->host)) {
    fail(last_, *v, "is not IP:PORT or [IPv6]:PORT (DNS binds one address)");
    return def;
  }
  return *hp;
}

std::optional<std::pair<Given, std::vector<std::string>>> Decoder::list(const std::string& name) {
  auto g = take(name);
  if (!g) return std::nullopt;
  std::vector<std::string> out;
  for (const auto& v : g->values) {
    size_t start = 0;
    while (true) {
      auto comma = v.find(',', start);
      std::string item = trim(std::string_view(v).substr(
          start, comma == std::string::npos ? std::string::npos : comma - start));
      if (!item.empty()) out.push_back(std::move(item));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return std::make_pair(std::move(*g), std::move(out));
}

std::vector<model::IpPrefix> Decoder::cidrs(const std::string& name, bool primary_ok) {
  std::vector<model::IpPrefix> out;
  auto l = list(name);
  if (!l) return out;
  if (primary_ok && l->second == std::vector<std::string>{"primary"}) return out;
  for (const auto& s : l->second) {
    if (primary_ok && s == "primary") {
      fail(l->first, s, "is allowed only alone (the node's primary IPs), not with CIDRs");
      return {};
    }
    auto p = model::IpPrefix::parse(s);
    if (!p) {
      fail(l->first, s, "is not a CIDR");
      return {};
    }
    out.push_back(*p);
  }
  return out;
}

std::vector<model::HostPort> Decoder::upstreams(const std::string& name) {
  std::vector<model::HostPort> out;
  auto l = list(name);
  if (!l) return out;
  for (const auto& s : l->second) {
    auto hp = model::parse_host_port(s, 53);
    if (!hp || !model::IpAddr::parse(hp->host) || hp->port == 0) {
      fail(l->first, s, "is not IP[:PORT] or [IPv6]:PORT");
      return {};
    }
    out.push_back(*hp);
  }
  return out;
}

Status Decoder::finish() {
  for (const auto& [name, g] : flags_)
    if (!taken_.count(name)) fail(g.origin + ": not a flag of endpointd run");
  for (const auto& [name, g] : file_)
    if (!taken_.count(name)) fail("config file: unknown key " + in_quotes(name));
  if (!error_.empty()) return Error{error_};
  return {};
}

}  // namespace endpointd::daemon
