// `endpointd run` flags and the YAML config file, decoded into one typed Config.
#include "daemon/config.h"

#include <gtest/gtest.h>

#include "tests/daemon/run_args.h"

namespace endpointd::daemon {
namespace {

using testing::run_args;
using testing::TempFile;

std::vector<std::string> strs(const std::vector<model::IpPrefix>& v) {
  std::vector<std::string> out;
  for (const auto& p : v) out.push_back(p.str());
  return out;
}

std::string str(const std::optional<model::HostPort>& hp) {
  return hp ? hp->str() : "<off>";
}

TEST(Config, FlagsHaveTheDocumentedDefaults) {
  auto c = run_args({});
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->dataplane, Dataplane::kNftables);
  EXPECT_EQ(c->dns_zone, "cluster.local");
  EXPECT_FALSE(c->dns_listen);
  EXPECT_FALSE(c->feed_listen);
  EXPECT_TRUE(c->feed_state_file.empty());  // off: a test's agent writes nothing
  EXPECT_EQ(str(c->admin_listen), "127.0.0.1:10249");
  EXPECT_EQ(str(c->health_listen), "0.0.0.0:10256");
  EXPECT_EQ(c->drain_socket, "/run/endpointd/drain.sock");
  EXPECT_EQ(str(c->drain_peer_listen), "0.0.0.0:9465");
  EXPECT_EQ(c->drain_peer_port, 9465);
  EXPECT_EQ(c->drain_peer_policy, drain::PeerPolicy::kProceed);
  EXPECT_FALSE(c->drain_members_service);  // the Node list
  EXPECT_EQ(c->drain_peer_timeout, std::chrono::milliseconds(5000));
  EXPECT_EQ(c->drain_release_after, drain::ReleaseAfter::kRemoved);
  EXPECT_EQ(c->dns_pod_records, dns::PodMode::kInsecure);
  EXPECT_EQ(c->dns_ttl, std::chrono::seconds(5));
  EXPECT_TRUE(c->watch_pods);
  EXPECT_EQ(c->watch_timeout, std::chrono::seconds(300));
  EXPECT_EQ(c->list_page_size, 500u);
  EXPECT_EQ(c->api_list_mode, watcher::ListMode::kAuto);
  EXPECT_EQ(c->log_format, LogFormat::kText);
  EXPECT_EQ(c->log_level, LogLevel::kInfo);
  EXPECT_FALSE(c->masquerade_all);
  EXPECT_FALSE(c->cleanup);
  EXPECT_FALSE(c->init_only);
  EXPECT_TRUE(c->notes.empty());
}

TEST(Config, EveryFlagDecodesToItsTypedValue) {
  auto c = run_args({"--source-dir",
                     "/srv/m",
                     "--node-name",
                     "node-a",
                     "--dataplane",
                     "none",
                     "--dns-listen",
                     "[::1]:5353",
                     "--dns-zone",
                     "corp.example.",
                     "--dns-upstream",
                     "10.0.0.2,[fd00::53]:5353",
                     "--dns-pod-records",
                     "verified",
                     "--dns-ttl",
                     "0",
                     "--dns-forward-allow",
                     "10.0.0.0/8",
                     "--feed-listen",
                     "0.0.0.0:18000",
                     "--admin-listen",
                     ":10256",
                     "--drain-socket",
                     "/tmp/d.sock",
                     "--drain-peer-listen",
                     "0.0.0.0:9500",
                     "--drain-members-service",
                     "kube-system/endpointd",
                     "--drain-peer-policy",
                     "wait",
                     "--drain-peer-timeout-ms",
                     "600000",
                     "--drain-release-after",
                     "removed",
                     "--cluster-cidr",
                     "10.244.0.0/16, fd00:244::/56",
                     "--cluster-cidr",
                     "10.245.0.0/16",
                     "--masquerade-all",
                     "--nodeport-addresses",
                     "192.168.0.0/16",
                     "--watch-pods",
                     "false",
                     "--watch-timeout",
                     "10",
                     "--list-page-size",
                     "10000",
                     "--api-list-mode",
                     "cache",
                     "--kube-api-content-type",
                     "application/json",
                     "--log-format",
                     "json",
                     "--log-level",
                     "debug"});
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->source_dir, "/srv/m");
  EXPECT_EQ(c->node_name, "node-a");
  EXPECT_EQ(c->dataplane, Dataplane::kNone);
  EXPECT_FALSE(c->kube_api_protobuf);
  EXPECT_EQ(str(c->dns_listen), "[::1]:5353");
  EXPECT_EQ(c->dns_zone, "corp.example.");
  ASSERT_EQ(c->dns_upstream.size(), 2u);
  EXPECT_EQ(c->dns_upstream[0].str(), "10.0.0.2:53");
  EXPECT_EQ(c->dns_upstream[1].str(), "[fd00::53]:5353");
  EXPECT_EQ(c->dns_pod_records, dns::PodMode::kVerified);
  EXPECT_EQ(c->dns_ttl, std::chrono::seconds(0));
  EXPECT_EQ(strs(c->dns_forward_allow), (std::vector<std::string>{"10.0.0.0/8"}));
  EXPECT_EQ(str(c->feed_listen), "0.0.0.0:18000");
  ASSERT_TRUE(c->admin_listen);
  EXPECT_EQ(c->admin_listen->host, "");
  EXPECT_EQ(c->admin_listen->port, 10256);
  EXPECT_EQ(c->drain_socket, "/tmp/d.sock");
  EXPECT_EQ(str(c->drain_peer_listen), "0.0.0.0:9500");
  EXPECT_EQ(c->drain_peer_port, 9500);  // not given: every agent listens on the same port
  EXPECT_EQ(c->drain_peer_policy, drain::PeerPolicy::kWait);
  ASSERT_TRUE(c->drain_members_service);
  EXPECT_EQ(c->drain_members_service->str(), "kube-system/endpointd");
  EXPECT_EQ(c->drain_peer_timeout, std::chrono::milliseconds(600000));
  EXPECT_EQ(c->drain_release_after, drain::ReleaseAfter::kRemoved);
  EXPECT_EQ(strs(c->cluster_cidr),
            (std::vector<std::string>{"10.244.0.0/16", "fd00:244::/56", "10.245.0.0/16"}));
  EXPECT_TRUE(c->masquerade_all);
  EXPECT_EQ(strs(c->nodeport_addresses), (std::vector<std::string>{"192.168.0.0/16"}));
  EXPECT_FALSE(c->watch_pods);
  EXPECT_EQ(c->watch_timeout, std::chrono::seconds(10));
  EXPECT_EQ(c->list_page_size, 10000u);
  EXPECT_EQ(c->api_list_mode, watcher::ListMode::kCache);
  EXPECT_EQ(c->log_format, LogFormat::kJson);
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
}

TEST(Config, ProbesAndAdminListenLikeKubeProxysUnlessMoved) {
  auto c = run_args({});
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->health_listen->str(), "0.0.0.0:10256");
  EXPECT_EQ(c->admin_listen->str(), "127.0.0.1:10249");  // loopback: /metrics, /debug/state
  EXPECT_TRUE(c->admin_token_file.empty());
  c = run_args({"--health-listen", "", "--admin-listen", "0.0.0.0:10249", "--admin-token-file",
                "/etc/endpointd/token", "--feed-tls-cert", "a.crt", "--feed-tls-key", "a.key",
                "--feed-client-ca", "ca.crt"});
  ASSERT_TRUE(c) << c.error();
  EXPECT_FALSE(c->health_listen);
  EXPECT_EQ(c->admin_token_file, "/etc/endpointd/token");
  EXPECT_EQ(c->feed_tls_cert, "a.crt");
  EXPECT_EQ(c->feed_tls_key, "a.key");
  EXPECT_EQ(c->feed_client_ca, "ca.crt");
}

TEST(Config, EmptyListenersAreOffAndAGivenPeerPortWins) {
  auto c = run_args({"--admin-listen", "", "--drain-peer-listen", "", "--drain-peer-port", "9999"});
  ASSERT_TRUE(c) << c.error();
  EXPECT_FALSE(c->admin_listen);
  EXPECT_FALSE(c->drain_peer_listen);
  EXPECT_EQ(c->drain_peer_port, 9999);
  c = run_args({"--drain-peer-listen", "10.0.0.1:9500", "--drain-peer-port", "9465"});
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->drain_peer_port, 9465);
}

TEST(Config, YamlFileTakesTheFlagNamesAndFlagsWin) {
  TempFile f(
      "source-dir: /srv/manifests\n"
      "dns-listen: 127.0.0.1:5353\n"
      "cluster-cidr: [10.244.0.0/16, fd00:244::/56]\n"
      "nodeport-addresses: 10.0.0.0/8,10.1.0.0/16\n"
      "dns-upstream:\n"
      "dataplane: none\n"
      "masquerade-all: true\n"
      "watch-pods: false\n"
      "drain-peer-timeout-ms: 2000\n"
      "feed-state-file: /run/endpointd/feed-subscribers\n");
  auto c = run_args({"--config", f.path(), "--dataplane", "nftables"});
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->source_dir, "/srv/manifests");
  EXPECT_EQ(str(c->dns_listen), "127.0.0.1:5353");
  EXPECT_EQ(strs(c->cluster_cidr), (std::vector<std::string>{"10.244.0.0/16", "fd00:244::/56"}));
  EXPECT_EQ(strs(c->nodeport_addresses), (std::vector<std::string>{"10.0.0.0/8", "10.1.0.0/16"}));
  EXPECT_TRUE(c->dns_upstream.empty());
  EXPECT_EQ(c->dataplane, Dataplane::kNftables);  // the command line wins
  EXPECT_TRUE(c->masquerade_all);
  EXPECT_FALSE(c->watch_pods);
  EXPECT_EQ(c->drain_peer_timeout, std::chrono::milliseconds(2000));
  EXPECT_EQ(c->feed_state_file, "/run/endpointd/feed-subscribers");
  c = run_args({"--config", f.path(), "--feed-state-file", "/tmp/subs"});
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->feed_state_file, "/tmp/subs");
}

TEST(Config, ClosedSetsRoundTrip) {
  for (auto v : {Dataplane::kNftables, Dataplane::kNone})
    EXPECT_EQ(parse_dataplane(to_string(v)), v);
  for (auto v : {LogFormat::kText, LogFormat::kJson}) EXPECT_EQ(parse_log_format(to_string(v)), v);
  for (auto v :
       {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError})
    EXPECT_EQ(parse_log_level(to_string(v)), v);
  for (auto v : {drain::PeerPolicy::kProceed, drain::PeerPolicy::kWait})
    EXPECT_EQ(parse_peer_policy(to_string(v)), v);
  for (auto v : {drain::ReleaseAfter::kRemoved, drain::ReleaseAfter::kDrained})
    EXPECT_EQ(parse_release_after(to_string(v)), v);
  for (auto v : {dns::PodMode::kDisabled, dns::PodMode::kInsecure, dns::PodMode::kVerified})
    EXPECT_EQ(parse_pod_records(to_string(v)), v);
  for (auto v : {proxy::DetectLocal::kClusterCidr, proxy::DetectLocal::kNodeCidr,
                 proxy::DetectLocal::kBridgeInterface, proxy::DetectLocal::kInterfaceNamePrefix})
    EXPECT_EQ(parse_detect_local_mode(to_string(v)), v);
  EXPECT_FALSE(parse_peer_policy("Wait"));
  EXPECT_FALSE(parse_log_level(""));
  EXPECT_FALSE(parse_detect_local_mode("clustercidr"));  // kube-proxy's spelling only
}

TEST(Config, DetectLocalModesAndServiceCidrs) {
  auto def = decode_config({}, nullptr);
  ASSERT_TRUE(def) << def.error();
  EXPECT_EQ(def->detect_local_mode, proxy::DetectLocal::kClusterCidr);
  EXPECT_TRUE(def->service_cidr.empty());

  auto c = decode_config({{"detect-local-mode", {"BridgeInterface"}},
                          {"pod-bridge-interface", {"cbr0"}},
                          {"service-cidr", {"10.96.0.0/12,fd96::/108"}}},
                         nullptr);
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->detect_local_mode, proxy::DetectLocal::kBridgeInterface);
  EXPECT_EQ(c->pod_bridge_interface, "cbr0");
  EXPECT_EQ(strs(c->service_cidr), (std::vector<std::string>{"10.96.0.0/12", "fd96::/108"}));

  // A KubeProxyConfiguration's keys, through the same checks.
  YAML::Node kpc = YAML::Load(
      "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
      "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth\n");
  auto k = decode_config({}, &kpc);
  ASSERT_TRUE(k) << k.error();
  EXPECT_EQ(k->detect_local_mode, proxy::DetectLocal::kInterfaceNamePrefix);
  EXPECT_EQ(k->pod_interface_name_prefix, "veth");
  // Empty: kube-proxy's default.
  auto e = decode_config({{"detect-local-mode", {""}}}, nullptr);
  ASSERT_TRUE(e) << e.error();
  EXPECT_EQ(e->detect_local_mode, proxy::DetectLocal::kClusterCidr);
}

// Every bad input gives exactly one error, naming where the value came from and the value.
struct BadInput {
  const char* what;
  RawFlags flags;
  const char* file;  // YAML, or null
  const char* error;
};

constexpr const char* kKpc =
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

std::string kpc(const std::string& rest) {
  return kKpc + rest;
}

TEST(Config, BadInputsGiveOneErrorNamingTheKeyAndValue) {
  const std::string kpc_health = kpc("healthzBindAddress: x:y\n");
  const std::string kpc_cidr = kpc("clusterCIDR: 10.244.0.0/16,10.244.0.0/33\n");
  const std::string kpc_npa = kpc("nodePortAddresses: [nope]\n");
  const std::string kpc_npa_scalar = kpc("nodePortAddresses: 10.0.0.0/8\n");
  const std::string kpc_v2 =
      "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n";
  const std::string kpc_mode = kpc("detectLocalMode: PodCIDR\n");
  const std::string kpc_bridge = kpc("detectLocalMode: BridgeInterface\n");
  const std::string kpc_prefix =
      kpc("detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: a/b\n");
  const std::vector<BadInput> cases = {
      {"policy",
       {{"drain-peer-policy", {"maybe"}}},
       nullptr,
       R"(--drain-peer-policy: "maybe" is not one of proceed|wait)"},
      {"members service",
       {{"drain-members-service", {"endpointd"}}},
       nullptr,
       R"(--drain-members-service: "endpointd" is not NAMESPACE/NAME (the Service over the endpointd DaemonSet's pods))"},
      {"members service, two slashes",
       {{"drain-members-service", {"kube-system/endpointd/x"}}},
       nullptr,
       R"(--drain-members-service: "kube-system/endpointd/x" is not NAMESPACE/NAME (the Service over the endpointd DaemonSet's pods))"},
      {"release",
       {{"drain-release-after", {"exit"}}},
       nullptr,
       R"(--drain-release-after: "exit" is not one of removed|drained|silent)"},
      {"dataplane",
       {{"dataplane", {"iptables"}}},
       nullptr,
       R"(--dataplane: "iptables" is not one of nftables|none)"},
      {"pod records",
       {{"dns-pod-records", {"on"}}},
       nullptr,
       R"(--dns-pod-records: "on" is not one of disabled|insecure|verified)"},
      {"log format",
       {{"log-format", {"xml"}}},
       nullptr,
       R"(--log-format: "xml" is not one of text|json)"},
      {"log level",
       {{"log-level", {"verbose"}}},
       nullptr,
       R"(--log-level: "verbose" is not one of trace|debug|info|warn|error)"},
      {"ttl range",
       {{"dns-ttl", {"9000"}}},
       nullptr,
       R"(--dns-ttl: "9000" is not a whole number in 0..3600)"},
      {"ttl text",
       {{"dns-ttl", {"5s"}}},
       nullptr,
       R"(--dns-ttl: "5s" is not a whole number in 0..3600)"},
      {"negative ttl",
       {{"dns-negative-ttl", {"-1"}}},
       nullptr,
       R"(--dns-negative-ttl: "-1" is not a whole number in 0..3600)"},
      {"namespace name",
       {{"dns-namespaces", {"demo,Kube_System"}}},
       nullptr,
       R"(--dns-namespaces: "Kube_System" is not a namespace name (a DNS label: a-z, 0-9, '-', at most 63))"},
      {"noendpoints",
       {{"dns-noendpoints", {"maybe"}}},
       nullptr,
       R"(--dns-noendpoints: "maybe" is not true or false)"},
      {"cache size",
       {{"dns-cache-size", {"lots"}}},
       nullptr,
       R"(--dns-cache-size: "lots" is not a whole number in 0..10000000)"},
      {"extra zone inside the zone",
       {{"dns-extra-zones", {"example.com,svc2.cluster.local"}}},
       nullptr,
       R"(--dns-extra-zones: "svc2.cluster.local" is inside the zone cluster.local, which answers it already)"},
      {"extra zone not a name",
       {{"dns-extra-zones", {"a..b"}}},
       nullptr,
       R"(--dns-extra-zones: "a..b" is not a DNS name)"},
      {"extra zone twice",
       {{"dns-extra-zones", {"Example.com,example.com."}}},
       nullptr,
       R"(--dns-extra-zones: "example.com." is listed twice)"},
      {"cache denial cap",
       {{"dns-cache-denial-max-ttl", {"-1"}}},
       nullptr,
       R"(--dns-cache-denial-max-ttl: "-1" is not a whole number in 0..86400)"},
      {"peer timeout",
       {{"drain-peer-timeout-ms", {"0"}}},
       nullptr,
       R"(--drain-peer-timeout-ms: "0" is not a whole number in 1..600000)"},
      {"peer port",
       {{"drain-peer-port", {"70000"}}},
       nullptr,
       R"(--drain-peer-port: "70000" is not a whole number in 1..65535)"},
      {"watch timeout",
       {{"watch-timeout", {"5"}}},
       nullptr,
       R"(--watch-timeout: "5" is not a whole number in 10..3600)"},
      {"watch stall timeout",
       {{"watch-stall-timeout", {"5"}}},
       nullptr,
       R"(--watch-stall-timeout: "5" is below 10 s: quiet watches would be re-established over and over (0 turns the check off))"},
      {"content type",
       {{"kube-api-content-type", {"application/yaml"}}},
       nullptr,
       R"(--kube-api-content-type: "application/yaml" is not one of application/vnd.kubernetes.protobuf|application/json)"},
      {"list mode",
       {{"api-list-mode", {"etcd"}}},
       nullptr,
       R"(--api-list-mode: "etcd" is not one of auto|list|cache)"},
      {"page size",
       {{"list-page-size", {"-1"}}},
       nullptr,
       R"(--list-page-size: "-1" is not a whole number in 1..10000)"},
      {"bool",
       {{"watch-pods", {"maybe"}}},
       nullptr,
       R"(--watch-pods: "maybe" is not true or false)"},
      {"admin listen",
       {{"admin-listen", {"localhost"}}},
       nullptr,
       R"(--admin-listen: "localhost" is not ADDR:PORT or [IPv6]:PORT)"},
      {"health listen",
       {{"health-listen", {"10256"}}},
       nullptr,
       R"(--health-listen: "10256" is not ADDR:PORT or [IPv6]:PORT)"},
      {"feed tls half",
       {{"feed-tls-cert", {"/etc/feed.crt"}}},
       nullptr,
       "--feed-tls-cert and --feed-tls-key go together: give both or neither"},
      {"feed client ca without tls",
       {{"feed-client-ca", {"/etc/ca.crt"}}},
       nullptr,
       "--feed-client-ca needs --feed-tls-cert and --feed-tls-key (clients are verified over "
       "TLS only)"},
      {"dns listen host",
       {{"dns-listen", {"localhost:53"}}},
       nullptr,
       R"(--dns-listen: "localhost:53" is not IP:PORT or [IPv6]:PORT (DNS binds one address))"},
      {"dns listen port",
       {{"dns-listen", {"5353"}}},
       nullptr,
       R"(--dns-listen: "5353" is not ADDR:PORT or [IPv6]:PORT)"},
      {"feed listen",
       {{"feed-listen", {":18000"}}},
       nullptr,
       R"(--feed-listen: ":18000" has no address (0.0.0.0 or [::] for every address))"},
      {"peer listen",
       {{"drain-peer-listen", {"0.0.0.0:99999"}}},
       nullptr,
       R"(--drain-peer-listen: "0.0.0.0:99999" is not ADDR:PORT or [IPv6]:PORT)"},
      {"cidr",
       {{"cluster-cidr", {"10.0.0.0/8,10.0.0.0/99"}}},
       nullptr,
       R"(--cluster-cidr: "10.0.0.0/99" is not a CIDR)"},
      {"nodeport cidr",
       {{"nodeport-addresses", {"eth0"}}},
       nullptr,
       R"(--nodeport-addresses: "eth0" is not a CIDR)"},
      {"forward cidr",
       {{"dns-forward-allow", {"10.0.0.1"}}},
       nullptr,
       R"(--dns-forward-allow: "10.0.0.1" is not a CIDR)"},
      {"upstream",
       {{"dns-upstream", {"resolver.example"}}},
       nullptr,
       R"(--dns-upstream: "resolver.example" is not IP[:PORT] or [IPv6]:PORT)"},
      {"zone", {{"dns-zone", {"a..b"}}}, nullptr, R"(--dns-zone: "a..b" is not a DNS name)"},
      {"unknown flag", {{"dns-lisen", {"x"}}}, nullptr, "--dns-lisen: not a flag of endpointd run"},
      {"exclusive",
       {{"source-dir", {"a"}}, {"kubeconfig", {"b"}}},
       nullptr,
       "--source-dir and --kubeconfig are exclusive: choose one source of cluster state"},
      {"file value",
       {},
       "drain-peer-timeout-ms: soon\n",
       R"(config file key drain-peer-timeout-ms: "soon" is not a whole number in 1..600000)"},
      {"file choice",
       {},
       "drain-peer-policy: maybe\n",
       R"(config file key drain-peer-policy: "maybe" is not one of proceed|wait)"},
      {"file listen",
       {},
       "admin-listen: 10256\n",
       R"(config file key admin-listen: "10256" is not ADDR:PORT or [IPv6]:PORT)"},
      {"file cidr list",
       {},
       "cluster-cidr: [10.244.0.0/16, bad]\n",
       R"(config file key cluster-cidr: "bad" is not a CIDR)"},
      {"file unknown key",
       {},
       "dns-lisen: 127.0.0.1:53\n",
       R"(config file: unknown key "dns-lisen")"},
      {"file list for one value",
       {},
       "dataplane: [nftables, none]\n",
       "config file key dataplane: expected one value, got 2"},
      {"file map value",
       {},
       "dns-zone: {a: b}\n",
       "config file key dns-zone: expected a value or a list, not a map"},
      {"file not a map", {}, "- a\n- b\n", "config file: expected a map of settings"},
      {"kpc healthz",
       {},
       kpc_health.c_str(),
       R"(KubeProxyConfiguration key healthzBindAddress: "x:y" is not ADDR, ADDR:PORT or [IPv6]:PORT)"},
      {"kpc cidr",
       {},
       kpc_cidr.c_str(),
       R"(KubeProxyConfiguration key clusterCIDR: "10.244.0.0/33" is not a CIDR)"},
      {"kpc nodeport",
       {},
       kpc_npa.c_str(),
       R"(KubeProxyConfiguration key nodePortAddresses: "nope" is not a CIDR)"},
      {"kpc nodeport shape",
       {},
       kpc_npa_scalar.c_str(),
       R"(KubeProxyConfiguration key nodePortAddresses: "10.0.0.0/8" is not a list of CIDRs)"},
      {"detect-local mode",
       {{"detect-local-mode", {"Bridge"}}},
       nullptr,
       R"(--detect-local-mode: "Bridge" is not one of ClusterCIDR|NodeCIDR|BridgeInterface|InterfaceNamePrefix)"},
      {"detect-local bridge missing",
       {{"detect-local-mode", {"BridgeInterface"}}},
       nullptr,
       R"(--detect-local-mode: "BridgeInterface" needs --pod-bridge-interface)"},
      {"detect-local prefix missing",
       {{"detect-local-mode", {"InterfaceNamePrefix"}}, {"pod-bridge-interface", {"cbr0"}}},
       nullptr,
       R"(--detect-local-mode: "InterfaceNamePrefix" needs --pod-interface-name-prefix)"},
      {"bridge name too long",
       {{"detect-local-mode", {"BridgeInterface"}},
        {"pod-bridge-interface", {"a-very-long-bridge0"}}},
       nullptr,
       R"(--pod-bridge-interface: "a-very-long-bridge0" is not a network interface name (1 to 15 characters, none of / : * or spaces))"},
      {"service cidr",
       {{"service-cidr", {"10.96.0.0/12,10.96.0.0/40"}}},
       nullptr,
       R"(--service-cidr: "10.96.0.0/40" is not a CIDR)"},
      {"file detect-local mode",
       {},
       "detect-local-mode: BridgeInterface\n",
       R"(config file key detect-local-mode: "BridgeInterface" needs config file key pod-bridge-interface)"},
      {"kpc detect-local mode",
       {},
       kpc_mode.c_str(),
       R"(KubeProxyConfiguration key detectLocalMode: "PodCIDR" is not one of ClusterCIDR|NodeCIDR|BridgeInterface|InterfaceNamePrefix)"},
      {"kpc bridge missing",
       {},
       kpc_bridge.c_str(),
       R"(KubeProxyConfiguration key detectLocalMode: "BridgeInterface" needs KubeProxyConfiguration key detectLocal.bridgeInterface)"},
      {"kpc prefix",
       {},
       kpc_prefix.c_str(),
       R"(KubeProxyConfiguration key detectLocal.interfaceNamePrefix: "a/b" is not a network interface name (1 to 15 characters, none of / : * or spaces))"},
      {"kpc version",
       {},
       kpc_v2.c_str(),
       R"(KubeProxyConfiguration key apiVersion: "kubeproxy.config.k8s.io/v1alpha2": only kubeproxy.config.k8s.io/v1alpha1 is understood)"},
  };
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.what);
    YAML::Node file;
    if (tc.file) file = YAML::Load(tc.file);
    auto c = decode_config(tc.flags, tc.file ? &file : nullptr);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error(), tc.error);
  }
}

TEST(Config, TheCommandLineWinsBeforeTheFileIsChecked) {
  // A bad file value the command line overrides is never used, so it is no error.
  YAML::Node file = YAML::Load("dns-ttl: forever\n");
  auto c = decode_config({{"dns-ttl", {"30"}}}, &file);
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->dns_ttl, std::chrono::seconds(30));
}

// The CoreDNS options of the DNS zone, from the file (as a reload reads them) and the flags.
TEST(Config, DnsZoneOptionsFromTheFileAndFlags) {
  YAML::Node file = YAML::Load(
      "dns-namespaces: [demo, kube-system]\ndns-noendpoints: true\n"
      "dns-ignore-empty-service: true\ndns-negative-ttl: 30\ndns-cache-max-ttl: 600\n"
      "dns-cache-denial-max-ttl: 0\ndns-extra-zones: [Example.COM., corp.internal]\n");
  auto c = decode_config({{"dns-cache-size", {"500"}}}, &file);
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->dns_namespaces, (std::vector<std::string>{"demo", "kube-system"}));
  EXPECT_TRUE(c->dns_noendpoints);
  EXPECT_TRUE(c->dns_ignore_empty_service);
  EXPECT_EQ(c->dns_negative_ttl, std::chrono::seconds(30));
  EXPECT_EQ(c->dns_cache_max_ttl, std::chrono::seconds(600));
  EXPECT_EQ(c->dns_cache_denial_max_ttl, std::chrono::seconds(0));
  EXPECT_EQ(c->dns_extra_zones, (std::vector<std::string>{"example.com", "corp.internal"}));
  EXPECT_EQ(c->dns_cache_size, 500u);
  auto d = decode_config({}, nullptr);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->dns_namespaces.empty());
  EXPECT_FALSE(d->dns_noendpoints);
  EXPECT_EQ(d->dns_negative_ttl, std::chrono::seconds(5));
  EXPECT_EQ(d->dns_cache_denial_max_ttl, std::chrono::seconds(1800));
}

TEST(Config, FileErrorsComeBackAsErrorsFromTheCommandLine) {
  TempFile bad_yaml("dataplane: [none\n");
  auto c = run_args({"--config", bad_yaml.path()});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().rfind("config file " + bad_yaml.path() + ": YAML: line ", 0), 0u)
      << c.error();
  c = run_args({"--config", "/nonexistent/endpointd.yaml"});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error(), "config file /nonexistent/endpointd.yaml: cannot be read");
  TempFile unknown("dns-lisen: 127.0.0.1:53\n");
  c = run_args({"--config", unknown.path()});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error(), R"(config file: unknown key "dns-lisen")");
  TempFile empty("");
  c = run_args({"--config", empty.path()});
  ASSERT_TRUE(c) << c.error();
}

}  // namespace
}  // namespace endpointd::daemon
