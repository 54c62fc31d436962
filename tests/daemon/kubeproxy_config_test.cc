// KubeProxyConfiguration files: what takes effect in endpointd, what is reported as ignored.
#include "daemon/kubeproxy_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fstream>

#include "daemon/config.h"

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
showHiddenMetricsForPorts: ""
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

TEST(KubeProxyConfig, KubeadmFileMapsWhatEndpointdHonours) {
  auto root = YAML::Load(kKubeadm);
  ASSERT_TRUE(is_kubeproxy_configuration(root));
  auto c = convert_kubeproxy_configuration(root);
  ASSERT_EQ(c.error, "");

  // Took effect.
  EXPECT_EQ(values(c, "cluster-cidr"),
            (std::vector<std::string>{"10.244.0.0/16", "fd00:10:244::/56"}));
  EXPECT_EQ(values(c, "nodeport-addresses"), (std::vector<std::string>{"192.168.0.0/16"}));
  EXPECT_EQ(values(c, "masquerade-all"), (std::vector<std::string>{"true"}));
  EXPECT_EQ(c.find("masquerade-all")->from, "nftables.masqueradeAll");
  // Empty healthzBindAddress: kube-proxy's default, 0.0.0.0:10256.
  EXPECT_EQ(values(c, "admin-listen"), (std::vector<std::string>{"0.0.0.0:10256"}));
  EXPECT_EQ(values(c, "kubeconfig"),
            (std::vector<std::string>{"/var/lib/kube-proxy/kubeconfig.conf"}));
  EXPECT_EQ(c.find("node-name"), nullptr);  // hostnameOverride empty: $NODE_NAME
  EXPECT_EQ(c.find("log-format"), nullptr);

  // Reported as ignored: exactly the keys holding something other than kube-proxy's default.
  std::vector<std::string> ignored;
  for (const auto& i : c.ignored) ignored.push_back(i.key);
  std::sort(ignored.begin(), ignored.end());
  EXPECT_EQ(ignored, (std::vector<std::string>{"bindAddress", "conntrack.maxPerCore",
                                               "conntrack.min", "conntrack.tcpCloseWaitTimeout",
                                               "conntrack.tcpEstablishedTimeout",
                                               "metricsBindAddress", "nftables.minSyncPeriod",
                                               "nftables.syncPeriod", "nodePortAddresses"}));
  for (const auto& i : c.ignored) {
    EXPECT_FALSE(i.reason.empty()) << i.key;
    if (i.key == "nodePortAddresses") {
      EXPECT_EQ(i.value, "primary");
    }
    if (i.key == "metricsBindAddress") {
      EXPECT_NE(i.reason.find("/metrics"), std::string::npos);
    }
    if (i.key.rfind("conntrack.", 0) == 0) {
      EXPECT_NE(i.reason.find("nf_conntrack"), std::string::npos);
    }
  }
  EXPECT_FALSE(c.is_ignored("mode"));  // nftables is what endpointd does
  EXPECT_FALSE(c.is_ignored("detectLocalMode"));

  // One log line per key.
  auto lines = c.report();
  EXPECT_EQ(lines.size(), c.settings.size() + c.ignored.size());
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "KubeProxyConfiguration: ignored conntrack.maxPerCore (32768): " +
                          c.ignored[std::distance(c.ignored.begin(),
                                                  std::find_if(c.ignored.begin(), c.ignored.end(),
                                                               [](auto& i) {
                                                                 return i.key ==
                                                                        "conntrack.maxPerCore";
                                                               }))]
                              .reason),
            lines.end());
}

TEST(KubeProxyConfig, OtherModesAndDetectionModesAreReported) {
  auto c =
      convert_kubeproxy_configuration(YAML::Load(R"(apiVersion: kubeproxy.config.k8s.io/v1alpha1
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
)"));
  ASSERT_EQ(c.error, "");
  ASSERT_TRUE(c.is_ignored("mode"));
  EXPECT_TRUE(c.is_ignored("detectLocalMode"));
  EXPECT_TRUE(c.is_ignored("detectLocal.interfaceNamePrefix"));
  for (const auto& i : c.ignored)
    if (i.key == "mode") {
      EXPECT_NE(i.reason.find("nftables only"), std::string::npos) << i.reason;
    }
  EXPECT_EQ(values(c, "admin-listen"), (std::vector<std::string>{"10.0.0.5:10256"}));
  EXPECT_EQ(values(c, "node-name"), (std::vector<std::string>{"node-a"}));
  EXPECT_EQ(values(c, "log-format"), (std::vector<std::string>{"json"}));
  EXPECT_EQ(values(c, "masquerade-all"), (std::vector<std::string>{"true"}));
  EXPECT_EQ(c.find("cluster-cidr"), nullptr);
}

TEST(KubeProxyConfig, BadValuesAndVersionsAreErrorsNamingTheKey) {
  auto bad = [](const std::string& extra) {
    return convert_kubeproxy_configuration(
               YAML::Load(
                   "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
                   extra))
        .error;
  };
  EXPECT_NE(bad("clusterCIDR: 10.244.0.0/33\n").find("clusterCIDR"), std::string::npos);
  EXPECT_NE(bad("nodePortAddresses: [nope]\n").find("nodePortAddresses"), std::string::npos);
  EXPECT_NE(bad("healthzBindAddress: x:y\n").find("healthzBindAddress"), std::string::npos);
  EXPECT_EQ(bad("healthzBindAddress: '[::]:10256'\n"), "");
  auto v2 = convert_kubeproxy_configuration(
      YAML::Load("apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n"));
  EXPECT_NE(v2.error.find("apiVersion"), std::string::npos);
}

TEST(KubeProxyConfig, RunConfigFlagTakesTheFileAndFlagsStillWin) {
  char path[] = "/tmp/endpointd-kpc-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << kKubeadm;
  // As main.cc does it: the flags on the `run` subcommand (CLI11 reads a subcommand's
  // --config file only through add_run_flags' callback).
  Config cfg;
  CLI::App app;
  add_run_flags(*app.add_subcommand("run"), cfg);
  std::vector<const char*> argv = {"endpointd", "run",          "--config",
                                   path,        "--kubeconfig", "/etc/kube.conf"};
  std::string error;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    error = e.what();
  }
  unlink(path);
  ASSERT_EQ(error, "");
  EXPECT_EQ(cfg.cluster_cidr, (std::vector<std::string>{"10.244.0.0/16", "fd00:10:244::/56"}));
  EXPECT_EQ(cfg.nodeport_addresses, (std::vector<std::string>{"192.168.0.0/16"}));
  EXPECT_TRUE(cfg.masquerade_all);
  EXPECT_EQ(cfg.admin_listen, "0.0.0.0:10256");
  EXPECT_EQ(cfg.kubeconfig, "/etc/kube.conf");  // the command line wins over the file
  EXPECT_EQ(validate(cfg), "");
}

TEST(KubeProxyConfig, RunSubcommandAppliesAPlainConfigFileAndRejectsUnknownKeys) {
  auto run = [](const std::string& text, std::vector<std::string> extra, Config* cfg) {
    char path[] = "/tmp/endpointd-cfg-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    std::ofstream(path) << text;
    CLI::App app;
    add_run_flags(*app.add_subcommand("run"), *cfg);
    std::vector<std::string> args = {"endpointd", "run", "--config", path};
    for (auto& e : extra) args.push_back(e);
    std::vector<const char*> argv;
    for (auto& a : args) argv.push_back(a.c_str());
    std::string error;
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      error = e.what();
    }
    unlink(path);
    return error;
  };
  Config cfg;
  EXPECT_EQ(run("dataplane: none\nadmin-listen: 0.0.0.0:10256\ncluster-cidr: "
                "[10.244.0.0/16]\nmasquerade-all: true\n",
                {"--dataplane", "nftables"}, &cfg),
            "");
  EXPECT_EQ(cfg.dataplane, "nftables");
  EXPECT_EQ(cfg.admin_listen, "0.0.0.0:10256");
  EXPECT_EQ(cfg.cluster_cidr, (std::vector<std::string>{"10.244.0.0/16"}));
  EXPECT_TRUE(cfg.masquerade_all);
  Config bad;
  EXPECT_NE(run("dns-lisen: 127.0.0.1:53\n", {}, &bad).find("dns-lisen"), std::string::npos);
  Config badv;
  EXPECT_NE(run("dataplane: iptables\n", {}, &badv), "");
}

}  // namespace
}  // namespace endpointd::daemon
