// Flags and the YAML config file, decoded into one typed Config. The file takes the flags' long
// names as keys (`source-dir: /etc/endpointd/manifests`), or is a KubeProxyConfiguration; a
// flag given on the command line wins over the file. Every check is in decode_config.
#include "daemon/config.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <set>

#include "daemon/kubeproxy_config.h"
#include "daemon/version.h"
#include "dns/message.h"
#include "dns/zone.h"
#include "model/time.h"
#include "watcher/decode.h"

namespace endpointd::daemon {

namespace {

template <typename E>
struct Named {
  std::string_view name;
  E value;
};

constexpr Named<Dataplane> kDataplanes[] = {{"nftables", Dataplane::kNftables},
                                            {"none", Dataplane::kNone}};
constexpr Named<watcher::ListMode> kListModes[] = {{"auto", watcher::ListMode::kAuto},
                                                   {"list", watcher::ListMode::kList},
                                                   {"cache", watcher::ListMode::kCache}};
constexpr Named<LogFormat> kLogFormats[] = {{"text", LogFormat::kText}, {"json", LogFormat::kJson}};
constexpr Named<LogLevel> kLogLevels[] = {{"trace", LogLevel::kTrace},
                                          {"debug", LogLevel::kDebug},
                                          {"info", LogLevel::kInfo},
                                          {"warn", LogLevel::kWarn},
                                          {"error", LogLevel::kError}};
constexpr Named<drain::PeerPolicy> kPeerPolicies[] = {{"proceed", drain::PeerPolicy::kProceed},
                                                      {"wait", drain::PeerPolicy::kWait}};
// --kube-api-content-type: what EndpointSlice lists are asked for in (true: protobuf).
constexpr Named<bool> kContentTypes[] = {{"application/vnd.kubernetes.protobuf", true},
                                         {"application/json", false}};
constexpr Named<bool> kPeerProtocols[] = {{"watermark", true}, {"per-endpoint", false}};
constexpr Named<drain::ReleaseAfter> kReleaseAfters[] = {
    {"removed", drain::ReleaseAfter::kRemoved}, {"drained", drain::ReleaseAfter::kDrained}};
constexpr Named<proxy::DetectLocal> kDetectLocalModes[] = {
    {"ClusterCIDR", proxy::DetectLocal::kClusterCidr},
    {"NodeCIDR", proxy::DetectLocal::kNodeCidr},
    {"BridgeInterface", proxy::DetectLocal::kBridgeInterface},
    {"InterfaceNamePrefix", proxy::DetectLocal::kInterfaceNamePrefix}};
constexpr Named<dns::PodMode> kPodRecords[] = {{"disabled", dns::PodMode::kDisabled},
                                               {"insecure", dns::PodMode::kInsecure},
                                               {"verified", dns::PodMode::kVerified}};

template <typename E, size_t N>
std::string_view name_in(const Named<E> (&table)[N], E v) {
  for (const auto& n : table)
    if (n.value == v) return n.name;
  return "?";
}

template <typename E, size_t N>
std::optional<E> value_in(const Named<E> (&table)[N], std::string_view s) {
  for (const auto& n : table)
    if (n.name == s) return n.value;
  return std::nullopt;
}

template <typename E, size_t N>
std::string names_in(const Named<E> (&table)[N]) {
  std::string out;
  for (const auto& n : table) out += (out.empty() ? "" : "|") + std::string(n.name);
  return out;
}

std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

// A Kubernetes namespace name: an RFC 1123 label.
bool is_dns_label(std::string_view s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

// One setting's value as written, and where it was written.
struct Given {
  std::string origin;  // "--dns-ttl", "config file key dns-ttl", "KubeProxyConfiguration key ..."
  std::vector<std::string> values;  // one per occurrence or list element; commas not yet split
};

// Takes each setting from the command line, else the file; remembers the first error and which
// file keys and flags no setting took.
class Decoder {
 public:
  Decoder(const RawFlags& flags, std::map<std::string, Given> file) : file_(std::move(file)) {
    for (const auto& [name, values] : flags) flags_[name] = Given{"--" + name, values};
  }

  bool given(const std::string& name) const { return flags_.count(name) || file_.count(name); }

  std::optional<Given> take(const std::string& name) {
    taken_.insert(name);
    if (auto it = flags_.find(name); it != flags_.end()) return it->second;
    if (auto it = file_.find(name); it != file_.end()) return it->second;
    return std::nullopt;
  }

  void fail(const std::string& message) {
    if (error_.empty()) error_ = message;
  }
  void fail(const Given& g, std::string_view value, const std::string& what) {
    fail(g.origin + ": " + in_quotes(value) + " " + what);
  }

  // An error about the value one() read last.
  void fail_last(std::string_view value, const std::string& what) { fail(last_, value, what); }
  // Where the value one() read last came from ("--dns-ttl", "config file key dns-ttl", ...).
  const std::string& last_origin() const { return last_.origin; }

  // The one value of a single-valued setting, or null (not given, or an error).
  std::optional<std::string> one(const std::string& name) {
    auto g = take(name);
    if (!g) return std::nullopt;
    if (g->values.size() != 1) {
      fail(g->origin + ": expected one value, got " + std::to_string(g->values.size()));
      return std::nullopt;
    }
    last_ = *g;
    return trim(g->values[0]);
  }

  std::string text(const std::string& name, std::string def) {
    auto v = one(name);
    return v ? *v : def;
  }

  bool boolean(const std::string& name, bool def) {
    auto v = one(name);
    if (!v) return def;
    std::string s = *v;
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
    if (s == "false" || s == "no" || s == "off" || s == "0") return false;
    fail(last_, *v, "is not true or false");
    return def;
  }

  template <typename E, size_t N>
  E choice(const std::string& name, const Named<E> (&table)[N], E def) {
    auto v = one(name);
    if (!v) return def;
    if (auto e = value_in(table, *v)) return *e;
    fail(last_, *v, "is not one of " + names_in(table));
    return def;
  }

  int64_t integer(const std::string& name, int64_t lo, int64_t hi, int64_t def) {
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

  enum class Host { kAny, kRequired, kIp };
  // "ADDR:PORT"; empty: off.
  std::optional<model::HostPort> listen(const std::string& name, Host host,
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

  // A list setting: elements of a list, each possibly comma-separated. Empty elements are
  // skipped, so an empty value gives an empty list.
  std::optional<std::pair<Given, std::vector<std::string>>> list(const std::string& name) {
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

  // `primary_ok`: the word "primary" alone stands for the node's primary IPs (an empty list).
  std::vector<model::IpPrefix> cidrs(const std::string& name, bool primary_ok = false) {
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

  // "ADDR[:PORT]" of DNS servers: IP addresses, port 53 unless given.
  std::vector<model::HostPort> upstreams(const std::string& name) {
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

  // Every flag and file key some setting took; otherwise the first one left names the error.
  Status finish() {
    for (const auto& [name, g] : flags_)
      if (!taken_.count(name)) fail(g.origin + ": not a flag of endpointd run");
    for (const auto& [name, g] : file_)
      if (!taken_.count(name)) fail("config file: unknown key " + in_quotes(name));
    if (!error_.empty()) return Error{error_};
    return {};
  }

 private:
  std::map<std::string, Given> flags_;
  std::map<std::string, Given> file_;
  std::set<std::string> taken_;
  Given last_;  // the setting one() read last, for its error
  std::string error_;
};

// A file of endpointd's own keys: the flags' long names → their values.
Result<std::map<std::string, Given>> own_file_settings(const YAML::Node& root) {
  std::map<std::string, Given> out;
  for (const auto& kv : root) {
    if (!kv.first.IsScalar()) return Error{"config file: a key is not a name"};
    std::string key = kv.first.as<std::string>();
    Given g{"config file key " + key, {}};
    if (kv.second.IsSequence()) {
      for (const auto& v : kv.second) {
        if (!v.IsScalar())
          return Error{g.origin + ": expected a list of values, not a list of lists or maps"};
        g.values.push_back(v.as<std::string>());
      }
    } else if (kv.second.IsScalar()) {
      g.values.push_back(kv.second.as<std::string>());
    } else if (kv.second.IsNull()) {
      g.values.push_back("");
    } else {
      return Error{g.origin + ": expected a value or a list, not a map"};
    }
    out[key] = std::move(g);
  }
  return out;
}

// A KubeProxyConfiguration's mapped keys, as the flags they stand for; `notes` gets the report.
Result<std::map<std::string, Given>> kubeproxy_settings(const YAML::Node& root,
                                                        std::vector<ConfigNote>& notes) {
  Result<KubeProxyConversion> conv = Error{""};
  try {
    conv = convert_kubeproxy_configuration(root);
  } catch (const YAML::Exception& e) {
    // A shape the conversion did not expect; every known one is checked, this is the backstop.
    return Error{std::string(kKubeProxyKind) + ": " + e.msg};
  }
  if (!conv) return Error{conv.error()};
  std::map<std::string, Given> out;
  for (const auto& s : conv->settings)
    out[s.flag] = Given{std::string(kKubeProxyKind) + " key " + s.from, s.values};
  auto lines = conv->report();
  for (size_t i = 0; i < lines.size(); ++i)
    notes.push_back({i >= conv->settings.size(), std::move(lines[i])});
  return out;
}

// Help text of a flag with its default shown, as CLI11 shows a captured default.
CLI::Option* add(CLI::App& app, const std::string& name, const std::string& help,
                 const std::string& def = {}) {
  CLI::Option* o = app.add_option("--" + name)->description(help);
  if (!def.empty()) o->default_str(def);
  return o;
}

std::string show(const std::optional<model::HostPort>& hp) {
  return hp ? hp->str() : std::string();
}

}  // namespace

std::string_view to_string(Dataplane v) {
  return name_in(kDataplanes, v);
}
std::string_view to_string(LogFormat v) {
  return name_in(kLogFormats, v);
}
std::string_view to_string(LogLevel v) {
  return name_in(kLogLevels, v);
}
std::string_view to_string(drain::PeerPolicy v) {
  return name_in(kPeerPolicies, v);
}
std::string_view to_string(drain::ReleaseAfter v) {
  return name_in(kReleaseAfters, v);
}
std::string_view to_string(dns::PodMode v) {
  return name_in(kPodRecords, v);
}
std::string_view to_string(proxy::DetectLocal v) {
  return name_in(kDetectLocalModes, v);
}
std::optional<proxy::DetectLocal> parse_detect_local_mode(std::string_view s) {
  return value_in(kDetectLocalModes, s);
}
std::optional<Dataplane> parse_dataplane(std::string_view s) {
  return value_in(kDataplanes, s);
}
std::optional<LogFormat> parse_log_format(std::string_view s) {
  return value_in(kLogFormats, s);
}
std::optional<LogLevel> parse_log_level(std::string_view s) {
  return value_in(kLogLevels, s);
}
std::optional<drain::PeerPolicy> parse_peer_policy(std::string_view s) {
  return value_in(kPeerPolicies, s);
}
std::optional<drain::ReleaseAfter> parse_release_after(std::string_view s) {
  return value_in(kReleaseAfters, s);
}
std::optional<dns::PodMode> parse_pod_records(std::string_view s) {
  return value_in(kPodRecords, s);
}

namespace {

// A config file's settings by flag name: endpointd's own keys, or a KubeProxyConfiguration's
// converted (`notes` gets its report). None for no file.
Result<std::map<std::string, Given>> file_settings(const YAML::Node* file,
                                                   std::vector<ConfigNote>& notes) {
  if (file == nullptr || file->IsNull()) return std::map<std::string, Given>{};
  if (!file->IsMap()) return Error{"config file: expected a map of settings"};
  return is_kubeproxy_configuration(*file) ? kubeproxy_settings(*file, notes)
                                           : own_file_settings(*file);
}

}  // namespace

Result<Config> decode_config(const RawFlags& flags, const YAML::Node* file) {
  Config cfg;
  auto from_file = file_settings(file, cfg.notes);
  if (!from_file) return Error{from_file.error()};
  RawFlags cli = flags;
  cli.erase("config");  // read by load_config
  Decoder d(cli, std::move(*from_file));
  using Host = Decoder::Host;

  cfg.source_dir = d.text("source-dir", cfg.source_dir);
  cfg.kubeconfig = d.text("kubeconfig", cfg.kubeconfig);
  cfg.node_name = d.text("node-name", cfg.node_name);
  cfg.watch_pods = d.boolean("watch-pods", cfg.watch_pods);
  cfg.events = d.boolean("events", cfg.events);
  cfg.watch_timeout = std::chrono::seconds(d.integer("watch-timeout", 10, 3600, 300));
  cfg.watch_stall_timeout = std::chrono::seconds(
      d.integer("watch-stall-timeout", 0, 3600, cfg.watch_stall_timeout.count()));
  if (cfg.watch_stall_timeout.count() > 0 && cfg.watch_stall_timeout.count() < 10)
    d.fail_last(std::to_string(cfg.watch_stall_timeout.count()),
                "is below 10 s: quiet watches would be re-established over and over (0 turns "
                "the check off)");
  cfg.list_page_size = static_cast<size_t>(d.integer("list-page-size", 1, 10000, 500));
  cfg.api_list_mode = d.choice("api-list-mode", kListModes, cfg.api_list_mode);
  // A media type, as kube-proxy takes it: without case, parameters (";charset=utf-8") ignored.
  if (auto v = d.one("kube-api-content-type")) {
    if (auto e = value_in(kContentTypes, watcher::media_type(*v)))
      cfg.kube_api_protobuf = *e;
    else
      d.fail_last(*v, "is not one of " + names_in(kContentTypes));
  }
  cfg.livez_timeout =
      std::chrono::seconds(d.integer("livez-timeout", 1, 3600, cfg.livez_timeout.count()));

  cfg.dataplane = d.choice("dataplane", kDataplanes, cfg.dataplane);
  cfg.cluster_cidr = d.cidrs("cluster-cidr");
  cfg.service_cidr = d.cidrs("service-cidr");
  // --detect-local-mode (kube-proxy's; an empty value is its default, ClusterCIDR) and the
  // interface its interface modes need. A setting's companion is named as its origin names
  // settings: a flag, a config file key, or a KubeProxyConfiguration key.
  std::string mode_origin;
  if (auto mode = d.one("detect-local-mode")) {
    mode_origin = d.last_origin();
    if (!mode->empty()) {
      if (auto m = parse_detect_local_mode(*mode))
        cfg.detect_local_mode = *m;
      else
        d.fail_last(*mode, "is not one of " + names_in(kDetectLocalModes));
    }
  }
  auto interface = [&](const char* name) {
    auto v = d.one(name);
    if (!v) return std::string();
    bool bad = v->empty() || v->size() > 15 || *v == "." || *v == "..";
    for (char c : *v)
      bad |= c == '/' || c == ':' || c == '*' || std::isspace(static_cast<unsigned char>(c));
    if (bad)
      d.fail_last(*v,
                  "is not a network interface name (1 to 15 characters, none of / : * or "
                  "spaces)");
    return *v;
  };
  cfg.pod_bridge_interface = interface("pod-bridge-interface");
  cfg.pod_interface_name_prefix = interface("pod-interface-name-prefix");
  auto needs = [&](const std::string& value, const char* flag, const char* kube_proxy_key) {
    if (!value.empty()) return;
    std::string companion = "--" + std::string(flag);
    if (mode_origin.rfind("config file key ", 0) == 0)
      companion = "config file key " + std::string(flag);
    if (mode_origin.rfind(kKubeProxyKind, 0) == 0)
      companion = std::string(kKubeProxyKind) + " key " + kube_proxy_key;
    d.fail(mode_origin + ": " + in_quotes(to_string(cfg.detect_local_mode)) + " needs " +
           companion);
  };
  if (cfg.detect_local_mode == proxy::DetectLocal::kBridgeInterface)
    needs(cfg.pod_bridge_interface, "pod-bridge-interface", "detectLocal.bridgeInterface");
  if (cfg.detect_local_mode == proxy::DetectLocal::kInterfaceNamePrefix)
    needs(cfg.pod_interface_name_prefix, "pod-interface-name-prefix",
          "detectLocal.interfaceNamePrefix");
  // "primary" (alone): the node's primary IPs, which is also the default.
  cfg.nodeport_addresses = d.cidrs("nodeport-addresses", true);
  cfg.masquerade_all = d.boolean("masquerade-all", cfg.masquerade_all);
  // kube-proxy's --conntrack-* flags; each only when given.
  auto count = [&](const char* name, std::optional<uint32_t>& out) {
    if (d.given(name)) out = static_cast<uint32_t>(d.integer(name, 0, 1 << 30, 0));
  };
  count("conntrack-max-per-core", cfg.conntrack.max_per_core);
  count("conntrack-min", cfg.conntrack.min);
  auto duration = [&](const char* name, std::optional<std::chrono::seconds>& out) {
    auto v = d.one(name);
    if (!v) return;
    auto t = model::parse_go_duration(*v);
    if (!t || t->count() > 30 * 86400)
      d.fail_last(*v, "is not a duration of at most 720h (e.g. 24h0m0s, 1h, 300s, or seconds)");
    else
      out = *t;
  };
  duration("conntrack-tcp-timeout-established", cfg.conntrack.tcp_established_timeout);
  duration("conntrack-tcp-timeout-close-wait", cfg.conntrack.tcp_close_wait_timeout);
  duration("conntrack-udp-timeout", cfg.conntrack.udp_timeout);
  duration("conntrack-udp-timeout-stream", cfg.conntrack.udp_stream_timeout);
  cfg.conntrack.tcp_be_liberal = d.boolean("conntrack-tcp-be-liberal", false);
  cfg.cleanup = d.boolean("cleanup", cfg.cleanup);
  cfg.init_only = d.boolean("init-only", cfg.init_only);
  d.take("write-config-to");  // acted on before decoding: write_config()

  cfg.dns_listen = d.listen("dns-listen", Host::kIp, cfg.dns_listen);
  if (auto zone = d.one("dns-zone")) {
    if (zone->empty() || !dns::name_from_text(*zone)) d.fail_last(*zone, "is not a DNS name");
    cfg.dns_zone = *zone;
  }
  if (auto l = d.list("dns-extra-zones")) {
    // Lower case, without the root's dot: the form the zone builder and the reload compare.
    auto canonical = [](std::string z) {
      if (!z.empty() && z.back() == '.') z.pop_back();
      for (char& c : z) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return z;
    };
    auto first = dns::name_from_text(canonical(cfg.dns_zone));
    for (const auto& text : l->second) {
      std::string z = canonical(text);
      auto w = dns::name_from_text(z);
      if (z.empty() || !w) {
        d.fail(l->first, text, "is not a DNS name");
        break;
      }
      if (first && dns::name_under(*w, *first)) {
        d.fail(l->first, text, "is inside the zone " + cfg.dns_zone + ", which answers it already");
        break;
      }
      if (std::find(cfg.dns_extra_zones.begin(), cfg.dns_extra_zones.end(), z) !=
          cfg.dns_extra_zones.end()) {
        d.fail(l->first, text, "is listed twice");
        break;
      }
      cfg.dns_extra_zones.push_back(z);
    }
  }
  cfg.dns_upstream = d.upstreams("dns-upstream");
  cfg.dns_pod_records = d.choice("dns-pod-records", kPodRecords, cfg.dns_pod_records);
  cfg.dns_loadbalance = d.boolean("dns-loadbalance", cfg.dns_loadbalance);
  cfg.dns_endpoint_pod_names = d.boolean("dns-endpoint-pod-names", cfg.dns_endpoint_pod_names);
  cfg.dns_lameduck = std::chrono::seconds(d.integer("dns-lameduck", 0, 300, 5));
  cfg.dns_ttl = std::chrono::seconds(d.integer("dns-ttl", 0, 3600, 5));
  cfg.dns_negative_ttl = std::chrono::seconds(d.integer("dns-negative-ttl", 0, 3600, 5));
  cfg.dns_noendpoints = d.boolean("dns-noendpoints", cfg.dns_noendpoints);
  cfg.dns_ignore_empty_service =
      d.boolean("dns-ignore-empty-service", cfg.dns_ignore_empty_service);
  if (auto l = d.list("dns-namespaces")) {
    for (const auto& ns : l->second) {
      if (!is_dns_label(ns)) {
        d.fail(l->first, ns, "is not a namespace name (a DNS label: a-z, 0-9, '-', at most 63)");
        break;
      }
      cfg.dns_namespaces.push_back(ns);
    }
  }
  cfg.dns_cache_size = static_cast<size_t>(d.integer("dns-cache-size", 0, 10'000'000, 10000));
  cfg.dns_cache_max_ttl = std::chrono::seconds(d.integer("dns-cache-max-ttl", 0, 86400, 3600));
  cfg.dns_cache_denial_max_ttl =
      std::chrono::seconds(d.integer("dns-cache-denial-max-ttl", 0, 86400, 1800));
  cfg.dns_forward_allow = d.cidrs("dns-forward-allow");
  // Any unicast address pods can route to the node. 169.254.0.0/16 is the one to use for IPv4
  // (never routed off a node, so it shadows no real host); others are accepted for IPv6, whose
  // link-local addresses pods cannot reach, and for clusters where that range is taken.
  if (auto v = d.one("dns-node-local-address"); v && !v->empty()) {
    auto a = model::IpAddr::parse(*v);
    auto in = [&](const char* cidr) { return a && model::IpPrefix::parse(cidr)->contains(*a); };
    if (!a)
      d.fail_last(*v, "is not an IP address");
    else if (in("fe80::/10"))
      d.fail_last(*v,
                  "is IPv6 link-local, which pods cannot route to: use a unique local address "
                  "such as fd00::10");
    else if (a->is_unspecified() || a->is_loopback() || in("224.0.0.0/4") ||
             in("255.255.255.255/32") || in("ff00::/8"))
      d.fail_last(*v, "is not a unicast address pods can reach (such as 169.254.20.10)");
    else
      cfg.dns_node_local_address = *a;
  }

  cfg.feed_listen = d.listen("feed-listen", Host::kRequired, cfg.feed_listen);
  cfg.feed_tls_cert = d.text("feed-tls-cert", cfg.feed_tls_cert);
  cfg.feed_tls_key = d.text("feed-tls-key", cfg.feed_tls_key);
  cfg.feed_client_ca = d.text("feed-client-ca", cfg.feed_client_ca);
  cfg.feed_subscriber_grace = std::chrono::milliseconds(
      d.integer("feed-subscriber-grace-ms", 0, 600000, cfg.feed_subscriber_grace.count()));
  // The old name of the same setting, which --feed-subscriber-grace-ms replaced: honoured only
  // when the new one is not given.
  if (d.given("feed-stale-after-ms")) {
    const bool grace_given = d.given("feed-subscriber-grace-ms");
    auto old = std::chrono::milliseconds(d.integer("feed-stale-after-ms", 0, 600000, 0));
    if (!grace_given) cfg.feed_subscriber_grace = old;
    cfg.notes.push_back(
        {true, d.last_origin() + " is deprecated, use feed-subscriber-grace-ms: " +
                   (grace_given ? std::string("ignored, as that is given")
                                : "taken as its value, " + std::to_string(old.count()) + " ms")});
  }
  cfg.feed_state_file = d.text("feed-state-file", cfg.feed_state_file);
  cfg.health_listen = d.listen("health-listen", Host::kAny, cfg.health_listen);
  cfg.admin_listen = d.listen("admin-listen", Host::kAny, cfg.admin_listen);
  cfg.admin_token_file = d.text("admin-token-file", cfg.admin_token_file);

  cfg.drain_socket = d.text("drain-socket", cfg.drain_socket);
  cfg.drain_peer_listen = d.listen("drain-peer-listen", Host::kRequired, cfg.drain_peer_listen);
  bool peer_port_given = d.given("drain-peer-port");
  cfg.drain_peer_port = static_cast<uint16_t>(d.integer("drain-peer-port", 1, 65535, 9465));
  if (!peer_port_given && cfg.drain_peer_listen && cfg.drain_peer_listen->port != 0)
    cfg.drain_peer_port = cfg.drain_peer_listen->port;
  cfg.drain_peer_policy = d.choice("drain-peer-policy", kPeerPolicies, cfg.drain_peer_policy);
  cfg.drain_peer_timeout =
      std::chrono::milliseconds(d.integer("drain-peer-timeout-ms", 1, 600000, 5000));
  cfg.drain_release_after =
      d.choice("drain-release-after", kReleaseAfters, cfg.drain_release_after);
  cfg.drain_watermark = d.choice("drain-peer-protocol", kPeerProtocols, cfg.drain_watermark);
  cfg.drain_fan_in = static_cast<size_t>(d.integer("drain-fan-in", 2, 64, 32));
  cfg.drain_liveness = std::chrono::milliseconds(
      d.integer("drain-liveness-ms", 100, 600000, cfg.drain_liveness.count()));
  cfg.drain_peer_ca = d.text("drain-peer-ca", cfg.drain_peer_ca);
  cfg.drain_peer_cert = d.text("drain-peer-cert", cfg.drain_peer_cert);
  cfg.drain_peer_key = d.text("drain-peer-key", cfg.drain_peer_key);
  cfg.drain_peer_insecure = d.boolean("drain-peer-insecure", cfg.drain_peer_insecure);
  cfg.drain_peer_token_file = d.text("drain-peer-token-file", cfg.drain_peer_token_file);
  std::string members_service = d.text("drain-members-service", "");

  cfg.log_format = d.choice("log-format", kLogFormats, cfg.log_format);
  cfg.log_level = d.choice("log-level", kLogLevels, cfg.log_level);

  if (auto st = d.finish(); !st) return Error{st.error()};
  if (cfg.feed_tls_cert.empty() != cfg.feed_tls_key.empty())
    return Error{"--feed-tls-cert and --feed-tls-key go together: give both or neither"};
  if (!cfg.feed_client_ca.empty() && cfg.feed_tls_cert.empty())
    return Error{
        "--feed-client-ca needs --feed-tls-cert and --feed-tls-key (clients are "
        "verified over TLS only)"};
  if (!cfg.source_dir.empty() && !cfg.kubeconfig.empty())
    return Error{"--source-dir and --kubeconfig are exclusive: choose one source of cluster state"};
  if (!members_service.empty()) {
    auto slash = members_service.find('/');
    if (slash == 0 || slash == std::string::npos || slash + 1 == members_service.size() ||
        members_service.find('/', slash + 1) != std::string::npos)
      return Error{"--drain-members-service: \"" + members_service +
                   "\" is not NAMESPACE/NAME (the Service over the endpointd DaemonSet's pods)"};
    cfg.drain_members_service =
        model::ObjectKey{members_service.substr(0, slash), members_service.substr(slash + 1)};
  }
  if (cfg.dns_node_local_address && !cfg.dns_listen)
    return Error{"--dns-node-local-address needs --dns-listen: the DNS server answers on it"};
  if (cfg.dns_node_local_address && cfg.dns_listen->port == 0)
    return Error{
        "--dns-node-local-address needs a fixed --dns-listen port, not 0: it is answered on that "
        "port, which its notrack rules name"};
  return cfg;
}

Result<YAML::Node> read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{"config file " + path + ": cannot be read"};
  try {
    return YAML::Load(in);
  } catch (const YAML::Exception& e) {
    return Error{"config file " + path + ": YAML: line " + std::to_string(e.mark.line + 1) + ": " +
                 e.msg};
  }
}

namespace {
std::optional<std::string> file_content(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text;
}
}  // namespace

ConfigFileWatch::ConfigFileWatch(std::string path)
    : path_(std::move(path)), seen_(file_content(path_)) {}

bool ConfigFileWatch::changed() {
  auto now = file_content(path_);
  if (now == seen_) return false;
  seen_ = std::move(now);
  return true;
}

Result<Config> load_config(const RawFlags& flags) {
  auto it = flags.find("config");
  if (it == flags.end() || it->second.empty() || it->second.back().empty())
    return decode_config(flags, nullptr);
  auto file = read_config_file(it->second.back());
  if (!file) return Error{file.error()};
  return decode_config(flags, &*file);
}

void add_run_flags(CLI::App& app) {
  const Config def;
  add(app, "config", "YAML file with the same keys as the flags, or a KubeProxyConfiguration");
  add(app, "source-dir", "Watch a directory of manifests instead of the Kubernetes API");
  add(app, "kubeconfig",
      "kubeconfig file (default: in-cluster when KUBERNETES_SERVICE_HOST is set)");
  add(app, "node-name", "This node's name (default $NODE_NAME, else the host name)");
  add(app, "dataplane", "Service dataplane to program: " + names_in(kDataplanes),
      std::string(to_string(def.dataplane)));
  add(app, "dns-listen", "IP:PORT for the DNS server (empty: DNS off)");
  add(app, "dns-zone", "Cluster DNS zone", def.dns_zone);
  add(app, "dns-extra-zones",
      "More zones answering the same names, e.g. example.com (CoreDNS's additional zones of "
      "the kubernetes plugin); reverse lookups answer names of --dns-zone");
  add(app, "dns-upstream", "Upstream DNS servers IP[:PORT],... (default: /etc/resolv.conf)");
  add(app, "feed-listen", "ADDR:PORT for the gRPC feed and xDS (empty: off)");
  add(app, "feed-tls-cert", "PEM certificate of the feed server (with --feed-tls-key: TLS)");
  add(app, "feed-tls-key", "PEM private key of --feed-tls-cert");
  add(app, "feed-client-ca",
      "PEM CA bundle: feed subscribers must present a certificate it signed (mutual TLS)");
  add(app, "feed-subscriber-grace-ms",
      "How long a feed subscriber is waited for: one that went away (known by its client name "
      "or xDS node id, its last acknowledged state holds until it comes back and acknowledges "
      "a newer one), one that leaves a response unacknowledged or rejected. Past it, it no "
      "longer holds drains and is a holdout: drains it may still route to are unconfirmed. 0: "
      "a subscriber holds drains only while connected, and then without a bound",
      std::to_string(def.feed_subscriber_grace.count()));
  add(app, "feed-stale-after-ms",
      "Deprecated: the old name of --feed-subscriber-grace-ms, honoured when that is not given");
  add(app, "feed-state-file",
      "File where the feed keeps the names of its subscribers and the EndpointSlice revision "
      "each acknowledged, so that after a restart a subscriber that stayed away holds drains "
      "until it comes back and acknowledges, or --feed-subscriber-grace-ms passes (the chart: "
      "/run/endpointd/feed-subscribers; empty: off)");
  add(app, "health-listen",
      "ADDR:PORT for /healthz, /readyz, /livez only, for probes and load balancers (empty: off)",
      show(def.health_listen));
  add(app, "admin-listen",
      "ADDR:PORT for /metrics and /debug/state (and the probes); keep it on loopback, or set "
      "--admin-token-file when widening it (empty: off)",
      show(def.admin_listen));
  add(app, "admin-token-file",
      "File holding a bearer token that /metrics and /debug/state then require");
  add(app, "drain-socket", "Unix socket that pods' prestop calls reach", def.drain_socket);
  add(app, "drain-peer-listen",
      "ADDR:PORT where peer agents ask this one to confirm removals (empty: off)",
      show(def.drain_peer_listen));
  add(app, "drain-peer-port",
      "Port of the peer agents, at their Node's InternalIP (default: --drain-peer-listen's port)",
      std::to_string(def.drain_peer_port));
  add(app, "drain-peer-policy",
      "At a peer's deadline: proceed (and count it) or wait (until the grace budget)",
      std::string(to_string(def.drain_peer_policy)));
  add(app, "drain-peer-timeout-ms", "Each peer's deadline to confirm a removal",
      std::to_string(def.drain_peer_timeout.count()));
  add(app, "drain-peer-protocol",
      "How peers confirm removals: watermark (one cluster watermark over a tree of agents; "
      "needs an API server's resourceVersions) or per-endpoint (one call per endpoint and peer)",
      "watermark");
  add(app, "drain-fan-in", "Children per agent in the cluster watermark's tree",
      std::to_string(def.drain_fan_in));
  add(app, "drain-liveness-ms",
      "A peer silent this long is excluded from the cluster watermark (counted and logged)",
      std::to_string(def.drain_liveness.count()));
  add(app, "drain-members-service",
      "NAMESPACE/NAME of a Service over the endpointd DaemonSet's pods: where each agent is "
      "reached, and which Nodes ever ran one; the drain's members are every Node less those that "
      "never did (empty: every Node)");
  add(app, "drain-peer-ca",
      "PEM file: the CA that signs every agent's peer certificate (the three files are needed "
      "unless --drain-peer-insecure, or a --source-dir whose Nodes name no other node: then no "
      "peer port)");
  add(app, "drain-peer-cert",
      "PEM file: this agent's peer certificate (names its node; server and client auth)");
  add(app, "drain-peer-key", "PEM file: the peer certificate's private key");
  add(app, "drain-peer-token-file",
      "This agent's projected ServiceAccount token (audience endpointd-peer): peers are then "
      "authenticated by token, verified against the cluster's service-account issuer keys, and "
      "--drain-peer-ca/-cert/-key are one server certificate every agent shares (the chart's "
      "default)");
  app.add_flag("--drain-peer-insecure")
      ->description(
          "Run the peer port in plaintext without authentication (a manifest directory, tests); "
          "logs a warning");
  add(app, "drain-release-after",
      "Default release point (a pod's endpointd.io/release-after annotation wins): "
      "removed or drained",
      std::string(to_string(def.drain_release_after)));
  add(app, "cluster-cidr", "Pod network CIDRs, for local-traffic detection");
  add(app, "detect-local-mode",
      "How pod (local) traffic is told from the rest: " + names_in(kDetectLocalModes) +
          " (NodeCIDR: this Node's spec.podCIDRs)",
      std::string(to_string(def.detect_local_mode)));
  add(app, "pod-bridge-interface",
      "The pods' bridge, for --detect-local-mode BridgeInterface (traffic arriving on it is "
      "local)");
  add(app, "pod-interface-name-prefix",
      "The pods' interface name prefix, for --detect-local-mode InterfaceNamePrefix");
  add(app, "service-cidr",
      "Service CIDRs (the API server's --service-cluster-ip-range): traffic to an address in "
      "them that is no cluster IP is dropped");
  app.add_flag("--masquerade-all")
      ->description(
          "Masquerade all traffic to services, not only traffic from outside the cluster");
  add(app, "nodeport-addresses",
      "CIDRs selecting the node addresses NodePorts are served on, or primary (default: the "
      "node's primary IPs, from its Node object)");
  app.add_flag("--cleanup")
      ->description(
          "Delete endpointd's nftables tables and exit (the agent never does so on its own)");
  add(app, "write-config-to",
      "Write the configuration (these flags and the --config file, a KubeProxyConfiguration "
      "included, with every default) to this file as endpointd's own config file, and exit");
  app.add_flag("--init-only")
      ->description(
          "Write the --conntrack-* settings (they need a writable /proc/sys) and exit: run so "
          "in a privileged init container, and the agent finds them in place");
  add(app, "dns-pod-records",
      "Pod A records a-b-c-d.<ns>.pod.<zone>: disabled, insecure or verified",
      std::string(to_string(def.dns_pod_records)));
  add(app, "dns-loadbalance",
      "Rotate the order of A/AAAA answers with several records, a record further each reply "
      "(CoreDNS's loadbalance)",
      def.dns_loadbalance ? "true" : "false");
  add(app, "dns-endpoint-pod-names",
      "Name a headless endpoint without a hostname by its pod, not its dashed address "
      "(CoreDNS's endpoint_pod_names)",
      def.dns_endpoint_pod_names ? "true" : "false");
  add(app, "dns-lameduck",
      "Seconds DNS keeps answering after SIGTERM before the agent stops, readiness failing "
      "meanwhile (0..300; CoreDNS's health lameduck)",
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(def.dns_lameduck).count()));
  add(app, "dns-ttl", "TTL of cluster records, in seconds (0..3600)",
      std::to_string(def.dns_ttl.count()));
  add(app, "dns-negative-ttl",
      "How long NXDOMAIN and NODATA answers may be cached, in seconds (0..3600; the SOA minimum)",
      std::to_string(def.dns_negative_ttl.count()));
  add(app, "dns-noendpoints",
      "true: no records from endpoints; headless services answer NXDOMAIN (CoreDNS's "
      "noendpoints)",
      def.dns_noendpoints ? "true" : "false");
  add(app, "dns-ignore-empty-service",
      "true: a service with a cluster IP and no ready endpoint answers NXDOMAIN (CoreDNS's "
      "ignore empty_service)",
      def.dns_ignore_empty_service ? "true" : "false");
  add(app, "dns-namespaces",
      "Only these namespaces' names are answered (CoreDNS's namespaces; default: all)");
  add(app, "dns-cache-size", "Entries of the forwarder's cache (0..10000000)",
      std::to_string(def.dns_cache_size));
  add(app, "dns-cache-max-ttl",
      "Longest time a forwarded answer stays cached, in seconds (0..86400; CoreDNS's cache "
      "success TTL); the TTLs the client is given are capped with it",
      std::to_string(def.dns_cache_max_ttl.count()));
  add(app, "dns-cache-denial-max-ttl",
      "Longest time a forwarded NXDOMAIN or NODATA stays cached, in seconds (0..86400; "
      "CoreDNS's cache denial TTL; 0: never cached)",
      std::to_string(def.dns_cache_denial_max_ttl.count()));
  add(app, "dns-forward-allow",
      "Client CIDRs that may use forwarding (default: loopback and private ranges)");
  add(app, "dns-node-local-address",
      "Node-local DNS: also answer on this address (e.g. 169.254.20.10), put on the dummy "
      "interface endpointd-dns, on --dns-listen's port; its queries skip conntrack. Point the "
      "kubelets' clusterDNS at it (empty: off)");
  add(app, "watch-pods", "Watch this node's pods (needed for drains)",
      def.watch_pods ? "true" : "false");
  add(app, "events",
      "Write Kubernetes Events (events.k8s.io/v1) on this node's pods: Propagated, DrainRemoved, "
      "DrainReleased, DrainUnconfirmed (needs create and patch on events; API sources only)",
      def.events ? "true" : "false");
  add(app, "watch-timeout", "Seconds a watch request stays open before it is renewed (10..3600)",
      std::to_string(def.watch_timeout.count()));
  add(app, "watch-stall-timeout",
      "Seconds without a byte on a watch before it is re-established (0: off; else 10..3600)",
      std::to_string(def.watch_stall_timeout.count()));
  add(app, "conntrack-max-per-core",
      "Set nf_conntrack_max to this times the CPUs (at least --conntrack-min), as kube-proxy "
      "does (default: leave the node's)");
  add(app, "conntrack-min", "The least nf_conntrack_max --conntrack-max-per-core sets");
  add(app, "conntrack-tcp-timeout-established",
      "Set nf_conntrack_tcp_timeout_established (e.g. 24h0m0s; default: leave the node's)");
  add(app, "conntrack-tcp-timeout-close-wait",
      "Set nf_conntrack_tcp_timeout_close_wait (e.g. 1h0m0s; default: leave the node's)");
  app.add_flag("--conntrack-tcp-be-liberal")
      ->description(
          "Set nf_conntrack_tcp_be_liberal=1 (out-of-window TCP packets are not marked invalid)");
  add(app, "conntrack-udp-timeout", "Set nf_conntrack_udp_timeout (default: leave the node's)");
  add(app, "conntrack-udp-timeout-stream",
      "Set nf_conntrack_udp_timeout_stream (default: leave the node's)");
  add(app, "livez-timeout",
      "Seconds an update may wait unapplied (update loop, a sink, the kernel) before /livez "
      "fails (1..3600)",
      std::to_string(def.livez_timeout.count()));
  add(app, "list-page-size", "Objects per list page (1..10000)",
      std::to_string(def.list_page_size));
  add(app, "api-list-mode",
      "How each kind's state is got at start and after an expired watch: auto (WatchList where "
      "the API server offers it, else consistent lists), list (consistent lists; relists not "
      "older than the last version seen), cache (the first list at resourceVersion=0, from the "
      "watch cache, as client-go's informers: cheapest before Kubernetes 1.31, but after a "
      "restart the state may be older than the one the agent had)",
      std::string(name_in(kListModes, def.api_list_mode)));
  add(app, "kube-api-content-type",
      "What EndpointSlice lists are asked for in: " + names_in(kContentTypes) +
          " (watches and other lists are JSON)",
      std::string(name_in(kContentTypes, def.kube_api_protobuf)));
  add(app, "log-format", "text or json", std::string(to_string(def.log_format)));
  add(app, "log-level", "trace, debug, info, warn, error", std::string(to_string(def.log_level)));
  // A list flag may be given several times; each value may hold several, comma-separated.
  for (const char* list : {"cluster-cidr", "service-cidr", "nodeport-addresses", "dns-upstream",
                           "dns-forward-allow", "dns-namespaces"})
    app.get_option(std::string("--") + list)
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void add_render_flags(CLI::App& app) {
  add(app, "source-dir", "Directory of manifests")->required();
  add(app, "node-name", "The node to render for");
  add(app, "cluster-cidr", "Pod network CIDRs")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add(app, "nodeport-addresses", "CIDRs selecting NodePort addresses")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--masquerade-all")->description("Masquerade all service traffic");
  add(app, "detect-local-mode",
      "How pod traffic is told from the rest: " + names_in(kDetectLocalModes));
  add(app, "pod-bridge-interface", "The pods' bridge (BridgeInterface)");
  add(app, "pod-interface-name-prefix", "The pods' interface name prefix (InterfaceNamePrefix)");
  add(app, "service-cidr", "Service CIDRs: unallocated cluster IPs in them are dropped")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

RawFlags raw_flags(const CLI::App& app) {
  RawFlags out;
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() == 0 || o->get_lnames().empty()) continue;
    const std::string& name = o->get_lnames().front();
    if (name == "help") continue;
    out[name] = o->results();
  }
  return out;
}

Result<WrittenConfig> write_config(const CLI::App& app, const RawFlags& flags) {
  std::optional<YAML::Node> root;
  if (auto it = flags.find("config");
      it != flags.end() && !it->second.empty() && !it->second.back().empty()) {
    auto r = read_config_file(it->second.back());
    if (!r) return Error{r.error()};
    root = std::move(*r);
  }
  // The same checks as `run`: nothing is written that `run` would refuse.
  auto cfg = decode_config(flags, root ? &*root : nullptr);
  if (!cfg) return Error{cfg.error()};
  std::vector<ConfigNote> notes;
  auto file = file_settings(root ? &*root : nullptr, notes);
  if (!file) return Error{file.error()};
  // What the file cannot hold: the file itself and the one-shot actions.
  static const std::set<std::string> kNotSettings = {"help", "config", "write-config-to", "cleanup",
                                                     "init-only"};
  // Settings renamed, old name → new: the file gets the new name with the value the old one
  // gave when only the old one was (so that reading it back means the same).
  static const std::map<std::string, std::string> kRenamed = {
      {"feed-stale-after-ms", "feed-subscriber-grace-ms"}};
  auto given = [&](const std::string& name) -> std::optional<std::vector<std::string>> {
    if (auto f = flags.find(name); f != flags.end()) return f->second;
    if (auto g = file->find(name); g != file->end()) return g->second.values;
    return std::nullopt;
  };
  std::string out = std::string("# endpointd run --config: every setting of endpointd ") +
                    kVersion + ", as given or by default (--write-config-to)\n";
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_lnames().empty()) continue;
    const std::string& name = o->get_lnames().front();
    if (kNotSettings.count(name) || kRenamed.count(name)) continue;
    std::vector<std::string> values;
    std::optional<std::vector<std::string>> old_name;
    for (const auto& [from, to] : kRenamed)
      if (to == name && !old_name) old_name = given(from);
    if (auto v = given(name)) {
      values = *v;
    } else if (old_name) {
      values = *old_name;
    } else if (!o->get_default_str().empty()) {
      values = {o->get_default_str()};
    } else if (o->get_items_expected_max() == 0) {
      values = {"false"};  // a switch not given
    } else {
      out += "# " + name + ": (not set)\n";
      continue;
    }
    // The value as YAML writes it (quoted where a plain scalar would read otherwise).
    YAML::Emitter v;
    if (values.size() == 1) {
      v << values[0];
    } else {
      v << YAML::Flow << YAML::BeginSeq;
      for (const auto& x : values) v << x;
      v << YAML::EndSeq;
    }
    if (!v.good()) return Error{"writing " + name + ": " + v.GetLastError()};
    out += name + ": " + v.c_str() + "\n";
  }
  return WrittenConfig{std::move(out), std::move(cfg->notes)};
}

void resolve_defaults(Config& cfg) {
  if (cfg.node_name.empty()) {
    if (const char* n = std::getenv("NODE_NAME"); n && *n) {
      cfg.node_name = n;
    } else {
      char host[256] = {};
      if (gethostname(host, sizeof host - 1) == 0) cfg.node_name = host;
    }
  }
}

}  // namespace endpointd::daemon
