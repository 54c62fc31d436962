// The table of `endpointd run`'s options (daemon/options.h), the closed sets' names, and
// README's option list made from them.
#include "daemon/options.h"

#include <algorithm>
#include <cctype>

#include "dns/message.h"
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
constexpr Named<drain::ReleaseAfter> kReleaseAfters[] = {{"removed", drain::ReleaseAfter::kRemoved},
                                                         {"drained", drain::ReleaseAfter::kDrained},
                                                         {"silent", drain::ReleaseAfter::kSilent}};
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
std::vector<std::string> names_of(const Named<E> (&table)[N]) {
  std::vector<std::string> out;
  for (const auto& n : table) out.emplace_back(n.name);
  return out;
}

std::string joined(const std::vector<std::string>& names, std::string_view sep) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : std::string(sep)) + n;
  return out;
}

template <typename E, size_t N>
std::string names_in(const Named<E> (&table)[N]) {
  return joined(names_of(table), "|");
}

// A Kubernetes namespace name: an RFC 1123 label.
bool is_dns_label(std::string_view s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

// The builders: one per kind of Config member. Each sets the option's default from Config{}
// and its decode from the member, so that a default is written once, in config.h.
Option base(std::string name, OptionKind kind, std::string value, std::string help) {
  Option o;
  o.file_key = name;
  o.name = std::move(name);
  o.kind = kind;
  o.value = std::move(value);
  o.help = std::move(help);
  return o;
}

Option text(std::string name, std::string value, std::string Config::*m, std::string help) {
  Option o = base(std::move(name), OptionKind::kText, std::move(value), std::move(help));
  o.default_value = Config{}.*m;
  o.decode = [n = o.name, m](Decoder& d, Config& c) { c.*m = d.text(n, c.*m); };
  return o;
}

// true/false given as a value (`--watch-pods false`), or a switch (`--masquerade-all`).
Option boolean(std::string name, bool Config::*m, std::string help) {
  Option o = base(std::move(name), OptionKind::kBool, "BOOL", std::move(help));
  o.default_value = Config{}.*m ? "true" : "false";
  o.decode = [n = o.name, m](Decoder& d, Config& c) { c.*m = d.boolean(n, c.*m); };
  return o;
}
Option switch_(std::string name, bool Config::*m, std::string help) {
  Option o = boolean(std::move(name), m, std::move(help));
  o.kind = OptionKind::kSwitch;
  o.value.clear();
  o.default_value.clear();  // CLI11 shows none for a switch; --write-config-to writes false
  return o;
}

int64_t as_int(std::chrono::seconds v) {
  return v.count();
}
int64_t as_int(std::chrono::milliseconds v) {
  return v.count();
}
int64_t as_int(size_t v) {
  return static_cast<int64_t>(v);
}
int64_t as_int(uint16_t v) {
  return v;
}
template <typename T>
T from_int(int64_t n) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(n);
  else
    return T(n);
}

template <typename T>
Option integer(std::string name, std::string value, T Config::*m, int64_t lo, int64_t hi,
               std::string help) {
  Option o = base(std::move(name), OptionKind::kInteger, std::move(value), std::move(help));
  o.lo = lo;
  o.hi = hi;
  o.default_value = std::to_string(as_int(Config{}.*m));
  o.decode = [n = o.name, m, lo, hi](Decoder& d, Config& c) {
    c.*m = from_int<T>(d.integer(n, lo, hi, as_int(c.*m)));
  };
  return o;
}

template <typename E, size_t N>
Option choice(std::string name, E Config::*m, const Named<E> (&table)[N], std::string help) {
  Option o = base(std::move(name), OptionKind::kChoice, "", std::move(help));
  o.choices = names_of(table);  // the values column lists them
  o.default_value = std::string(name_in(table, Config{}.*m));
  o.decode = [n = o.name, m, &table](Decoder& d, Config& c) {
    if (auto i = d.choice(n, names_of(table))) c.*m = table[*i].value;
  };
  return o;
}

Option listen(std::string name, std::string value, std::optional<model::HostPort> Config::*m,
              Decoder::Host host, std::string help) {
  Option o = base(std::move(name), OptionKind::kListen, std::move(value), std::move(help));
  const Config def;
  o.default_value = def.*m ? (def.*m)->str() : std::string();
  o.decode = [n = o.name, m, host](Decoder& d, Config& c) { c.*m = d.listen(n, host, c.*m); };
  return o;
}

Option cidrs(std::string name, std::string value, std::vector<model::IpPrefix> Config::*m,
             std::string help, bool primary_ok = false) {
  Option o = base(std::move(name), OptionKind::kList, std::move(value), std::move(help));
  o.decode = [n = o.name, m, primary_ok](Decoder& d, Config& c) { c.*m = d.cidrs(n, primary_ok); };
  return o;
}

// An option whose decoding is its own: `decode` reads and checks it.
Option custom(std::string name, OptionKind kind, std::string value, std::string help,
              std::function<void(Decoder&, Config&)> decode) {
  Option o = base(std::move(name), kind, std::move(value), std::move(help));
  o.decode = std::move(decode);
  return o;
}

// The KubeProxyConfiguration key(s) an option is converted from; `plain`: a scalar taken as it
// is (daemon/kubeproxy_config.cc reads it from here).
Option kube_proxy(Option o, std::string key, bool plain = true) {
  o.kube_proxy = std::move(key);
  o.kube_proxy_plain = plain;
  return o;
}

Option details(Option o, std::string text) {
  o.details = std::move(text);
  return o;
}

// A network interface name, for --pod-bridge-interface and --pod-interface-name-prefix.
std::function<void(Decoder&, Config&)> interface(std::string name, std::string Config::*m) {
  return [name, m](Decoder& d, Config& c) {
    auto v = d.one(name);
    if (!v) return;
    bool bad = v->empty() || v->size() > 15 || *v == "." || *v == "..";
    for (char ch : *v)
      bad |= ch == '/' || ch == ':' || ch == '*' || std::isspace(static_cast<unsigned char>(ch));
    if (bad)
      d.fail_last(*v,
                  "is not a network interface name (1 to 15 characters, none of / : * or "
                  "spaces)");
    c.*m = *v;
  };
}

// kube-proxy's --conntrack-* counts and durations: set only when given.
std::function<void(Decoder&, Config&)> conntrack_count(
    std::string name, std::optional<uint32_t> proxy::ConntrackSysctls::*m) {
  return [name, m](Decoder& d, Config& c) {
    if (d.given(name)) c.conntrack.*m = static_cast<uint32_t>(d.integer(name, 0, 1 << 30, 0));
  };
}
std::function<void(Decoder&, Config&)> conntrack_duration(
    std::string name, std::optional<std::chrono::seconds> proxy::ConntrackSysctls::*m) {
  return [name, m](Decoder& d, Config& c) {
    auto v = d.one(name);
    if (!v) return;
    auto t = model::parse_go_duration(*v);
    if (!t || t->count() > 30 * 86400)
      d.fail_last(*v, "is not a duration of at most 720h (e.g. 24h0m0s, 1h, 300s, or seconds)");
    else
      c.conntrack.*m = *t;
  };
}

void decode_dns_extra_zones(Decoder& d, Config& cfg) {
  auto l = d.list("dns-extra-zones");
  if (!l) return;
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

// Any unicast address pods can route to the node. 169.254.0.0/16 is the one to use for IPv4
// (never routed off a node, so it shadows no real host); others are accepted for IPv6, whose
// link-local addresses pods cannot reach, and for clusters where that range is taken.
void decode_dns_node_local_address(Decoder& d, Config& cfg) {
  auto v = d.one("dns-node-local-address");
  if (!v || v->empty()) return;
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

std::vector<Option> make_run_options() {
  using Host = Decoder::Host;
  const Config def;
  std::vector<Option> o;
  {
    Option config = base("config", OptionKind::kText, "FILE",
                         "YAML file with the same keys as the flags, or a KubeProxyConfiguration");
    config.file_key.clear();  // read by load_config, before decoding
    config.written = false;
    config.decode = [](Decoder&, Config&) {};
    o.push_back(std::move(config));
  }
  o.push_back(
      details(text("source-dir", "DIR", &Config::source_dir,
                   "Watch a directory of manifests instead of the Kubernetes API"),
              "Its files are `*.yaml`, `*.yml` and `*.json`, multi-document YAML and `kind: "
              "List` included."));
  o.push_back(
      kube_proxy(text("kubeconfig", "PATH", &Config::kubeconfig,
                      "kubeconfig file (default: in-cluster when KUBERNETES_SERVICE_HOST is set)"),
                 "clientConnection.kubeconfig"));
  o.back().default_note = "in-cluster when `KUBERNETES_SERVICE_HOST` is set";
  o.push_back(kube_proxy(text("node-name", "NAME", &Config::node_name,
                              "This node's name (default $NODE_NAME, else the host name)"),
                         "hostnameOverride"));
  o.back().default_note = "`$NODE_NAME`, else the host name";
  o.push_back(choice("dataplane", &Config::dataplane, kDataplanes,
                     "Service dataplane to program: " + names_in(kDataplanes)));
  o.push_back(listen("dns-listen", "IP:PORT", &Config::dns_listen, Host::kIp,
                     "IP:PORT for the DNS server (empty: DNS off)"));
  o.push_back(
      custom("dns-zone", OptionKind::kText, "NAME", "Cluster DNS zone", [](Decoder& d, Config& c) {
        auto zone = d.one("dns-zone");
        if (!zone) return;
        if (zone->empty() || !dns::name_from_text(*zone)) d.fail_last(*zone, "is not a DNS name");
        c.dns_zone = *zone;
      }));
  o.back().default_value = def.dns_zone;
  o.push_back(custom("dns-extra-zones", OptionKind::kList, "ZONE,...",
                     "More zones answering the same names, e.g. example.com (CoreDNS's additional "
                     "zones of the kubernetes plugin); reverse lookups answer names of --dns-zone",
                     decode_dns_extra_zones));
  o.push_back(custom("dns-upstream", OptionKind::kList, "IP[:PORT],...",
                     "Upstream DNS servers IP[:PORT],... (default: /etc/resolv.conf)",
                     [](Decoder& d, Config& c) { c.dns_upstream = d.upstreams("dns-upstream"); }));
  o.back().default_note = "`/etc/resolv.conf`";
  o.push_back(listen("feed-listen", "ADDR:PORT", &Config::feed_listen, Host::kRequired,
                     "ADDR:PORT for the gRPC feed and xDS (empty: off)"));
  o.push_back(text("feed-tls-cert", "FILE", &Config::feed_tls_cert,
                   "PEM certificate of the feed server (with --feed-tls-key: TLS)"));
  o.push_back(
      text("feed-tls-key", "FILE", &Config::feed_tls_key, "PEM private key of --feed-tls-cert"));
  o.push_back(
      text("feed-client-ca", "FILE", &Config::feed_client_ca,
           "PEM CA bundle: feed subscribers must present a certificate it signed (mutual TLS)"));
  o.push_back(integer(
      "feed-subscriber-grace-ms", "MS", &Config::feed_subscriber_grace, 0, 600000,
      "How long a feed subscriber is waited for: one that went away (known by its client name "
      "or xDS node id, its last acknowledged state holds until it comes back and acknowledges "
      "a newer one), one that leaves a response unacknowledged or rejected. Past it, it no "
      "longer holds drains and is a holdout: drains it may still route to are unconfirmed. 0: "
      "a subscriber holds drains only while connected, and then without a bound"));
  o.push_back(custom(
      "feed-stale-after-ms", OptionKind::kInteger, "MS",
      "Deprecated: the old name of --feed-subscriber-grace-ms, honoured when that is not given",
      // Honoured only when the new name is not given; it says so either way.
      [](Decoder& d, Config& c) {
        if (!d.given("feed-stale-after-ms")) return;
        const bool grace_given = d.given("feed-subscriber-grace-ms");
        auto old = std::chrono::milliseconds(d.integer("feed-stale-after-ms", 0, 600000, 0));
        if (!grace_given) c.feed_subscriber_grace = old;
        c.notes.push_back(
            {true,
             d.last_origin() + " is deprecated, use feed-subscriber-grace-ms: " +
                 (grace_given ? std::string("ignored, as that is given")
                              : "taken as its value, " + std::to_string(old.count()) + " ms")});
      }));
  o.back().lo = 0;
  o.back().hi = 600000;
  o.back().written = false;  // --write-config-to writes feed-subscriber-grace-ms
  o.push_back(details(
      text("feed-state-file", "PATH", &Config::feed_state_file,
           "File where the feed keeps the names of its subscribers and the EndpointSlice "
           "revision each acknowledged, so that after a restart a subscriber that stayed away "
           "holds drains until it comes back and acknowledges, or --feed-subscriber-grace-ms "
           "passes (the chart: /run/endpointd/feed-subscribers; empty: off)"),
      "At most 1,024 subscribers, rewritten atomically at most 4 times a second and on stop; "
      "one past the grace is a holdout taken as routing to every endpoint terminating since "
      "its revision. A file that is unreadable, over 1 MiB or malformed is logged, counted and "
      "ignored."));
  o.push_back(kube_proxy(
      listen("health-listen", "ADDR:PORT", &Config::health_listen, Host::kAny,
             "ADDR:PORT for /healthz, /readyz, /livez only, for probes and load balancers "
             "(empty: off)"),
      "healthzBindAddress", false));
  o.push_back(kube_proxy(
      listen("admin-listen", "ADDR:PORT", &Config::admin_listen, Host::kAny,
             "ADDR:PORT for /metrics and /debug/state (and the probes); keep it on loopback, or "
             "set --admin-token-file when widening it (empty: off)"),
      "metricsBindAddress", false));
  o.push_back(text("admin-token-file", "PATH", &Config::admin_token_file,
                   "File holding a bearer token that /metrics and /debug/state then require"));
  o.push_back(text("drain-socket", "PATH", &Config::drain_socket,
                   "Unix socket that pods' prestop calls reach"));
  o.push_back(listen("drain-peer-listen", "ADDR:PORT", &Config::drain_peer_listen, Host::kRequired,
                     "ADDR:PORT where peer agents ask this one to confirm removals (empty: off)"));
  // Its default follows --drain-peer-listen's port: decode_config sets it when not given.
  o.push_back(integer(
      "drain-peer-port", "PORT", &Config::drain_peer_port, 1, 65535,
      "Port of the peer agents, at their Node's InternalIP (default: --drain-peer-listen's port)"));
  o.back().default_note = "`--drain-peer-listen`'s port, else 9465";
  o.back().derived = [](const Config& c) { return std::to_string(c.drain_peer_port); };
  o.push_back(choice("drain-peer-policy", &Config::drain_peer_policy, kPeerPolicies,
                     "At a peer's deadline: proceed (and count it) or wait (until the grace "
                     "budget)"));
  o.back().details =
      "A member not confirmed by its peer deadline is unknown (its agent absent, excluded, "
      "departed, or behind): `proceed` releases the pod then, **unconfirmed**, naming it.";
  o.push_back(integer("drain-peer-timeout-ms", "MS", &Config::drain_peer_timeout, 1, 600000,
                      "Each peer's deadline to confirm a removal"));
  o.push_back(
      choice("drain-peer-protocol", &Config::drain_watermark, kPeerProtocols,
             "How peers confirm removals: watermark (one cluster watermark over a tree of agents; "
             "needs an API server's resourceVersions) or per-endpoint (one call per endpoint and "
             "peer)"));
  o.push_back(integer("drain-fan-in", "K", &Config::drain_fan_in, 2, 64,
                      "Children per agent in the cluster watermark's tree"));
  o.push_back(integer("drain-liveness-ms", "MS", &Config::drain_liveness, 100, 600000,
                      "A peer silent this long is excluded from the cluster watermark (counted and "
                      "logged)"));
  o.push_back(custom(
      "drain-members-service", OptionKind::kText, "NAMESPACE/NAME",
      "NAMESPACE/NAME of a Service over the endpointd DaemonSet's pods: where each agent is "
      "reached, and which Nodes ever ran one; the drain's members are every Node less those that "
      "never did (empty: every Node)",
      [](Decoder& d, Config& c) {
        auto v = d.one("drain-members-service");
        if (!v || v->empty()) return;
        auto slash = v->find('/');
        if (slash == 0 || slash == std::string::npos || slash + 1 == v->size() ||
            v->find('/', slash + 1) != std::string::npos)
          d.fail_last(*v,
                      "is not NAMESPACE/NAME (the Service over the endpointd DaemonSet's pods)");
        else
          c.drain_members_service = model::ObjectKey{v->substr(0, slash), v->substr(slash + 1)};
      }));
  o.back().default_note = "every Node";
  o.back().details =
      "A headless Service over the DaemonSet's hostNetwork pods (the chart's default); see "
      "*Who confirms a removal*.";
  o.push_back(details(
      text("drain-state-file", "PATH", &Config::drain_state_file,
           "File where the node keeps, across this agent's restarts, the nodes it saw running "
           "an agent (with --drain-members-service) and the DNS TTLs its answers may still be "
           "cached under (the chart: /var/lib/endpointd/drain-state; empty: off)"),
      "Without it a restarted agent forgets a node whose agent is out of the Service at that "
      "moment (a rollout, a crash loop) and would not wait for it, and a TTL lowered across the "
      "restart would not wait out the answers the last process gave. Rewritten atomically when "
      "either changes; a file that is unreadable, over 4 MiB or malformed is logged and the "
      "agent starts without it."));
  o.push_back(text("drain-peer-ca", "FILE", &Config::drain_peer_ca,
                   "PEM file: the CA that signs every agent's peer certificate (the three files "
                   "are needed unless --drain-peer-insecure, or a --source-dir whose Nodes name "
                   "no other node: then no peer port)"));
  o.push_back(
      details(text("drain-peer-cert", "FILE", &Config::drain_peer_cert,
                   "PEM file: this agent's peer certificate (names its node; server and client "
                   "auth)"),
              "CN and DNS SAN = the node name; `scripts/peer-certs` makes them."));
  o.push_back(text("drain-peer-key", "FILE", &Config::drain_peer_key,
                   "PEM file: the peer certificate's private key"));
  o.push_back(details(
      text("drain-peer-token-file", "FILE", &Config::drain_peer_token_file,
           "This agent's projected ServiceAccount token (audience endpointd-peer): peers are "
           "then authenticated by token, verified against the cluster's service-account issuer "
           "keys, and --drain-peer-ca/-cert/-key are one server certificate every agent shares "
           "(the chart's default)"),
      "Re-read when the kubelet rotates it, sent on every peer call (see *Peer identity*)."));
  o.push_back(details(
      switch_("drain-peer-insecure", &Config::drain_peer_insecure,
              "Run the peer port in plaintext without authentication (a manifest directory, "
              "tests); logs a warning"),
      "`/readyz`'s text says so and `endpointd_drain_peer_insecure` is 1; agents with identity "
      "never take its reports."));
  o.push_back(details(choice("drain-release-after", &Config::drain_release_after, kReleaseAfters,
                             "Default release point (a pod's endpointd.io/release-after "
                             "annotation wins): removed, drained or silent"),
                      "A pod with a drain action releases after the drain. `silent`: after the "
                      "removal, once no new connection has reached the pod for "
                      "`--drain-quiet-ms` (observed on its node; see *Who still sends after the "
                      "removal*), or at its budget's end."));
  o.push_back(integer("drain-quiet-ms", "MS", &Config::drain_quiet, 1, 600000,
                      "Under release-after silent: how long no new connection must reach a "
                      "removed pod before it is released"));
  o.push_back(kube_proxy(details(cidrs("cluster-cidr", "CIDR,...", &Config::cluster_cidr,
                                       "Pod network CIDRs, for local-traffic detection"),
                                 "Traffic from elsewhere to a ClusterIP is masqueraded."),
                         "clusterCIDR", false));
  o.push_back(custom("detect-local-mode", OptionKind::kChoice, "",
                     "How pod (local) traffic is told from the rest: " +
                         names_in(kDetectLocalModes) + " (NodeCIDR: this Node's spec.podCIDRs)",
                     // kube-proxy's; an empty value is its default, ClusterCIDR.
                     [](Decoder& d, Config& c) {
                       auto mode = d.one("detect-local-mode");
                       if (!mode || mode->empty()) return;
                       if (auto m = parse_detect_local_mode(*mode))
                         c.detect_local_mode = *m;
                       else
                         d.fail_last(*mode, "is not one of " + names_in(kDetectLocalModes));
                     }));
  o.back().choices = names_of(kDetectLocalModes);
  o.back().default_value = std::string(to_string(def.detect_local_mode));
  o.back() = kube_proxy(std::move(o.back()), "detectLocalMode");
  o.push_back(kube_proxy(
      custom("pod-bridge-interface", OptionKind::kText, "NAME",
             "The pods' bridge, for --detect-local-mode BridgeInterface (traffic arriving on it "
             "is local)",
             interface("pod-bridge-interface", &Config::pod_bridge_interface)),
      "detectLocal.bridgeInterface"));
  o.push_back(kube_proxy(
      custom("pod-interface-name-prefix", OptionKind::kText, "PREFIX",
             "The pods' interface name prefix, for --detect-local-mode InterfaceNamePrefix",
             interface("pod-interface-name-prefix", &Config::pod_interface_name_prefix)),
      "detectLocal.interfaceNamePrefix"));
  o.push_back(cidrs("service-cidr", "CIDR,...", &Config::service_cidr,
                    "Service CIDRs (the API server's --service-cluster-ip-range): traffic to an "
                    "address in them that is no cluster IP is dropped"));
  o.push_back(kube_proxy(
      switch_("masquerade-all", &Config::masquerade_all,
              "Masquerade all traffic to services, not only traffic from outside the cluster"),
      "nftables.masqueradeAll, iptables.masqueradeAll", false));
  o.push_back(kube_proxy(
      details(cidrs("nodeport-addresses", "CIDR,...|primary", &Config::nodeport_addresses,
                    "CIDRs selecting the node addresses NodePorts are served on, or primary "
                    "(default: the node's primary IPs, from its Node object)",
                    true),
              "With CIDRs, the host's addresses in them, followed as the host's addresses change "
              "(never loopback)."),
      "nodePortAddresses", false));
  o.back().default_note = "`primary`";
  o.push_back(details(
      switch_("cleanup", &Config::cleanup,
              "Delete endpointd's nftables tables and exit (the agent never does so on its own)"),
      "The tables are `ip endpointd` and `ip6 endpointd`."));
  o.back().written = false;
  o.push_back(custom("write-config-to", OptionKind::kText, "FILE",
                     "Write the configuration (these flags and the --config file, a "
                     "KubeProxyConfiguration included, with every default) to this file as "
                     "endpointd's own config file, and exit",
                     // Acted on before decoding: write_config().
                     [](Decoder& d, Config&) { d.take("write-config-to"); }));
  o.back().written = false;
  o.push_back(switch_("init-only", &Config::init_only,
                      "Write the --conntrack-* settings (they need a writable /proc/sys) and "
                      "exit: run so in a privileged init container, and the agent finds them in "
                      "place"));
  o.back().written = false;
  o.push_back(choice("dns-pod-records", &Config::dns_pod_records, kPodRecords,
                     "Pod A records a-b-c-d.<ns>.pod.<zone>: disabled, insecure or verified"));
  o.push_back(boolean("dns-loadbalance", &Config::dns_loadbalance,
                      "Rotate the order of A/AAAA answers with several records, a record further "
                      "each reply (CoreDNS's loadbalance)"));
  o.back().details =
      "kubeadm's Corefile enables it; each server worker rotates in turn, where CoreDNS "
      "shuffles at random.";
  o.push_back(boolean("dns-endpoint-pod-names", &Config::dns_endpoint_pod_names,
                      "Name a headless endpoint without a hostname by its pod, not its dashed "
                      "address (CoreDNS's endpoint_pod_names)"));
  o.back().details =
      "The name is `<pod>.<service>.<ns>.svc.<zone>`; its dashed address when it targets no pod "
      "or the pod's name is no DNS label.";
  o.push_back(
      custom("dns-lameduck", OptionKind::kInteger, "SECONDS",
             "Seconds DNS keeps answering after SIGTERM before the agent stops, readiness failing "
             "meanwhile (0..300; CoreDNS's health lameduck)",
             [](Decoder& d, Config& c) {
               auto s = std::chrono::duration_cast<std::chrono::seconds>(c.dns_lameduck);
               c.dns_lameduck = std::chrono::seconds(d.integer("dns-lameduck", 0, 300, s.count()));
             }));
  o.back().lo = 0;
  o.back().hi = 300;
  o.back().default_value =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(def.dns_lameduck).count());
  o.back().details = "A second signal stops at once.";
  o.push_back(integer("dns-ttl", "SECONDS", &Config::dns_ttl, 0, 3600,
                      "TTL of cluster records, in seconds (0..3600)"));
  o.push_back(integer(
      "dns-negative-ttl", "SECONDS", &Config::dns_negative_ttl, 0, 3600,
      "How long NXDOMAIN and NODATA answers may be cached, in seconds (0..3600; the SOA minimum)"));
  o.push_back(boolean("dns-noendpoints", &Config::dns_noendpoints,
                      "true: no records from endpoints; headless services answer NXDOMAIN "
                      "(CoreDNS's noendpoints)"));
  o.push_back(boolean("dns-ignore-empty-service", &Config::dns_ignore_empty_service,
                      "true: a service with a cluster IP and no ready endpoint answers NXDOMAIN "
                      "(CoreDNS's ignore empty_service)"));
  o.push_back(
      custom("dns-namespaces", OptionKind::kList, "NAMESPACE,...",
             "Only these namespaces' names are answered (CoreDNS's namespaces; default: all)",
             [](Decoder& d, Config& c) {
               auto l = d.list("dns-namespaces");
               if (!l) return;
               for (const auto& ns : l->second) {
                 if (!is_dns_label(ns)) {
                   d.fail(l->first, ns,
                          "is not a namespace name (a DNS label: a-z, 0-9, '-', at most 63)");
                   break;
                 }
                 c.dns_namespaces.push_back(ns);
               }
             }));
  o.back().default_note = "every namespace";
  o.push_back(integer("dns-cache-size", "N", &Config::dns_cache_size, 0, 10'000'000,
                      "Entries of the forwarder's cache (0..10000000)"));
  o.push_back(integer("dns-cache-max-ttl", "SECONDS", &Config::dns_cache_max_ttl, 0, 86400,
                      "Longest time a forwarded answer stays cached, in seconds (0..86400; "
                      "CoreDNS's cache success TTL); the TTLs the client is given are capped "
                      "with it"));
  o.push_back(integer("dns-cache-denial-max-ttl", "SECONDS", &Config::dns_cache_denial_max_ttl, 0,
                      86400,
                      "Longest time a forwarded NXDOMAIN or NODATA stays cached, in seconds "
                      "(0..86400; CoreDNS's cache denial TTL; 0: never cached)"));
  o.push_back(
      details(cidrs("dns-forward-allow", "CIDR,...", &Config::dns_forward_allow,
                    "Client CIDRs that may use forwarding (default: loopback and private ranges)"),
              "Never an open resolver."));
  o.back().default_note = "loopback and private ranges";
  o.push_back(custom("dns-node-local-address", OptionKind::kText, "IP",
                     "Node-local DNS: also answer on this address (e.g. 169.254.20.10), put on "
                     "the dummy interface endpointd-dns, on --dns-listen's port; its queries skip "
                     "conntrack. Point the kubelets' clusterDNS at it (empty: off)",
                     decode_dns_node_local_address));
  o.push_back(
      boolean("watch-pods", &Config::watch_pods, "Watch this node's pods (needed for drains)"));
  o.push_back(boolean("events", &Config::events,
                      "Write Kubernetes Events (events.k8s.io/v1) on this node's pods: "
                      "Propagated, DrainRemoved, DrainReleased, DrainUnconfirmed (needs create "
                      "and patch on events; API sources only)"));
  o.back().details = "See *Events on pods*.";
  o.push_back(integer("watch-timeout", "SECONDS", &Config::watch_timeout, 10, 3600,
                      "Seconds a watch request stays open before it is renewed (10..3600)"));
  {
    Option stall = integer(
        "watch-stall-timeout", "SECONDS", &Config::watch_stall_timeout, 0, 3600,
        "Seconds without a byte on a watch before it is re-established (0: off; else 10..3600)");
    stall.decode = [plain = stall.decode](Decoder& d, Config& c) {
      plain(d, c);
      if (c.watch_stall_timeout.count() > 0 && c.watch_stall_timeout.count() < 10)
        d.fail_last(std::to_string(c.watch_stall_timeout.count()),
                    "is below 10 s: quiet watches would be re-established over and over (0 "
                    "turns the check off)");
    };
    o.push_back(std::move(stall));
  }
  o.push_back(kube_proxy(
      custom("conntrack-max-per-core", OptionKind::kInteger, "N",
             "Set nf_conntrack_max to this times the CPUs (at least --conntrack-min), as "
             "kube-proxy does (default: leave the node's)",
             conntrack_count("conntrack-max-per-core", &proxy::ConntrackSysctls::max_per_core)),
      "conntrack.maxPerCore"));
  o.push_back(kube_proxy(custom("conntrack-min", OptionKind::kInteger, "N",
                                "The least nf_conntrack_max --conntrack-max-per-core sets",
                                conntrack_count("conntrack-min", &proxy::ConntrackSysctls::min)),
                         "conntrack.min"));
  o.push_back(kube_proxy(
      custom("conntrack-tcp-timeout-established", OptionKind::kDuration, "DURATION",
             "Set nf_conntrack_tcp_timeout_established (e.g. 24h0m0s; default: leave the node's)",
             conntrack_duration("conntrack-tcp-timeout-established",
                                &proxy::ConntrackSysctls::tcp_established_timeout)),
      "conntrack.tcpEstablishedTimeout"));
  o.push_back(kube_proxy(
      custom("conntrack-tcp-timeout-close-wait", OptionKind::kDuration, "DURATION",
             "Set nf_conntrack_tcp_timeout_close_wait (e.g. 1h0m0s; default: leave the node's)",
             conntrack_duration("conntrack-tcp-timeout-close-wait",
                                &proxy::ConntrackSysctls::tcp_close_wait_timeout)),
      "conntrack.tcpCloseWaitTimeout"));
  o.push_back(kube_proxy(
      custom("conntrack-tcp-be-liberal", OptionKind::kSwitch, "",
             "Set nf_conntrack_tcp_be_liberal=1 (out-of-window TCP packets are not marked "
             "invalid)",
             [](Decoder& d, Config& c) {
               c.conntrack.tcp_be_liberal = d.boolean("conntrack-tcp-be-liberal", false);
             }),
      "conntrack.tcpBeLiberal"));
  o.push_back(kube_proxy(
      custom("conntrack-udp-timeout", OptionKind::kDuration, "DURATION",
             "Set nf_conntrack_udp_timeout (default: leave the node's)",
             conntrack_duration("conntrack-udp-timeout", &proxy::ConntrackSysctls::udp_timeout)),
      "conntrack.udpTimeout"));
  o.push_back(kube_proxy(custom("conntrack-udp-timeout-stream", OptionKind::kDuration, "DURATION",
                                "Set nf_conntrack_udp_timeout_stream (default: leave the node's)",
                                conntrack_duration("conntrack-udp-timeout-stream",
                                                   &proxy::ConntrackSysctls::udp_stream_timeout)),
                         "conntrack.udpStreamTimeout"));
  for (auto& ct : o)
    if (ct.name.rfind("conntrack-", 0) == 0 && ct.kind != OptionKind::kSwitch) {
      ct.default_note = "the node's value stays";
      ct.details =
          "Written at start as kube-proxy writes it; one that cannot be written stops the "
          "start, naming it.";
      if (ct.kind == OptionKind::kInteger) ct.hi = 1 << 30;
    }
  o.push_back(integer("livez-timeout", "SECONDS", &Config::livez_timeout, 1, 3600,
                      "Seconds an update may wait unapplied (update loop, a sink, the kernel) "
                      "before /livez fails (1..3600)"));
  o.push_back(integer("list-page-size", "N", &Config::list_page_size, 1, 10000,
                      "Objects per list page (1..10000)"));
  o.push_back(choice(
      "api-list-mode", &Config::api_list_mode, kListModes,
      "How each kind's state is got at start and after an expired watch: auto (WatchList where "
      "the API server offers it, else consistent lists), list (consistent lists; relists not "
      "older than the last version seen), cache (the first list at resourceVersion=0, from the "
      "watch cache, as client-go's informers: cheapest before Kubernetes 1.31, but after a "
      "restart the state may be older than the one the agent had)"));
  o.push_back(kube_proxy(custom("kube-api-content-type", OptionKind::kChoice, "TYPE",
                                "What EndpointSlice lists are asked for in: " +
                                    names_in(kContentTypes) + " (watches and other lists are JSON)",
                                // A media type, as kube-proxy takes it: without case, parameters
                                // (";charset=utf-8") ignored.
                                [](Decoder& d, Config& c) {
                                  auto v = d.one("kube-api-content-type");
                                  if (!v) return;
                                  if (auto e = value_in(kContentTypes, watcher::media_type(*v)))
                                    c.kube_api_protobuf = *e;
                                  else
                                    d.fail_last(*v, "is not one of " + names_in(kContentTypes));
                                }),
                         "clientConnection.contentType"));
  o.back().details = "kube-proxy's flag and default.";
  o.back().choices = names_of(kContentTypes);
  o.back().default_value = std::string(name_in(kContentTypes, def.kube_api_protobuf));
  o.push_back(kube_proxy(choice("log-format", &Config::log_format, kLogFormats, "text or json"),
                         "logging.format", false));
  o.push_back(
      choice("log-level", &Config::log_level, kLogLevels, "trace, debug, info, warn, error"));
  return o;
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

const std::vector<Option>& run_options() {
  static const std::vector<Option> options = make_run_options();
  return options;
}

const Option* find_run_option(std::string_view name) {
  for (const auto& o : run_options())
    if (o.name == name) return &o;
  return nullptr;
}

}  // namespace endpointd::daemon
