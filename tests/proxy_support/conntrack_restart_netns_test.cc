// UDP conntrack entries to an endpoint that left while the agent was down (root, real traffic):
// the real ProxySink + NetlinkBackend in node-1 of a one-node namespace cluster serve a UDP
// ClusterIP with endpoints A and B; a client flow is bound to A; the agent stops (its rules
// stay), A leaves the state, and a new agent's first full sync must delete the entry to A, so
// the client's next datagram on the same 5-tuple reaches B.
//
//   client 192.168.77.100 ── br ── node-1 192.168.77.2: node-1-pod-1 10.244.1.10 (A), -pod-2 .11
//   (B)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "pipeline/ack_board.h"
#include "proxy/conntrack.h"
#include "proxy/netlink.h"
#include "proxy/sink.h"
#include "tests/netns/cluster.h"
#include "tests/netns/fixture.h"
#include "tests/netns/udp_probe.h"
#include "tests/proxy_support/sink_helpers.h"

namespace endpointd::proxy {
namespace {

using namespace std::chrono_literals;
using netns::Cluster;
using netns::ClusterSpec;
using netns::eventually;
using netns::Netns;
using netns::udp_ask;
using netns::udp_socket_in;
using support::ip;

constexpr const char* kVip = "10.96.0.53";
constexpr uint16_t kPort = 53;
constexpr uint16_t kTargetPort = 5353;
constexpr const char* kA = "10.244.1.10";
constexpr const char* kB = "10.244.1.11";

// One agent's dataplane: made inside the node namespace (the netlink socket, the sink's resync
// thread); destroying it leaves the tables in the kernel, as a stopping agent does.
class Agent {
 public:
  explicit Agent(Netns& node) : node_(node), conntrack_(make_netlink_conntrack()) {
    node.run([&] {
      auto b = NetlinkBackend::open();
      if (!b) throw std::runtime_error("netlink backend: " + b.error());
      backend_ = std::move(*b);
      ProxySink::Options o;
      o.node.node_name = "node-1";
      o.node.node_ips = {ip("192.168.77.2")};
      o.node.cluster_cidrs = {*model::IpPrefix::parse("10.244.0.0/16")};
      o.node.ipv6 = false;
      o.conntrack = conntrack_.get();
      o.backoff_min = 20ms;
      sink_ = std::make_unique<ProxySink>(backend_.get(), &board_, o);
    });
  }
  ~Agent() { sink_.reset(); }

  void apply(const model::SnapshotPtr& snap, const model::SnapshotPtr& before) {
    model::Delta d = model::diff(before.get(), *snap);
    node_.run([&] { sink_->apply(snap, d); });
    if (!sink_->wait_idle(5s)) throw std::runtime_error("the agent did not apply");
  }
  ProxySink& sink() { return *sink_; }

 private:
  Netns& node_;
  std::unique_ptr<Conntrack> conntrack_;
  pipeline::AckBoard board_;
  std::unique_ptr<NetlinkBackend> backend_;
  std::unique_ptr<ProxySink> sink_;
};

uint16_t local_port(int fd) {
  sockaddr_in sin{};
  socklen_t len = sizeof sin;
  getsockname(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), &len);
  return ntohs(sin.sin_port);
}

class ConntrackRestartTest : public netns::NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    cluster_ = std::make_unique<Cluster>(ClusterSpec::make(1, 2));
    netns::start_server(cluster_->pod("node-1-pod-1"),
                        {.name = "A", .tcp_port = -1, .udp_port = kTargetPort});
    netns::start_server(cluster_->pod("node-1-pod-2"),
                        {.name = "B", .tcp_port = -1, .udp_port = kTargetPort});
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
    cluster_.reset();
  }
  Netns& node() { return cluster_->node("node-1"); }

  model::SnapshotPtr state(uint64_t g, std::vector<const char*> endpoints) {
    std::vector<model::MergedEndpoint> eps;
    for (const char* e : endpoints) eps.push_back(support::udp_endpoint(e, kTargetPort));
    return support::snapshot(
        g, {support::state(support::udp_service("dns", kVip, kPort), std::move(eps))});
  }

  // The node's UDP entries from the client's `port` whose reply source is `endpoint`.
  int entries(uint16_t port, const char* endpoint) {
    return node().run([&] {
      auto ct = make_netlink_conntrack();
      auto flows = ct->list();
      if (!flows) throw std::runtime_error(flows.error());
      int n = 0;
      for (const auto& f : *flows) {
        n += f.l4proto == IPPROTO_UDP && f.orig_src_port == port && f.orig_dst == ip(kVip) &&
             f.reply_src == ip(endpoint);
      }
      return n;
    });
  }

  std::unique_ptr<Cluster> cluster_;
  std::vector<int> fds_;
};

TEST_F(ConntrackRestartTest, EntriesToAnEndpointThatLeftWhileTheAgentWasDownAreDeleted) {
  auto s1 = state(1, {kA, kB});
  auto agent = std::make_unique<Agent>(node());
  agent->apply(s1, nullptr);

  // Client flows until one is bound to A (each new socket is balanced on its own).
  int to_a = -1;
  for (int i = 0; i < 40 && to_a < 0; ++i) {
    int fd = udp_socket_in(cluster_->client(), kVip, kPort);
    fds_.push_back(fd);
    if (udp_ask(fd, 2000) == "A") to_a = fd;
  }
  ASSERT_GE(to_a, 0) << "no flow was balanced to A";
  uint16_t port = local_port(to_a);
  ASSERT_TRUE(eventually([&] { return entries(port, kA) == 1; }));
  EXPECT_EQ(udp_ask(to_a, 2000), "A");  // the entry keeps the flow on A

  // The agent stops; its rules keep serving. A leaves while no agent runs.
  agent.reset();
  EXPECT_EQ(udp_ask(to_a, 2000), "A");
  auto s2 = state(2, {kB});

  // A new agent starts: its first full sync sweeps the entry to A away.
  agent = std::make_unique<Agent>(node());
  agent->apply(s2, nullptr);
  EXPECT_EQ(entries(port, kA), 0);
  EXPECT_GE(agent->sink().conntrack_deleted(), 1u);
  EXPECT_EQ(agent->sink().conntrack_failures(), 0u);
  // Same socket, same 5-tuple: now DNAT'd to B.
  EXPECT_EQ(udp_ask(to_a, 2000), "B");
  EXPECT_TRUE(eventually([&] { return entries(port, kB) == 1; }));
  agent.reset();
}

// Datagrams to the VIP of a service made while the agent was down leave an entry that is not
// DNAT'd; while it lives, every datagram of that flow bypasses the rules. (With the rules in
// place a service without endpoints rejects, and a rejected datagram leaves no entry.)
TEST_F(ConntrackRestartTest, EntriesMadeBeforeTheServiceWasProgrammedAreDeletedAtStart) {
  // A first agent with no services: its tables (and conntrack in the node) stay after it stops.
  auto first = std::make_unique<Agent>(node());
  first->apply(support::snapshot(1, {}), nullptr);
  first.reset();
  int fd = udp_socket_in(cluster_->client(), kVip, kPort);
  fds_.push_back(fd);
  EXPECT_EQ(udp_ask(fd, 300), "");  // routed on into nothing
  uint16_t port = local_port(fd);
  ASSERT_TRUE(eventually([&] { return entries(port, kVip) == 1; }));  // not DNAT'd

  auto agent = std::make_unique<Agent>(node());
  agent->apply(state(2, {kB}), nullptr);
  EXPECT_EQ(entries(port, kVip), 0);
  EXPECT_EQ(agent->sink().conntrack_deleted(), 1u);
  EXPECT_EQ(udp_ask(fd, 2000), "B");
  agent.reset();
}

}  // namespace
}  // namespace endpointd::proxy
