// KubeProxyConfiguration files: what takes effect in endpointd, what is reported as ignored.
#include "daemon/kubeproxy_config.h"

#include <gtest/gtest.h>

#include "daemon/config.h"
#include "tests/daemon/run_args.h"

namespace endpointd::daemon {
namespace {

// The shape kubeadm writes into kube-system/kube-proxy (key config.conf): every field, most at
// their zero value; here with a cluster CIDR, a mode, conntrack settings and a metrics address
// as clusters commonly set them.
constexpr const char* kKubeadm = R"(apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
configSyncPeriod: 0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 0.0.0.0:10249
mode: nftables
nftables:
  masqueradeAll: true
  masqueradeBit: null
  minSyncPeriod: 1s
  syncPeriod: 30s
nodePortAddresses:
- 192.168.0.0/16
- primary
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
)";

std::vector<std::string> values(const KubeProxyConversion& c, const std::string& flag) {
  auto* s = c.find(flag);
  return s ? s->values : std::vector<std::string>{"<unset>"};
}

KubeProxyConversion convert(const std::string& text) {
  auto c = convert_kubeproxy_configuration(YAML::Load(text));
  EXPECT_TRUE(c) << c.error();
  return c ? *c : KubeProxyConversion{};
}

TEST(KubeProxyConfig, KubeadmFileMapsWhatEndpointdHonours) {
  ASSERT_TRUE(is_kubeproxy_configuration(YAML::Load(kKubeadm)));
  auto c = convert(kKubeadm);

  // Took effect.
  EXPECT_EQ(values(c, "cluster-cidr"),
            (std::vector<std::string>{"10.244.0.0/16", "fd00:10:244::/56"}));
  EXPECT_EQ(values(c, "nodeport-addresses"), (std::vector<std::string>{"192.168.0.0/16"}));
  EXPECT_EQ(values(c, "masquerade-all"), (std::vector<std::string>{"true"}));
  EXPECT_EQ(c.find("masquerade-all")->from, "nftables.masqueradeAll");
  // Empty healthzBindAddress: kube-proxy's default, 0.0.0.0:10256; metricsBindAddress as given
  // (kube-proxy's /metrics there, and endpointd's /debug/state).
  EXPECT_EQ(values(c, "health-listen"), (std::vector<std::string>{"0.0.0.0:10256"}));
  EXPECT_EQ(values(c, "admin-listen"), (std::vector<std::string>{"0.0.0.0:10249"}));
  EXPECT_EQ(values(c, "kubeconfig"),
            (std::vector<std::string>{"/var/lib/kube-proxy/kubeconfig.conf"}));
  EXPECT_EQ(c.find("node-name"), nullptr);  // hostnameOverride empty: $NODE_NAME
  EXPECT_EQ(c.find("log-format"), nullptr);
  EXPECT_EQ(values(c, "conntrack-max-per-core"), std::vector<std::string>{"32768"});
  EXPECT_EQ(values(c, "conntrack-min"), std::vector<std::string>{"131072"});
  EXPECT_EQ(values(c, "conntrack-tcp-timeout-established"), std::vector<std::string>{"24h0m0s"});
  EXPECT_EQ(values(c, "conntrack-tcp-timeout-close-wait"), std::vector<std::string>{"1h0m0s"});
  EXPECT_EQ(c.find("conntrack-udp-timeout"), nullptr);  // 0s: the node's value stays
  EXPECT_EQ(c.find("conntrack-tcp-be-liberal"), nullptr);

  // Reported as ignored: exactly the keys holding something other than kube-proxy's default.
  std::vector<std::string> ignored;
  for (const auto& i : c.ignored) ignored.push_back(i.key);
  std::sort(ignored.begin(), ignored.end());
  EXPECT_EQ(ignored, (std::vector<std::string>{"bindAddress", "nftables.minSyncPeriod",
                                               "nftables.syncPeriod", "nodePortAddresses"}));
  for (const auto& i : c.ignored) {
    EXPECT_FALSE(i.reason.empty()) << i.key;
    if (i.key == "nodePortAddresses") {
      EXPECT_EQ(i.value, "primary");
    }
  }
  EXPECT_FALSE(c.is_ignored("mode"));  // nftables is what endpointd does
  EXPECT_FALSE(c.is_ignored("detectLocalMode"));

  // One log line per key.
  auto lines = c.report();
  EXPECT_EQ(lines.size(), c.settings.size() + c.ignored.size());
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "KubeProxyConfiguration: conntrack.maxPerCore -> "
                      "--conntrack-max-per-core=32768"),
            lines.end());
}

// clientConnection.contentType chooses how EndpointSlice lists are asked for; kubeadm's empty
// value is kube-proxy's default (protobuf) and sets nothing.
TEST(KubeProxyConfig, ContentTypeChoosesHowEndpointSlicesAreListed) {
  EXPECT_EQ(convert(kKubeadm).find("kube-api-content-type"), nullptr);
  auto c = convert(
      "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
      "clientConnection: {contentType: application/json, acceptContentTypes: application/json}\n");
  EXPECT_EQ(values(c, "kube-api-content-type"), std::vector<std::string>{"application/json"});
  EXPECT_EQ(c.find("kube-api-content-type")->from, "clientConnection.contentType");
  EXPECT_FALSE(c.is_ignored("clientConnection.contentType"));
  EXPECT_TRUE(c.is_ignored("clientConnection.acceptContentTypes"));
  // As kube-proxy takes a media type: parameters and case do not matter.
  auto cfg = testing::run_args({"--kube-api-content-type", "Application/JSON; charset=utf-8"});
  ASSERT_TRUE(cfg) << cfg.error();
  EXPECT_FALSE(cfg->kube_api_protobuf);
}

// kubeadm usually writes conntrack as nulls: kube-proxy then writes its own defaults, endpointd
// writes nothing and says so once.
TEST(KubeProxyConfig, NullConntrackValuesAreReportedOnceAndSetNothing) {
  auto c = convert(
      "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
      "conntrack: {maxPerCore: null, min: null, tcpEstablishedTimeout: null,\n"
      "  tcpCloseWaitTimeout: null, tcpBeLiberal: true, udpTimeout: 30s}\n");
  EXPECT_EQ(c.find("conntrack-max-per-core"), nullptr);
  EXPECT_EQ(values(c, "conntrack-tcp-be-liberal"), std::vector<std::string>{"true"});
  EXPECT_EQ(values(c, "conntrack-udp-timeout"), std::vector<std::string>{"30s"});
  ASSERT_TRUE(c.is_ignored("conntrack"));
}

TEST(KubeProxyConfig, ConntrackFlagsAsKubeProxyWritesThem) {
  auto cfg = testing::run_args({"--conntrack-max-per-core", "1000", "--conntrack-min", "5000",
                                "--conntrack-tcp-timeout-established", "24h0m0s",
                                "--conntrack-tcp-timeout-close-wait", "1h",
                                "--conntrack-udp-timeout", "30", "--conntrack-tcp-be-liberal"});
  ASSERT_TRUE(cfg) << cfg.error();
  EXPECT_EQ(cfg->conntrack.max_per_core, 1000u);
  EXPECT_EQ(cfg->conntrack.min, 5000u);
  EXPECT_EQ(cfg->conntrack.tcp_established_timeout, std::chrono::hours(24));
  EXPECT_EQ(cfg->conntrack.tcp_close_wait_timeout, std::chrono::hours(1));
  EXPECT_EQ(cfg->conntrack.udp_timeout, std::chrono::seconds(30));
  EXPECT_FALSE(cfg->conntrack.udp_stream_timeout);
  EXPECT_TRUE(cfg->conntrack.tcp_be_liberal);
  auto none = testing::run_args({});
  ASSERT_TRUE(none) << none.error();
  EXPECT_FALSE(none->conntrack.max_per_core);
  EXPECT_FALSE(none->conntrack.tcp_established_timeout);
  auto bad = testing::run_args({"--conntrack-tcp-timeout-established", "1 day"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--conntrack-tcp-timeout-established: \"1 day\""), std::string::npos)
      << bad.error();
}

TEST(KubeProxyConfig, OtherModesAndDetectionModesAreReported) {
  auto c = convert(R"(apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
detectLocalMode: NodeCIDR
detectLocal:
  interfaceNamePrefix: veth
healthzBindAddress: 10.0.0.5
hostnameOverride: node-a
logging:
  format: json
iptables:
  masqueradeAll: true
)");
  ASSERT_TRUE(c.is_ignored("mode"));
  // The detection modes are mapped to their flags (checked by decode_config).
  EXPECT_FALSE(c.is_ignored("detectLocalMode"));
  EXPECT_FALSE(c.is_ignored("detectLocal.interfaceNamePrefix"));
  EXPECT_EQ(values(c, "detect-local-mode"), (std::vector<std::string>{"NodeCIDR"}));
  EXPECT_EQ(values(c, "pod-interface-name-prefix"), (std::vector<std::string>{"veth"}));
  for (const auto& i : c.ignored)
    if (i.key == "mode") {
      EXPECT_NE(i.reason.find("nftables only"), std::string::npos) << i.reason;
    }
  EXPECT_EQ(values(c, "health-listen"), (std::vector<std::string>{"10.0.0.5:10256"}));
  EXPECT_EQ(values(c, "node-name"), (std::vector<std::string>{"node-a"}));
  EXPECT_EQ(values(c, "log-format"), (std::vector<std::string>{"json"}));
  EXPECT_EQ(values(c, "masquerade-all"), (std::vector<std::string>{"true"}));
  EXPECT_EQ(c.find("cluster-cidr"), nullptr);
}

TEST(KubeProxyConfig, PortZeroTurnsTheHealthServerOffAsInKubeProxy) {
  auto c =
      convert(std::string("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                          "kind: KubeProxyConfiguration\nhealthzBindAddress: '[::]:0'\n"));
  EXPECT_FALSE(c.is_ignored("healthzBindAddress"));
  EXPECT_EQ(values(c, "health-listen"), (std::vector<std::string>{""}));
  // metricsBindAddress unset: kube-proxy's default, loopback.
  EXPECT_EQ(values(c, "admin-listen"), (std::vector<std::string>{"127.0.0.1:10249"}));
}

TEST(KubeProxyConfig, RunConfigFlagTakesTheFileAndFlagsStillWin) {
  testing::TempFile f(kKubeadm);
  // As main.cc does it: the flags on the `run` subcommand, the file read by load_config.
  auto cfg = testing::run_args({"--config", f.path(), "--kubeconfig", "/etc/kube.conf"});
  ASSERT_TRUE(cfg) << cfg.error();
  std::vector<std::string> cidrs, npas;
  for (const auto& p : cfg->cluster_cidr) cidrs.push_back(p.str());
  for (const auto& p : cfg->nodeport_addresses) npas.push_back(p.str());
  EXPECT_EQ(cidrs, (std::vector<std::string>{"10.244.0.0/16", "fd00:10:244::/56"}));
  EXPECT_EQ(npas, (std::vector<std::string>{"192.168.0.0/16"}));
  EXPECT_TRUE(cfg->masquerade_all);
  ASSERT_TRUE(cfg->admin_listen && cfg->health_listen);
  EXPECT_EQ(cfg->health_listen->str(), "0.0.0.0:10256");  // healthzBindAddress ""
  EXPECT_EQ(cfg->admin_listen->str(), "0.0.0.0:10249");   // metricsBindAddress
  EXPECT_EQ(cfg->kubeconfig, "/etc/kube.conf");           // the command line wins over the file
  // The report rides along, to be logged once logging is set up: what took effect (info),
  // then what was ignored (warn).
  auto conv = convert(kKubeadm);
  auto lines = conv.report();
  ASSERT_EQ(cfg->notes.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(cfg->notes[i].line, lines[i]);
    EXPECT_EQ(cfg->notes[i].warning, i >= conv.settings.size()) << lines[i];
  }
}

// --write-config-to: a kubeadm cluster's kube-proxy config, with a flag on top, becomes
// endpointd's own config file holding every setting; read back it is the same configuration,
// and written out again the same text.
TEST(KubeProxyConfig, WriteConfigToTurnsAKubeProxyConfigIntoEndpointdsOwn) {
  testing::TempFile kpc(kKubeadm);
  auto text = testing::write_args({"--config", kpc.path(), "--dns-ttl", "7"});
  ASSERT_TRUE(text) << text.error();
  for (const char* line :
       {"cluster-cidr: [10.244.0.0/16, fd00:10:244::/56]\n", "masquerade-all: true\n",
        "admin-listen: 0.0.0.0:10249\n", "conntrack-max-per-core: 32768\n",
        "conntrack-tcp-timeout-established: 24h0m0s\n", "dns-ttl: 7\n", "dataplane: nftables\n",
        "# dns-listen: (not set)\n", "drain-peer-insecure: false\n"})
    EXPECT_NE(text->find(line), std::string::npos) << line << " not in\n" << *text;
  // Not settings: the file itself and the one-shot actions.
  for (const char* key : {"\nconfig:", "\nwrite-config-to", "cleanup", "init-only"})
    EXPECT_EQ(text->find(key), std::string::npos) << key;

  testing::TempFile own(*text);
  auto back = testing::run_args({"--config", own.path()});
  auto orig = testing::run_args({"--config", kpc.path(), "--dns-ttl", "7"});
  ASSERT_TRUE(back) << back.error();
  ASSERT_TRUE(orig) << orig.error();
  EXPECT_TRUE(back->notes.empty());  // endpointd's own keys: nothing to report
  auto strs = [](const std::vector<model::IpPrefix>& v) {
    std::vector<std::string> out;
    for (const auto& p : v) out.push_back(p.str());
    return out;
  };
  EXPECT_EQ(strs(back->cluster_cidr), strs(orig->cluster_cidr));
  EXPECT_EQ(strs(back->nodeport_addresses), strs(orig->nodeport_addresses));
  EXPECT_EQ(back->masquerade_all, orig->masquerade_all);
  EXPECT_EQ(back->admin_listen->str(), orig->admin_listen->str());
  EXPECT_EQ(back->health_listen->str(), orig->health_listen->str());
  EXPECT_EQ(back->kubeconfig, orig->kubeconfig);
  EXPECT_EQ(back->dns_ttl, orig->dns_ttl);
  EXPECT_EQ(back->conntrack.max_per_core, orig->conntrack.max_per_core);
  EXPECT_EQ(back->conntrack.tcp_established_timeout, orig->conntrack.tcp_established_timeout);
  EXPECT_EQ(back->drain_peer_listen->str(), orig->drain_peer_listen->str());
  EXPECT_EQ(back->dataplane, orig->dataplane);

  auto again = testing::write_args({"--config", own.path()});
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(*again, *text);

  // A configuration `run` refuses is not written: the same error.
  auto bad = testing::write_args({"--dns-ttl", "9000"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--dns-ttl"), std::string::npos) << bad.error();
}

TEST(KubeProxyConfig, RunSubcommandAppliesAPlainConfigFileAndRejectsUnknownKeys) {
  testing::TempFile good(
      "dataplane: none\nadmin-listen: 0.0.0.0:10256\ncluster-cidr: [10.244.0.0/16]\n"
      "masquerade-all: true\n");
  auto cfg = testing::run_args({"--config", good.path(), "--dataplane", "nftables"});
  ASSERT_TRUE(cfg) << cfg.error();
  EXPECT_EQ(cfg->dataplane, Dataplane::kNftables);
  EXPECT_EQ(cfg->admin_listen->str(), "0.0.0.0:10256");
  ASSERT_EQ(cfg->cluster_cidr.size(), 1u);
  EXPECT_EQ(cfg->cluster_cidr[0].str(), "10.244.0.0/16");
  EXPECT_TRUE(cfg->masquerade_all);
  EXPECT_TRUE(cfg->notes.empty());  // not a KubeProxyConfiguration: nothing to report
  testing::TempFile unknown("dns-lisen: 127.0.0.1:53\n");
  auto bad = testing::run_args({"--config", unknown.path()});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("dns-lisen"), std::string::npos) << bad.error();
  testing::TempFile badv("dataplane: iptables\n");
  auto badval = testing::run_args({"--config", badv.path()});
  ASSERT_FALSE(badval);
  EXPECT_EQ(badval.error(), R"(config file key dataplane: "iptables" is not one of nftables|none)");
}

// Found by fuzz_config: a section that is a scalar, or a key that is not one, was an exception
// out of the conversion (std::terminate in `endpointd run --config`). Now the scalar sections
// are sections without the keys endpointd reads, and odd keys are reported by their YAML form.
// A key that is no field of the kind is an error that names it, not a warning, so that a typo
// never silently changes nothing (kube-proxy falls back to lenient decoding and logs it).
TEST(KubeProxyConfig, MisspelledKeyIsAnErrorNamingIt) {
  for (auto [body, key] :
       {std::pair{"masqueradeAl: true\n", "masqueradeAl"},
        {"nftables:\n  masqueradAll: true\n", "nftables.masqueradAll"},
        {"conntrack:\n  maxPerCor: 1\n", "conntrack.maxPerCor"},
        {"detectLocal: {bridgeInterfaces: br0}\n", "detectLocal.bridgeInterfaces"}}) {
    auto c = convert_kubeproxy_configuration(
        YAML::Load(std::string("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                               "kind: KubeProxyConfiguration\n") +
                   body));
    ASSERT_FALSE(c) << body;
    EXPECT_EQ(c.error(), std::string("KubeProxyConfiguration key ") + key +
                             ": not a field of kubeproxy.config.k8s.io/v1alpha1 "
                             "KubeProxyConfiguration (misspelled?)");
  }
  // Free-form maps stay free.
  EXPECT_TRUE(convert_kubeproxy_configuration(
      YAML::Load("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
                 "featureGates: {AnyGate: true}\nlogging: {options: {json: {x: 1}}}\n")));
}

TEST(KubeProxyConfig, OddShapesAreReadNotThrown) {
  for (const char* body : {"iptables: x\n", "nftables: 3\n", "clientConnection: y\n",
                           "logging: x\n", "[a, b]: 1\n", "conntrack: {[a]: 1}\n"}) {
    std::string yaml = std::string(
                           "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                           "kind: KubeProxyConfiguration\n") +
                       body;
    YAML::Node root = YAML::Load(yaml);
    EXPECT_NO_THROW({
      auto c = convert_kubeproxy_configuration(root);
      (void)c;
    }) << body;
  }
}

}  // namespace
}  // namespace endpointd::daemon
