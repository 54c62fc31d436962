// The option table of `endpointd run`: the flags, the decoder, --write-config-to and README's
// option list are made from it, and README's list is what the table makes.
#include "daemon/options.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "daemon/kubeproxy_config.h"
#include "tests/daemon/run_args.h"

namespace endpointd::daemon {
namespace {

// README.md's block between the markers, or an error saying what is missing.
Result<std::string> readme_block() {
  const std::string path = std::string(ENDPOINTD_SOURCE_DIR) + "/README.md";
  std::ifstream in(path);
  if (!in) return Error{path + ": cannot be read"};
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const std::string begin = std::string(kOptionsBegin) + "\n";
  auto b = readme.find(begin);
  auto e = readme.find(std::string(kOptionsEnd));
  if (b == std::string::npos || e == std::string::npos || e < b + begin.size())
    return Error{path + ": no " + begin + "..." + std::string(kOptionsEnd) + " block"};
  return readme.substr(b + begin.size(), e - b - begin.size());
}

TEST(OptionTable, ReadmeListIsWhatTheTableMakes) {
  auto block = readme_block();
  ASSERT_TRUE(block) << block.error();
  EXPECT_EQ(*block, options_markdown())
      << "README.md's option list is not the table's: run scripts/gen-options after building";
}

TEST(OptionTable, EveryOptionIsAFlagOfRunOnceWithItsDefault) {
  CLI::App app;
  add_run_flags(app);
  std::set<std::string> names;
  for (const Option& o : run_options()) {
    EXPECT_TRUE(names.insert(o.name).second) << o.name << " twice";
    const CLI::Option* flag = app.get_option_no_throw("--" + o.name);
    ASSERT_NE(flag, nullptr) << o.name;
    EXPECT_EQ(flag->get_description(), o.help);
    EXPECT_EQ(flag->get_default_str(), o.default_value) << o.name;
    EXPECT_FALSE(o.help.empty()) << o.name;
    EXPECT_TRUE(o.decode) << o.name;
  }
  // Every flag of run is in the table (but --help).
  EXPECT_EQ(app.get_options().size(), run_options().size() + 1);
}

// Each default, given back as a value, decodes to the configuration no value gives: the table's
// defaults are the Config's.
TEST(OptionTable, DefaultsGivenBackDecodeToTheDefaultConfig) {
  RawFlags given;
  for (const Option& o : run_options())
    if (!o.default_value.empty()) given[o.name] = {o.default_value};
  auto def = decode_config({}, nullptr);
  auto back = decode_config(given, nullptr);
  ASSERT_TRUE(def) << def.error();
  ASSERT_TRUE(back) << back.error();
  auto written_def = testing::write_args({});
  ASSERT_TRUE(written_def) << written_def.error();
  std::vector<std::string> args;
  for (const auto& [name, values] : given) {
    args.push_back("--" + name);
    args.push_back(values[0]);
  }
  auto written_back = testing::write_args(args);
  ASSERT_TRUE(written_back) << written_back.error();
  EXPECT_EQ(*written_back, *written_def);
  EXPECT_EQ(back->drain_peer_port, def->drain_peer_port);
  EXPECT_EQ(back->dns_lameduck, def->dns_lameduck);
  EXPECT_EQ(back->kube_api_protobuf, def->kube_api_protobuf);
  EXPECT_EQ(back->drain_watermark, def->drain_watermark);
}

// --drain-peer-port follows --drain-peer-listen's port unless given: the file written says the
// port the agent would use, so that read back it is the same configuration.
TEST(OptionTable, WrittenConfigKeepsThePeerPortTheListenPortGave) {
  auto text = testing::write_args({"--drain-peer-listen", "0.0.0.0:9500"});
  ASSERT_TRUE(text) << text.error();
  EXPECT_NE(text->find("\ndrain-peer-port: 9500\n"), std::string::npos) << *text;
  testing::TempFile own(*text);
  auto back = testing::run_args({"--config", own.path()});
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(back->drain_peer_port, 9500);
  auto given =
      testing::write_args({"--drain-peer-listen", "0.0.0.0:9500", "--drain-peer-port", "9600"});
  ASSERT_TRUE(given) << given.error();
  EXPECT_NE(given->find("\ndrain-peer-port: 9600\n"), std::string::npos) << *given;
  auto def = testing::write_args({});
  ASSERT_TRUE(def) << def.error();
  EXPECT_NE(def->find("\ndrain-peer-port: 9465\n"), std::string::npos) << *def;
}

// A KubeProxyConfiguration key reaches only the option whose row names it.
TEST(OptionTable, KubeProxyKeysLandOnTheOptionsThatNameThem) {
  YAML::Node kpc = YAML::Load(R"(apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clusterCIDR: 10.244.0.0/16
hostnameOverride: node-a
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [10.0.0.0/8]
detectLocalMode: BridgeInterface
detectLocal:
  bridgeInterface: cbr0
  interfaceNamePrefix: veth
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  contentType: application/json
nftables:
  masqueradeAll: true
logging:
  format: json
conntrack:
  maxPerCore: 1
  min: 2
  tcpEstablishedTimeout: 3s
  tcpCloseWaitTimeout: 4s
  tcpBeLiberal: true
  udpTimeout: 5s
  udpStreamTimeout: 6s
)");
  auto conv = convert_kubeproxy_configuration(kpc);
  ASSERT_TRUE(conv) << conv.error();
  std::set<std::string> mapped;
  for (const auto& s : conv->settings) {
    const Option* o = find_run_option(s.flag);
    ASSERT_NE(o, nullptr) << s.flag;
    EXPECT_NE(o->kube_proxy.find(s.from.substr(0, s.from.find(' '))), std::string::npos)
        << s.from << " -> " << s.flag << ", whose row says " << o->kube_proxy;
    mapped.insert(s.flag);
  }
  for (const Option& o : run_options())
    EXPECT_EQ(mapped.count(o.name), o.kube_proxy.empty() ? 0u : 1u) << o.name;
}

}  // namespace
}  // namespace endpointd::daemon
