// Node-local DNS end to end: `endpointd run` in a node namespace (with only the capabilities
// the chart gives it) answers a pod's dig on 169.254.20.10, and conntrack in the node has no
// entry for those queries, while the same server on the node's own address (10.244.1.1, the
// control) leaves one per query. Plus the option's checks (no root).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "daemon/config.h"
#include "tests/netns/cluster.h"
#include "tests/netns/fixture.h"

namespace endpointd::netns {
namespace {

constexpr const char* kNodeLocal = "169.254.20.10";
constexpr const char* kNodeAddr = "10.244.1.1";  // node-1's address on its pod veths
constexpr const char* kName = "web.demo.svc.cluster.local";

// Conntrack entries in `ns` for `proto` whose line mentions `needle`.
int conntrack_entries(Netns& ns, const std::string& proto, const std::string& needle) {
  auto r = ns.exec({"conntrack", "-L", "-p", proto});
  int n = 0;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("src=") != std::string::npos && line.find(needle) != std::string::npos) ++n;
  }
  return n;
}

std::string dig(Netns& from, const std::string& server, bool tcp) {
  std::vector<std::string> argv = {"dig", "@" + server, "+time=1", "+tries=1", "+short"};
  if (tcp) argv.push_back("+tcp");
  argv.insert(argv.end(), {kName, "A"});
  return from.exec(argv).output;
}

class DnsNodeLocalNetns : public NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    cluster_ = std::make_unique<Cluster>(ClusterSpec::make(1, 1));
    dir_ = scratch_dir() + "/dns-node-local";
    std::filesystem::create_directories(dir_ + "/manifests");
    std::ofstream(dir_ + "/manifests/web.yaml") << R"(kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 8080}]}
---
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.1.10]
---
kind: Node
metadata: {name: node-1}
)";
    // The chart's capabilities: NET_ADMIN, and NET_BIND_SERVICE for port 53.
    agent_ = &node().spawn({"setpriv",
                            "--bounding-set",
                            "-all,+net_admin,+net_bind_service",
                            "--",
                            ENDPOINTD_BIN,
                            "run",
                            "--source-dir",
                            dir_ + "/manifests",
                            "--node-name",
                            "node-1",
                            "--dataplane",
                            "nftables",
                            "--cluster-cidr",
                            "10.244.0.0/16",
                            "--dns-listen",
                            std::string(kNodeAddr) + ":53",
                            "--dns-node-local-address",
                            kNodeLocal,
                            "--dns-upstream",
                            "127.0.0.1:9",
                            "--dns-lameduck",
                            "0",
                            "--drain-socket",
                            dir_ + "/drain.sock",
                            "--drain-peer-listen",
                            ""},
                           "endpointd-node-local");
  }
  void TearDown() override {
    cluster_.reset();  // stops the agent with its namespace
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  Netns& node() { return cluster_->node("node-1"); }
  Netns& pod() { return cluster_->pod("node-1-pod-1"); }

  std::unique_ptr<Cluster> cluster_;
  std::string dir_;
  Process* agent_ = nullptr;
};

TEST_F(DnsNodeLocalNetns, AnswersOnTheLinkLocalAddressWithoutConntrack) {
  ASSERT_TRUE(eventually([&] { return dig(pod(), kNodeLocal, false) == "10.96.0.10\n"; },
                         std::chrono::seconds(20)))
      << agent_->log();
  // The address is on endpointd's dummy interface (on lo where the kernel has no dummy
  // driver), and the notrack chains are in endpointd's table.
  bool has_dummy = node().exec({"ip", "link", "add", "epd-probe", "type", "dummy"}).ok();
  if (has_dummy) node().exec({"ip", "link", "del", "epd-probe"});
  std::string on = has_dummy ? "endpointd-dns" : "lo";
  EXPECT_NE(node().ip({"-4", "addr", "show", "dev", on}).find(std::string(kNodeLocal) + "/32"),
            std::string::npos)
      << on;
  std::string table = node().exec_checked({"nft", "list", "table", "ip", "endpointd"});
  for (const char* want : {"chain dns-notrack-prerouting", "chain dns-notrack-output",
                           "type filter hook prerouting priority raw; policy accept;",
                           "ip daddr 169.254.20.10 udp dport 53 notrack",
                           "ip daddr 169.254.20.10 tcp dport 53 notrack",
                           "ip saddr 169.254.20.10 udp sport 53 notrack",
                           "ip saddr 169.254.20.10 tcp sport 53 notrack"})
    EXPECT_NE(table.find(want), std::string::npos) << want << "\n" << table;

  node().exec_checked({"conntrack", "-F"});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dig(pod(), kNodeLocal, false), "10.96.0.10\n");
  for (int i = 0; i < 2; ++i) EXPECT_EQ(dig(pod(), kNodeLocal, true), "10.96.0.10\n");
  // The control: the same server on the node's own address, tracked as usual.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dig(pod(), kNodeAddr, false), "10.96.0.10\n");
  EXPECT_EQ(dig(pod(), kNodeAddr, true), "10.96.0.10\n");

  int local_udp = conntrack_entries(node(), "udp", kNodeLocal);
  int local_tcp = conntrack_entries(node(), "tcp", kNodeLocal);
  int control_udp = conntrack_entries(node(), "udp", std::string("dst=") + kNodeAddr);
  int control_tcp = conntrack_entries(node(), "tcp", std::string("dst=") + kNodeAddr);
  std::cout << "conntrack entries: node-local udp " << local_udp << " tcp " << local_tcp
            << "; control udp " << control_udp << " tcp " << control_tcp << "\n";
  EXPECT_EQ(local_udp, 0);
  EXPECT_EQ(local_tcp, 0);
  EXPECT_GE(control_udp, 5) << "a query dig sends from a new port each time is one entry";
  EXPECT_GE(control_tcp, 1);

  // Both addresses answer from the one zone the sink builds: an edit reaches them together.
  {
    std::string yaml;
    {
      std::ifstream in(dir_ + "/manifests/web.yaml");
      yaml.assign(std::istreambuf_iterator<char>(in), {});
    }
    yaml.replace(yaml.find("10.96.0.10"), 10, "10.96.0.11");
    std::ofstream(dir_ + "/manifests/web.yaml.tmp") << yaml;
    std::filesystem::rename(dir_ + "/manifests/web.yaml.tmp", dir_ + "/manifests/web.yaml");
  }
  ASSERT_TRUE(eventually([&] { return dig(pod(), kNodeLocal, false) == "10.96.0.11\n"; },
                         std::chrono::seconds(5)));
  EXPECT_EQ(dig(pod(), kNodeAddr, false), "10.96.0.11\n");
  EXPECT_EQ(dig(pod(), kNodeLocal, true), "10.96.0.11\n");

  // Someone takes the address off the node: the agent puts it back and answers on it again.
  ASSERT_TRUE(node().exec({"ip", "addr", "del", std::string(kNodeLocal) + "/32", "dev", on}).ok());
  EXPECT_TRUE(eventually([&] { return dig(pod(), kNodeLocal, false) == "10.96.0.11\n"; },
                         std::chrono::seconds(5)))
      << agent_->log();
  EXPECT_NE(agent_->log().find("was taken off the node; put back on " + on), std::string::npos)
      << agent_->log();

  // `run --cleanup` with the same settings takes the address off the node with the tables.
  agent_->stop();
  auto cleanup =
      node().exec({ENDPOINTD_BIN, "run", "--cleanup", "--dns-listen",
                   std::string(kNodeAddr) + ":53", "--dns-node-local-address", kNodeLocal});
  EXPECT_TRUE(cleanup.ok()) << cleanup.output;
  EXPECT_EQ(node().ip({"-4", "addr", "show"}).find(std::string(kNodeLocal) + "/32"),
            std::string::npos);
  EXPECT_EQ(node().ip({"link", "show"}).find("endpointd-dns"), std::string::npos);
  EXPECT_FALSE(node().exec({"nft", "list", "table", "ip", "endpointd"}).ok());
}

Result<daemon::Config> decode(const std::map<std::string, std::string>& flags) {
  daemon::RawFlags raw;
  for (const auto& [k, v] : flags) raw[k] = {v};
  return daemon::decode_config(raw, nullptr);
}

TEST(DnsNodeLocalConfig, OffByDefaultAndCheckedWhenGiven) {
  auto off = decode({{"dns-listen", "0.0.0.0:53"}});
  ASSERT_TRUE(off) << off.error();
  EXPECT_FALSE(off->dns_node_local_address);

  auto on = decode({{"dns-listen", "10.0.0.1:53"}, {"dns-node-local-address", "169.254.20.10"}});
  ASSERT_TRUE(on) << on.error();
  EXPECT_EQ(on->dns_node_local_address->str(), "169.254.20.10");
  // IPv6 has no link-local address pods can route to: a unique local one.
  auto v6 = decode({{"dns-listen", "[::]:53"}, {"dns-node-local-address", "fd00::10"}});
  ASSERT_TRUE(v6) << v6.error();

  struct Bad {
    std::map<std::string, std::string> flags;
    std::string error;
  };
  for (const auto& b : std::vector<Bad>{
           {{{"dns-listen", "0.0.0.0:53"}, {"dns-node-local-address", "dns.local"}},
            "--dns-node-local-address: \"dns.local\" is not an IP address"},
           {{{"dns-listen", "0.0.0.0:53"}, {"dns-node-local-address", "fe80::10"}},
            "is IPv6 link-local"},
           {{{"dns-listen", "0.0.0.0:53"}, {"dns-node-local-address", "127.0.0.53"}},
            "is not a unicast address pods can reach"},
           {{{"dns-listen", "0.0.0.0:53"}, {"dns-node-local-address", "224.0.0.251"}},
            "is not a unicast address pods can reach"},
           {{{"dns-node-local-address", "169.254.20.10"}}, "needs --dns-listen"},
           {{{"dns-listen", "10.0.0.1:0"}, {"dns-node-local-address", "169.254.20.10"}},
            "needs a fixed --dns-listen port"},
       }) {
    auto r = decode(b.flags);
    ASSERT_FALSE(r) << b.error;
    EXPECT_NE(r.error().find(b.error), std::string::npos) << r.error();
  }
  // The config file key, named as such.
  YAML::Node file = YAML::Load("dns-listen: 0.0.0.0:53\ndns-node-local-address: nope\n");
  auto f = daemon::decode_config({}, &file);
  ASSERT_FALSE(f);
  EXPECT_NE(f.error().find("config file key dns-node-local-address: \"nope\""), std::string::npos)
      << f.error();
}

}  // namespace
}  // namespace endpointd::netns
