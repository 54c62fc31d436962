// `endpointd run` settings: the typed configuration, and the one decoder that makes it from the
// command line and a YAML `--config` file (endpointd's own keys, or a KubeProxyConfiguration).
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dns/zone.h"
#include "drain/machine.h"
#include "model/hostport.h"
#include "model/ip.h"
#include "model/result.h"
#include "proxy/conntrack_sysctl.h"
#include "proxy/detect_local.h"
#include "watcher/kube_client.h"

namespace CLI {
class App;
}

namespace endpointd::daemon {

enum class Dataplane : uint8_t { kNftables, kNone };
enum class LogFormat : uint8_t { kText, kJson };
enum class LogLevel : uint8_t { kTrace, kDebug, kInfo, kWarn, kError };

// The closed sets, as users write them: to_string gives the name, parse_* takes it back.
std::string_view to_string(Dataplane v);
std::string_view to_string(LogFormat v);
std::string_view to_string(LogLevel v);
std::string_view to_string(drain::PeerPolicy v);
std::string_view to_string(drain::ReleaseAfter v);
std::string_view to_string(dns::PodMode v);
std::string_view to_string(proxy::DetectLocal v);
std::optional<Dataplane> parse_dataplane(std::string_view s);
std::optional<LogFormat> parse_log_format(std::string_view s);
std::optional<LogLevel> parse_log_level(std::string_view s);
std::optional<drain::PeerPolicy> parse_peer_policy(std::string_view s);
std::optional<drain::ReleaseAfter> parse_release_after(std::string_view s);
std::optional<dns::PodMode> parse_pod_records(std::string_view s);
std::optional<proxy::DetectLocal> parse_detect_local_mode(std::string_view s);

// A line of the KubeProxyConfiguration report, logged once logging is set up.
struct ConfigNote {
  bool warning = false;  // an ignored key (warn); otherwise what took effect (info)
  std::string line;
};

// Every value checked: an unset optional listener means "off". The member defaults are the
// options' defaults: the option table (daemon/options.h) reads them for --help, the README and
// --write-config-to.
struct Config {
  // Source of cluster state.
  std::string source_dir;
  std::string kubeconfig;
  std::string node_name;  // resolve_defaults: $NODE_NAME, else the host name
  bool watch_pods = true;
  // Kubernetes Events on the pods this node drains (daemon/events.h); API sources only.
  bool events = true;
  std::chrono::seconds watch_timeout{300};
  // A watch with no byte (event or bookmark) for this long is re-established; 0: off. Above
  // the API server's bookmark period (~1 min) so that quiet watches are not churned; a dead
  // peer is found sooner by TCP keepalive (watcher/kube_client.h).
  std::chrono::seconds watch_stall_timeout{75};
  size_t list_page_size = 500;
  // --api-list-mode: how each kind's state is got at start and after an expired watch
  // (watcher::ListMode): WatchList where the API server offers it, else consistent lists.
  watcher::ListMode api_list_mode = watcher::ListMode::kAuto;
  // --kube-api-content-type: EndpointSlice lists in protobuf (kube-proxy's default too), else
  // JSON. The API server's answer decides; JSON is always understood.
  bool kube_api_protobuf = true;
  // /livez fails once an update has waited this long unapplied (in the update loop, in a sink,
  // or queued for the kernel): the agent is stuck and the kubelet should restart it.
  // kube-proxy's bound is twice its sync period (60 s by default).
  std::chrono::seconds livez_timeout{60};

  // Dataplane.
  Dataplane dataplane = Dataplane::kNftables;
  std::vector<model::IpPrefix> cluster_cidr;
  // kube-proxy's --detect-local-mode and its interface settings (checked: the mode's interface
  // is given, and is an interface name).
  proxy::DetectLocal detect_local_mode = proxy::DetectLocal::kClusterCidr;
  std::string pod_bridge_interface;
  std::string pod_interface_name_prefix;
  // The service CIDRs (the API server's --service-cluster-ip-range, or its ServiceCIDR
  // objects): traffic to an unallocated cluster IP in them is dropped. Empty: not dropped.
  std::vector<model::IpPrefix> service_cidr;
  std::vector<model::IpPrefix> nodeport_addresses;
  bool masquerade_all = false;
  // nf_conntrack sysctls written at start as kube-proxy writes them (--conntrack-*); unset:
  // left as the node has them.
  proxy::ConntrackSysctls conntrack;
  bool cleanup = false;
  // Apply the settings that need a writable /proc/sys (the conntrack sysctls) and exit.
  bool init_only = false;

  // DNS.
  std::optional<model::HostPort> dns_listen;  // an IP address and a port
  std::string dns_zone = "cluster.local";
  std::vector<std::string> dns_extra_zones;  // lower case, no trailing dot
  std::vector<model::HostPort>
      dns_upstream;  // IP addresses, port 53 unless given; empty: resolv.conf
  dns::PodMode dns_pod_records = dns::PodMode::kInsecure;
  bool dns_loadbalance = true;          // CoreDNS's loadbalance, which kubeadm's Corefile enables
  bool dns_endpoint_pod_names = false;  // CoreDNS's endpoint_pod_names (off there too)
  // After SIGTERM, DNS answers this long before the agent stops (CoreDNS's health lameduck;
  // kubeadm's Corefile has 5 s); readiness fails meanwhile.
  std::chrono::milliseconds dns_lameduck{5000};
  std::chrono::seconds dns_ttl{5};
  // How long NXDOMAIN and NODATA may be cached (the SOA's minimum; CoreDNS's cache `denial`).
  std::chrono::seconds dns_negative_ttl{5};
  // CoreDNS kubernetes-plugin options (dns/zone.h, ZoneOptions): noendpoints,
  // ignore empty_service, namespaces (empty: every namespace).
  bool dns_noendpoints = false;
  bool dns_ignore_empty_service = false;
  std::vector<std::string> dns_namespaces;
  // The forwarder's cache (CoreDNS's cache capacity and its TTL cap).
  size_t dns_cache_size = 10000;
  std::chrono::seconds dns_cache_max_ttl{3600};
  std::chrono::seconds dns_cache_denial_max_ttl{1800};
  std::vector<model::IpPrefix> dns_forward_allow;
  // Node-local DNS (NodeLocal DNSCache's 169.254.20.10): an address put on the dummy interface
  // endpointd-dns and answered on dns_listen's port, its traffic exempt from conntrack.
  // Point kubelets' clusterDNS at it. Unset: off.
  std::optional<model::IpAddr> dns_node_local_address;

  // Feed. TLS when a certificate and its key are given; with a client CA, every subscriber
  // must present a certificate it signed.
  std::optional<model::HostPort> feed_listen;
  std::string feed_tls_cert, feed_tls_key, feed_client_ca;
  // How long a feed subscriber is waited for — one that went away (by its name), one with a
  // response unacknowledged or rejected — before it no longer holds drains and is a holdout
  // (feed/hub.h); 0: no ghosts, and a connected stream holds for as long as it is.
  std::chrono::milliseconds feed_subscriber_grace{10000};
  // Where the feed keeps its named subscribers across a restart (feed/hub.h); empty: nowhere.
  // The chart sets it to a file next to the drain socket (/run/endpointd/feed-subscribers).
  std::string feed_state_file;

  // Health and admin servers, as kube-proxy splits them: the probes on the node's addresses
  // (kube-proxy's healthz port), /metrics and /debug/state on loopback (kube-proxy's metrics
  // port) unless widened, then optionally behind a bearer token. The admin server answers
  // the probes too.
  std::optional<model::HostPort> health_listen = model::HostPort{"0.0.0.0", 10256};
  std::optional<model::HostPort> admin_listen = model::HostPort{"127.0.0.1", 10249};
  std::string admin_token_file;  // read at start: "Authorization: Bearer <token>" required

  // Drain.
  std::string drain_socket = "/run/endpointd/drain.sock";
  std::optional<model::HostPort> drain_peer_listen = model::HostPort{"0.0.0.0", 9465};
  // The peers' port; unless given, the port of drain_peer_listen (every agent listens alike).
  uint16_t drain_peer_port = 9465;
  drain::PeerPolicy drain_peer_policy = drain::PeerPolicy::kProceed;
  std::chrono::milliseconds drain_peer_timeout{5000};
  drain::ReleaseAfter drain_release_after = drain::ReleaseAfter::kRemoved;
  std::chrono::milliseconds drain_quiet{1000};
  bool drain_watermark = true;  // --drain-peer-protocol watermark (else per-endpoint)
  size_t drain_fan_in = 32;
  std::chrono::milliseconds drain_liveness{3000};
  // The drain's members: the nodes of this Service's endpoints (drain/members.h); unset: every
  // Node, and the API source then watches every Node instead of this node's alone.
  std::optional<model::ObjectKey> drain_members_service;
  // What the node keeps for drains across this agent's restarts (drain/node_state.h); empty:
  // nothing (a restart forgets the agents it saw and the DNS TTL it served).
  std::string drain_state_file;
  // Peer traffic is mutual TLS (CA, this node's certificate, its key); plaintext only with
  // drain_peer_insecure (drain/peer_tls.h).
  std::string drain_peer_ca, drain_peer_cert, drain_peer_key;
  bool drain_peer_insecure = false;
  // Identity (the chart's default): this agent's projected ServiceAccount token (audience
  // endpointd-peer), sent to peers and verified by them against the issuer's keys; the TLS
  // files above are then one server certificate every agent shares (daemon/peer_auth.h).
  std::string drain_peer_token_file;

  // Logging.
  LogFormat log_format = LogFormat::kText;
  LogLevel log_level = LogLevel::kInfo;

  // What a KubeProxyConfiguration file mapped and ignored.
  std::vector<ConfigNote> notes;
};

// The command line as given: a flag's long name (without "--") → its values, one per time the
// flag was given; only flags that were given. "config" names the YAML file.
using RawFlags = std::map<std::string, std::vector<std::string>>;

// The one place every setting is checked: each option by its row of the option table
// (daemon/options.h), then what depends on two of them. Each value comes from the command line,
// else the file, else the default. The error names where the bad value came from and the value:
//   --drain-peer-policy: "maybe" is not one of proceed|wait
//   config file key dns-ttl: "9000" is not a whole number in 0..3600
//   KubeProxyConfiguration key healthzBindAddress: "x:y" is not ADDR, ADDR:PORT or [IPv6]:PORT
Result<Config> decode_config(const RawFlags& flags, const YAML::Node* file);

// Reads a YAML config file; the error names the file and, for bad YAML, the line.
Result<YAML::Node> read_config_file(const std::string& path);
// decode_config with the file that flags["config"] names, if any.
Result<Config> load_config(const RawFlags& flags);

// Registers the `run` flags on `app`, one per row of the option table (help text and defaults
// only: values are checked by decode_config, not by CLI11).
void add_run_flags(CLI::App& app);
// The subset `render` takes: --source-dir (required), --node-name, --cluster-cidr,
// --nodeport-addresses, --masquerade-all, --detect-local-mode, --pod-bridge-interface,
// --pod-interface-name-prefix, --service-cidr.
void add_render_flags(CLI::App& app);
// After app.parse(): what the command line gave to the flags of `app`.
RawFlags raw_flags(const CLI::App& app);

// `endpointd run --write-config-to FILE` (kube-proxy's flag): the configuration `flags` give, as
// a config file of endpointd's own keys, in the order of `app`'s flags (endpointd run's). Each
// setting has its value from the command line, else the config file (endpointd's own or a
// KubeProxyConfiguration, converted: a kube-proxy config becomes endpointd's), else its
// default; a setting with none of these is written as a comment. Read back with --config, it
// is the same configuration, and writing it out again gives the same text. An error when the
// configuration does not decode (the error `run` would give).
struct WrittenConfig {
  std::string text;
  std::vector<ConfigNote> notes;  // what a KubeProxyConfiguration mapped and ignored
};
Result<WrittenConfig> write_config(const CLI::App& app, const RawFlags& flags);

// Fills defaults that depend on the environment ($NODE_NAME, the host name).
void resolve_defaults(Config& cfg);

// Tells when a config file's content changed since it was last looked at: a mounted ConfigMap
// is updated by swapping a symlink, so the content is compared, not a modification time.
class ConfigFileWatch {
 public:
  explicit ConfigFileWatch(std::string path);  // remembers the content it has now
  // True once per change of content (also when the file appears or becomes unreadable).
  bool changed();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::optional<std::string> seen_;
};

}  // namespace endpointd::daemon
