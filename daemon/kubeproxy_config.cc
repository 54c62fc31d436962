// KubeProxyConfiguration → endpointd settings. See kubeproxy_config.h for the mapping.
#include "daemon/kubeproxy_config.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "daemon/options.h"
#include "model/hostport.h"

namespace endpointd::daemon {

namespace {

constexpr const char* kHealthzDefault = "0.0.0.0:10256";
constexpr uint16_t kHealthzPort = 10256;
constexpr const char* kMetricsDefault = "127.0.0.1:10249";
constexpr uint16_t kMetricsPort = 10249;

std::string trim(std::string s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string scalar(const YAML::Node& n) {
  return n && n.IsScalar() ? trim(n.as<std::string>()) : std::string();
}

// n[key] when n is a map; otherwise no node (yaml-cpp throws on indexing a scalar, and a
// file may hold `logging: x` where a section belongs).
YAML::Node child(const YAML::Node& n, const std::string& key) {
  return n && n.IsMap() ? n[key] : YAML::Node();
}

std::string show(const YAML::Node& n) {
  if (!n || n.IsNull()) return "null";
  if (n.IsScalar()) return n.as<std::string>();
  YAML::Emitter e;
  e.SetMapFormat(YAML::Flow);
  e.SetSeqFormat(YAML::Flow);
  e << n;
  return e.c_str();
}

// kubeadm writes every field; empty, zero, false and null all mean "kube-proxy's default".
bool is_zero(const YAML::Node& n) {
  if (!n || n.IsNull()) return true;
  if (n.IsScalar()) {
    static const std::set<std::string> zeros = {"",     "0", "0s",   "false",
                                                "null", "~", "0m0s", "0h0m0s"};
    return zeros.count(trim(n.as<std::string>())) > 0;
  }
  if (n.IsSequence() || n.IsMap()) {
    for (const auto& c : n) {
      if (n.IsMap() ? !is_zero(c.second) : !is_zero(c)) return false;
    }
    return true;
  }
  return false;
}

// Why a key endpointd does not use is ignored, by the key's first segment (or whole path).
std::string reason_for(const std::string& key) {
  static const std::map<std::string, std::string> exact = {
      {"bindAddress",
       "kube-proxy takes it as the node's primary IP; endpointd takes the node's addresses from "
       "its Node object and the host, and its listeners have their own flags"},
      {"bindAddressHardFail", "endpointd's listeners have their own flags"},
      {"configSyncPeriod", "endpointd watches without a periodic resync"},
      {"enableProfiling", "endpointd serves no profiling endpoints"},
      {"showHiddenMetricsForVersion", "endpointd has no hidden metrics"},
      {"oomScoreAdj",
       "the chart's priority class system-node-critical makes the kubelet protect the agent "
       "(oom_score_adj -997)"},
      {"windowsRunAsService", "a Windows setting"},
      {"portRange", "only used by kube-proxy's removed userspace mode"},
      {"featureGates", "endpointd has no kube-proxy feature gates"},
      {"nftables.syncPeriod",
       "endpointd applies each change as it arrives, in one netlink batch; no periodic sync"},
      {"nftables.minSyncPeriod", "endpointd coalesces changes by itself; no minimum sync period"},
      {"nftables.masqueradeBit", "endpointd uses its own packet mark in its own tables"},
  };
  if (auto it = exact.find(key); it != exact.end()) return it->second;
  std::string head = key.substr(0, key.find('.'));
  if (head == "iptables" || head == "ipvs" || head == "winkernel")
    return "a setting of kube-proxy's " + head + " mode; endpointd programs nftables";
  if (key == "clientConnection.acceptContentTypes")
    return "endpointd offers protobuf then JSON for EndpointSlice lists, JSON for the rest, as "
           "clientConnection.contentType (--kube-api-content-type) says";
  if (head == "clientConnection") return "endpointd's API client has no client-side rate limit";
  if (head == "logging") return "use --log-level for endpointd's verbosity";
  return "not used by endpointd";
}

// Every field of KubeProxyConfiguration v1alpha1 (Kubernetes 1.31-1.34), as dotted paths; a
// map field's own name too, for when it is written empty. featureGates and logging.options
// hold free-form keys.
bool known_key(const std::string& key) {
  static const std::set<std::string> fields = {
      "apiVersion", "kind", "featureGates", "bindAddress", "healthzBindAddress",
      "metricsBindAddress", "bindAddressHardFail", "enableProfiling", "showHiddenMetricsForVersion",
      "mode", "detectLocalMode", "clusterCIDR", "nodePortAddresses", "oomScoreAdj",
      "configSyncPeriod", "portRange", "hostnameOverride", "windowsRunAsService",
      // clientConnection
      "clientConnection", "clientConnection.kubeconfig", "clientConnection.acceptContentTypes",
      "clientConnection.contentType", "clientConnection.qps", "clientConnection.burst",
      // modes
      "iptables", "iptables.masqueradeAll", "iptables.masqueradeBit", "iptables.localhostNodePorts",
      "iptables.syncPeriod", "iptables.minSyncPeriod", "ipvs", "ipvs.syncPeriod",
      "ipvs.minSyncPeriod", "ipvs.scheduler", "ipvs.excludeCIDRs", "ipvs.strictARP",
      "ipvs.tcpTimeout", "ipvs.tcpFinTimeout", "ipvs.udpTimeout", "nftables",
      "nftables.masqueradeAll", "nftables.masqueradeBit", "nftables.syncPeriod",
      "nftables.minSyncPeriod", "winkernel", "winkernel.networkName", "winkernel.sourceVip",
      "winkernel.enableDSR", "winkernel.rootHnsEndpointName", "winkernel.forwardHealthCheckVip",
      // detect-local
      "detectLocal", "detectLocal.bridgeInterface", "detectLocal.interfaceNamePrefix",
      // conntrack
      "conntrack", "conntrack.maxPerCore", "conntrack.min", "conntrack.tcpEstablishedTimeout",
      "conntrack.tcpCloseWaitTimeout", "conntrack.tcpBeLiberal", "conntrack.udpTimeout",
      "conntrack.udpStreamTimeout",
      // logging
      "logging", "logging.format", "logging.flushFrequency", "logging.verbosity", "logging.vmodule",
      "logging.options"};
  if (fields.count(key)) return true;
  return key.rfind("featureGates.", 0) == 0 || key.rfind("logging.options.", 0) == 0;
}

void leaves(const YAML::Node& n, const std::string& prefix,
            std::vector<std::pair<std::string, YAML::Node>>& out) {
  if (n.IsMap() && n.size() > 0) {
    for (const auto& kv : n) {
      std::string k = kv.first.IsScalar() ? kv.first.as<std::string>() : show(kv.first);
      leaves(kv.second, prefix.empty() ? k : prefix + "." + k, out);
    }
    return;
  }
  out.emplace_back(prefix, n);
}

// healthzBindAddress / metricsBindAddress: "IP:PORT", "IP" (kube-proxy's port then), or ""
// (kube-proxy's default).
Result<model::HostPort> bind_address(const std::string& key, const std::string& v, const char* def,
                                     uint16_t port) {
  auto hp = model::parse_host_port(v.empty() ? def : v, port);
  if (!hp) return Error{std::string(kKubeProxyKind) + " key " + key + ": " + hp.error()};
  return hp;
}

}  // namespace

const KubeProxySetting* KubeProxyConversion::find(const std::string& flag) const {
  for (const auto& s : settings)
    if (s.flag == flag) return &s;
  return nullptr;
}

bool KubeProxyConversion::is_ignored(const std::string& key) const {
  return std::any_of(ignored.begin(), ignored.end(), [&](const auto& i) { return i.key == key; });
}

std::vector<std::string> KubeProxyConversion::report() const {
  std::vector<std::string> lines;
  for (const auto& s : settings) {
    std::string v;
    for (const auto& x : s.values) v += (v.empty() ? "" : ",") + x;
    lines.push_back("KubeProxyConfiguration: " + s.from + " -> --" + s.flag + "=" + v);
  }
  for (const auto& i : ignored)
    lines.push_back("KubeProxyConfiguration: ignored " + i.key + " (" + i.value + "): " + i.reason);
  return lines;
}

bool is_kubeproxy_configuration(const YAML::Node& root) {
  return root.IsMap() && root["kind"] && root["kind"].IsScalar() &&
         root["kind"].as<std::string>() == kKubeProxyKind;
}

Result<KubeProxyConversion> convert_kubeproxy_configuration(const YAML::Node& root) {
  KubeProxyConversion out;
  if (!is_kubeproxy_configuration(root)) return Error{std::string("not a ") + kKubeProxyKind};
  if (std::string api = scalar(root["apiVersion"]); api != kKubeProxyApiVersion) {
    return Error{std::string(kKubeProxyKind) + " key apiVersion: \"" + api + "\": only " +
                 kKubeProxyApiVersion + " is understood"};
  }
  std::set<std::string> used = {"kind", "apiVersion"};
  auto set = [&](std::string flag, std::vector<std::string> values, std::string from) {
    out.settings.push_back({std::move(flag), std::move(values), std::move(from)});
  };
  auto ignore = [&](const std::string& key, const YAML::Node& n, std::string reason) {
    out.ignored.push_back({key, show(n), std::move(reason)});
    used.insert(key);
  };

  // clusterCIDR: "10.244.0.0/16" or "10.244.0.0/16,fd00:10:244::/56".
  used.insert("clusterCIDR");
  std::vector<std::string> cidrs;
  {
    std::string v = scalar(root["clusterCIDR"]);
    size_t start = 0;
    while (start <= v.size() && !v.empty()) {
      auto comma = v.find(',', start);
      std::string c =
          trim(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (!c.empty()) cidrs.push_back(c);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (!cidrs.empty()) set("cluster-cidr", cidrs, "clusterCIDR");
  }

  // nodePortAddresses: CIDRs, or "primary" (the default of both: the node's primary IPs).
  used.insert("nodePortAddresses");
  if (auto n = root["nodePortAddresses"]; n && n.IsSequence()) {
    std::vector<std::string> v;
    for (const auto& e : n) {
      std::string c = scalar(e);
      if (c == "primary") {
        if (n.size() > 1)
          out.ignored.push_back(
              {"nodePortAddresses", "primary",
               "\"primary\" with CIDRs: the CIDRs select the addresses (kube-proxy "
               "takes \"primary\" only alone)"});
        continue;  // alone: endpointd's default too
      }
      v.push_back(c);
    }
    if (!v.empty()) set("nodeport-addresses", v, "nodePortAddresses");
  } else if (n && !is_zero(n)) {
    return Error{std::string(kKubeProxyKind) + " key nodePortAddresses: \"" + show(n) +
                 "\" is not a list of CIDRs"};
  }

  // masqueradeAll: under the nftables mode section (what kube-proxy's nftables mode reads), or
  // the iptables one (a cluster switching from iptables mode keeps its intent).
  {
    std::string from;
    for (const char* key : {"iptables.masqueradeAll", "nftables.masqueradeAll"}) {
      used.insert(key);
      std::string k = key;
      auto dot = k.find('.');
      YAML::Node n = dot == std::string::npos
                         ? root[k]
                         : child(child(root, k.substr(0, dot)), k.substr(dot + 1));
      if (scalar(n) == "true") from += (from.empty() ? "" : ", ") + k;
    }
    if (!from.empty()) set("masquerade-all", {"true"}, from);
  }

  // healthzBindAddress → the health server (probes), metricsBindAddress → the admin server
  // (/metrics, /debug/state): kube-proxy's ports 10256 and 10249. Port 0 turns either off,
  // as in kube-proxy.
  for (auto [key, flag, def, port] :
       {std::tuple{"healthzBindAddress", "health-listen", kHealthzDefault, kHealthzPort},
        std::tuple{"metricsBindAddress", "admin-listen", kMetricsDefault, kMetricsPort}}) {
    used.insert(key);
    std::string v = scalar(root[key]);
    auto addr = bind_address(key, v, def, port);
    if (!addr) return Error{addr.error()};
    std::string from = v.empty() ? std::string(key) + " (empty: kube-proxy's default " + def + ")"
                                 : std::string(key);
    set(flag, {addr->port == 0 ? std::string() : addr->str()},
        addr->port == 0 ? from + " (port 0: off)" : from);
  }

  // The plain keys: each value given becomes the option the table names it for (hostnameOverride,
  // clientConnection.kubeconfig and .contentType — empty: protobuf, kube-proxy's default —,
  // detectLocalMode — empty: ClusterCIDR — and detectLocal.*, conntrack.*), checked there (an
  // unknown mode, or an interface mode without its interface, is an error naming the key).
  // conntrack: kube-proxy fills a null with its own default (maxPerCore 32768, min 131072,
  // tcpEstablishedTimeout 24h, tcpCloseWait 1h) and writes it; endpointd writes only what is
  // set, and says so once.
  bool conntrack_defaulted = false;
  for (const Option& o : run_options()) {
    if (!o.kube_proxy_plain) continue;
    const std::string& key = o.kube_proxy;
    used.insert(key);
    auto dot = key.find('.');
    YAML::Node n =
        dot == std::string::npos ? root[key] : child(root[key.substr(0, dot)], key.substr(dot + 1));
    if (key.rfind("conntrack.", 0) != 0) {
      if (std::string v = scalar(n); !v.empty()) set(o.name, {v}, key);
      continue;
    }
    if (auto ct = root["conntrack"]; !ct || !ct.IsMap()) continue;
    if (!n || n.IsNull()) {
      static const std::set<std::string> kDefaulted = {"conntrack.maxPerCore", "conntrack.min",
                                                       "conntrack.tcpEstablishedTimeout",
                                                       "conntrack.tcpCloseWaitTimeout"};
      conntrack_defaulted = conntrack_defaulted || kDefaulted.count(key);
      continue;
    }
    if (is_zero(n)) continue;  // 0: kube-proxy leaves the node's value too
    set(o.name, {scalar(n)}, key);
  }
  if (conntrack_defaulted)
    out.ignored.push_back(
        {"conntrack", "null",
         "kube-proxy's defaults for unset conntrack values (maxPerCore 32768, min 131072, "
         "tcpEstablishedTimeout 24h, tcpCloseWaitTimeout 1h) are not written; endpointd sets "
         "only the values given (--conntrack-*)"});

  used.insert("logging.format");
  if (root["logging"]) {
    std::string f = scalar(child(root["logging"], "format"));
    if (f == "text" || f == "json") {
      set("log-format", {f}, "logging.format");
    } else if (!f.empty()) {
      ignore("logging.format", child(root["logging"], "format"), "endpointd logs text or json");
    }
  }

  used.insert("mode");
  if (std::string m = scalar(root["mode"]); !m.empty() && m != "nftables") {
    ignore("mode", root["mode"],
           "endpointd programs nftables only (tables ip/ip6 endpointd), whatever the mode; remove "
           "the " +
               m + " rules kube-proxy left with `kube-proxy --cleanup` before starting endpointd");
  }

  // Everything else: reported when it holds something other than the default. A key that is
  // no field of the kind at all is a typo, refused as kube-proxy's strict decoding does.
  std::vector<std::pair<std::string, YAML::Node>> all;
  leaves(root, "", all);
  for (const auto& [key, n] : all) {
    if (!known_key(key))
      return Error{std::string(kKubeProxyKind) + " key " + key + ": not a field of " +
                   kKubeProxyApiVersion + " " + kKubeProxyKind + " (misspelled?)"};
  }
  for (const auto& [key, n] : all) {
    if (used.count(key) || is_zero(n)) continue;
    out.ignored.push_back({key, show(n), reason_for(key)});
  }
  return out;
}

}  // namespace endpointd::daemon
