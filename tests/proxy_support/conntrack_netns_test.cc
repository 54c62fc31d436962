// The netlink conntrack implementation against the kernel, in a one-node namespace cluster
// (node-1 with pods 10.244.1.10 and 10.244.1.11): real flows through a DNAT rule set up with
// nft in the node, counted and deleted by endpointd, checked with the conntrack CLI.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "proxy/conntrack.h"
#include "tests/netns/cluster.h"
#include "tests/netns/fixture.h"
#include "tests/netns/udp_probe.h"

namespace endpointd::proxy {
namespace {

using netns::Cluster;
using netns::ClusterSpec;
using netns::eventually;
using netns::LoadClient;
using netns::Netns;
using netns::udp_ask;
using netns::udp_socket_in;

model::IpAddr ip(const char* s) {
  return *model::IpAddr::parse(s);
}

constexpr const char* kClient = "10.244.1.10";
constexpr const char* kBackend = "10.244.1.11";
constexpr const char* kVip = "10.96.0.53";

// The node's test ruleset: conntrack on for forwarded traffic, and (optionally) the DNAT a
// proxy would program for VIP:53/udp and VIP:80/tcp.
void load_ruleset(Netns& node, bool with_dnat) {
  node.exec({"nft", "delete", "table", "ip", "epd_test"});
  std::string rules =
      "add table ip epd_test\n"
      "add chain ip epd_test natpre { type nat hook prerouting priority dstnat; }\n"
      "add chain ip epd_test filterfwd { type filter hook forward priority 0; }\n"
      "add rule ip epd_test filterfwd ct state established,related counter accept\n";
  if (with_dnat) {
    rules += std::string("add rule ip epd_test natpre ip daddr ") + kVip +
             " udp dport 53 dnat to " + kBackend + ":5353\n";
    rules += std::string("add rule ip epd_test natpre ip daddr ") + kVip +
             " tcp dport 80 dnat to " + kBackend + ":8080\n";
  }
  std::string path = netns::scratch_dir() + "/" + node.name() + "-rules.nft";
  { std::ofstream(path) << rules; }
  node.exec_checked({"nft", "-f", path});
}

// Entries the conntrack CLI shows in `ns` for `proto` whose text contains `needle`.
int cli_entries(Netns& ns, const std::string& proto, const std::string& needle) {
  auto r = ns.exec({"conntrack", "-L", "-p", proto});
  int n = 0;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("src=") != std::string::npos && line.find(needle) != std::string::npos) ++n;
  }
  return n;
}

sockaddr_in sockaddr_of(const char* addr, uint16_t port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  inet_pton(AF_INET, addr, &sin.sin_addr);
  return sin;
}

class ConntrackNetnsTest : public netns::NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    cluster_ = std::make_unique<Cluster>(ClusterSpec::make(1, 2));
    server_ = netns::start_server(cluster_->pod("node-1-pod-2"),
                                  {.name = "backend", .tcp_port = 8080, .udp_port = 5353});
  }
  void TearDown() override { cluster_.reset(); }
  Netns& node() { return cluster_->node("node-1"); }
  Netns& client() { return cluster_->pod("node-1-pod-1"); }
  Result<FlowCount> count_in_node(const char* endpoint) {
    return node().run([&] { return ct_->count_flows_to(ip(endpoint)); });
  }

  std::unique_ptr<Cluster> cluster_;
  netns::Server server_;
  std::unique_ptr<Conntrack> ct_ = make_netlink_conntrack();
};

TEST_F(ConntrackNetnsTest, DeletesUdpEntriesOfALeavingEndpoint) {
  load_ruleset(node(), /*with_dnat=*/true);
  // Five UDP flows (a new socket each) through the VIP, and one TCP connection.
  LoadClient udp(client(),
                 {.target = std::string(kVip) + ":53", .udp = true, .count = 5, .interval_ms = 0});
  auto r = udp.wait();
  ASSERT_EQ(r.ok, 5) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.by_backend["backend"], 5);
  LoadClient web(client(), {.target = std::string(kVip) + ":80",
                            .keepalive = true,
                            .duration_ms = 4000,
                            .interval_ms = 50});

  ASSERT_TRUE(eventually([&] {
    auto c = count_in_node(kBackend);
    return c && c->udp == 5 && c->tcp_established == 1;
  }));
  EXPECT_EQ(cli_entries(node(), "udp", std::string("src=") + kBackend), 5);

  // The other port of the endpoint matches nothing.
  std::vector<FlowMatch> other_port = {udp_to_endpoint(ip(kBackend), 53)};
  auto none = node().run([&] { return ct_->delete_flows(other_port); });
  ASSERT_TRUE(none) << none.error();
  EXPECT_EQ(none->total(), 0u);

  std::vector<FlowMatch> leaving = {udp_to_endpoint(ip(kBackend), 5353)};
  auto deleted = node().run([&] { return ct_->delete_flows(leaving); });
  ASSERT_TRUE(deleted) << deleted.error();
  EXPECT_EQ(deleted->ipv4, 5u);
  EXPECT_EQ(deleted->ipv6, 0u);
  EXPECT_EQ(cli_entries(node(), "udp", std::string("src=") + kBackend), 0);
  // The TCP connection to the same endpoint is untouched and still serving.
  EXPECT_EQ(cli_entries(node(), "tcp", "ESTABLISHED"), 1);
  auto c = count_in_node(kBackend);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->tcp_established, 1u);
  EXPECT_EQ(c->udp, 0u);
  auto w = web.stop();
  EXPECT_EQ(w.failed, 0);
  EXPECT_GT(w.ok, 0);
}

TEST_F(ConntrackNetnsTest, DeletingBlackholedServiceEntriesLetsTheClientReachNewEndpoints) {
  load_ruleset(node(), /*with_dnat=*/false);  // the service has no endpoints yet
  int fd = udp_socket_in(client(), kVip, 53);
  EXPECT_EQ(udp_ask(fd, 200), "");
  auto vip_entries = [&] {
    // Counted inside the thread: GCC 12 misreports moving a Result<vector> out of run().
    return node().run([&] {
      int n = 0;
      auto flows = ct_->list();
      if (flows) {
        for (const auto& f : *flows) n += f.l4proto == IPPROTO_UDP && f.orig_dst == ip(kVip);
      }
      return n;
    });
  };
  ASSERT_TRUE(eventually([&] { return vip_entries() == 1; }));

  // Endpoints arrive; the old entry still binds this client's flow to nothing.
  load_ruleset(node(), /*with_dnat=*/true);
  EXPECT_EQ(udp_ask(fd, 300), "");

  std::vector<FlowMatch> blackholed = {udp_to_service(ip(kVip), 53)};
  auto deleted = node().run([&] { return ct_->delete_flows(blackholed); });
  ASSERT_TRUE(deleted) << deleted.error();
  EXPECT_EQ(deleted->total(), 1u);
  EXPECT_EQ(udp_ask(fd, 2000), "backend");
  close(fd);
}

TEST_F(ConntrackNetnsTest, CountsEstablishedTcpConnectionsUntilTheyClose) {
  load_ruleset(node(), /*with_dnat=*/true);
  // Three direct connections to the pod and two through the VIP.
  std::vector<int> fds = client().run([&] {
    std::vector<int> out;
    for (int i = 0; i < 5; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in sin = i < 3 ? sockaddr_of(kBackend, 8080) : sockaddr_of(kVip, 80);
      if (connect(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), sizeof sin) != 0) {
        throw std::runtime_error("connect failed");
      }
      out.push_back(fd);
    }
    return out;
  });
  ASSERT_TRUE(eventually([&] {
    auto c = count_in_node(kBackend);
    return c && c->tcp_established == 5;
  }));
  EXPECT_EQ(cli_entries(node(), "tcp", "ESTABLISHED"), 5);
  auto other = count_in_node(kClient);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->live(), 0u);  // the client is never a reply source here
  // Counted for several endpoints in one walk: the same numbers.
  size_t established_each = node().run([&] {
    auto each = ct_->count_flows_to_each({ip(kClient), ip(kBackend)});
    return each ? (*each)[0].live() * 1000 + (*each)[1].tcp_established : 999999;
  });
  EXPECT_EQ(established_each, 5u);

  for (int fd : fds) close(fd);
  EXPECT_TRUE(eventually([&] {
    auto c = count_in_node(kBackend);
    return c && c->live() == 0;
  }));
}

}  // namespace
}  // namespace endpointd::proxy
