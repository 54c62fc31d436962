// Real traffic through endpointd's dataplane in a two-node namespace cluster: every node runs
// the real ProxySink + NetlinkBackend (opened inside the node namespace), fed snapshots built
// here; pods run endpointd-testserver, which answers with its name and logs each peer.
//
//   client 192.168.77.100 ── br ── node-1 192.168.77.2 (zone-a): node-1-pod-1 10.244.1.10, -pod-2
//   .11
//                                └─ node-2 192.168.77.3 (zone-b): node-2-pod-1 10.244.2.10, -pod-2
//                                .11
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/ack_board.h"
#include "proxy/address_monitor.h"
#include "proxy/conntrack.h"
#include "proxy/dataplane.h"
#include "proxy/netlink.h"
#include "proxy/sink.h"
#include "tests/netns/cluster.h"
#include "tests/netns/fixture.h"
#include "tests/proxy/fixtures.h"

namespace endpointd::proxy {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using netns::Cluster;
using netns::ClusterSpec;
using netns::Netns;
using testing::ip;
using testing::prefix;

// ---- clients (run inside a namespace through Netns::run) ----

struct Reply {
  int err = 0;       // 0, or the errno of the failure (ETIMEDOUT: nothing came back in time)
  std::string name;  // the answering server's name
  Clock::duration took{};
};

socklen_t make_sockaddr(const std::string& addr, uint16_t port, sockaddr_storage* ss) {
  *ss = {};
  if (addr.find(':') != std::string::npos) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(port);
    if (inet_pton(AF_INET6, addr.c_str(), &a.sin6_addr) != 1)
      throw std::runtime_error("bad address " + addr);
    std::memcpy(ss, &a, sizeof a);
    return sizeof a;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1)
    throw std::runtime_error("bad address " + addr);
  std::memcpy(ss, &a, sizeof a);
  return sizeof a;
}

sockaddr* as_sockaddr(sockaddr_storage* ss) {
  return static_cast<sockaddr*>(static_cast<void*>(ss));
}

int remaining_ms(Clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Sends a line and reads the answer up to its newline, on an open socket.
Reply exchange(int fd, Clock::time_point start, Clock::time_point deadline) {
  Reply r;
  if (send(fd, "hi\n", 3, MSG_NOSIGNAL) != 3) {
    r.err = errno;
    r.took = Clock::now() - start;
    return r;
  }
  std::string got;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int n = poll(&p, 1, remaining_ms(deadline));
    if (n <= 0) {
      r.err = ETIMEDOUT;
      break;
    }
    char buf[256];
    ssize_t k = recv(fd, buf, sizeof buf, 0);
    if (k < 0) {
      r.err = errno;
      break;
    }
    if (k == 0) {
      r.err = ECONNRESET;
      break;
    }
    got.append(buf, static_cast<size_t>(k));
    if (auto eol = got.find('\n'); eol != std::string::npos) {
      r.name = got.substr(0, eol);
      break;
    }
  }
  r.took = Clock::now() - start;
  return r;
}

// One TCP request on a new connection, optionally from a chosen source address.
Reply tcp_request(const std::string& addr, uint16_t port, int timeout_ms = 1000,
                  const std::string& src = {}) {
  auto start = Clock::now();
  auto deadline = start + std::chrono::milliseconds(timeout_ms);
  sockaddr_storage ss;
  socklen_t len = make_sockaddr(addr, port, &ss);
  Reply r;
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  if (!src.empty()) {
    sockaddr_storage s;
    socklen_t sl = make_sockaddr(src, 0, &s);
    if (bind(fd, as_sockaddr(&s), sl) != 0) {
      close(fd);
      throw std::runtime_error("bind " + src + ": " + std::strerror(errno));
    }
  }
  if (connect(fd, as_sockaddr(&ss), len) != 0) {
    if (errno != EINPROGRESS) {
      r.err = errno;
    } else {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, remaining_ms(deadline)) <= 0) {
        r.err = ETIMEDOUT;
      } else {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        r.err = err;
      }
    }
  }
  if (r.err == 0) {
    r = exchange(fd, start, deadline);
  }
  r.took = Clock::now() - start;
  close(fd);
  return r;
}

// One UDP datagram and its answer on a connected socket (so an ICMP error shows as
// ECONNREFUSED), optionally from a fixed source port.
Reply udp_request(const std::string& addr, uint16_t port, int timeout_ms = 1000,
                  uint16_t src_port = 0) {
  auto start = Clock::now();
  auto deadline = start + std::chrono::milliseconds(timeout_ms);
  sockaddr_storage ss;
  socklen_t len = make_sockaddr(addr, port, &ss);
  int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  if (src_port) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage s;
    socklen_t sl = make_sockaddr(ss.ss_family == AF_INET6 ? "::" : "0.0.0.0", src_port, &s);
    if (bind(fd, as_sockaddr(&s), sl) != 0) {
      close(fd);
      throw std::runtime_error(std::string("bind: ") + std::strerror(errno));
    }
  }
  Reply r;
  if (connect(fd, as_sockaddr(&ss), len) != 0) {
    r.err = errno;
  } else {
    r = exchange(fd, start, deadline);
  }
  r.took = Clock::now() - start;
  close(fd);
  return r;
}

// Answers (or "error:<errno name>") counted over n requests made inside `ns`.
std::map<std::string, int> answers(Netns& ns, const std::string& addr, uint16_t port, int n,
                                   bool udp = false, int timeout_ms = 1000,
                                   const std::string& src = {}) {
  return ns.run([&] {
    std::map<std::string, int> seen;
    for (int i = 0; i < n; ++i) {
      Reply r =
          udp ? udp_request(addr, port, timeout_ms) : tcp_request(addr, port, timeout_ms, src);
      ++seen[r.err ? std::string("error:") + strerrorname_np(r.err) : r.name];
    }
    return seen;
  });
}

std::string show(const std::map<std::string, int>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += k + "=" + std::to_string(v) + " ";
  return s;
}

std::set<std::string> keys(const std::map<std::string, int>& m) {
  std::set<std::string> s;
  for (const auto& [k, _] : m) s.insert(k);
  return s;
}

// ---- the proxy of one node, in process ----

class NodeProxy {
 public:
  // Everything is made inside the node's namespace: the netlink socket, and the sink's resync
  // thread, which (like apply) runs the conntrack cleanup in the namespace of its thread.
  NodeProxy(Netns& node, NodeContext ctx) : node_(node), conntrack_(make_netlink_conntrack()) {
    node.run([&] {
      auto b = NetlinkBackend::open();
      if (!b) throw std::runtime_error("netlink backend: " + b.error());
      backend_ = std::move(*b);
      ProxySink::Options o;
      o.node = std::move(ctx);
      o.backoff_min = 20ms;
      o.backoff_max = 500ms;
      o.conntrack = conntrack_.get();
      sink_ = std::make_unique<ProxySink>(backend_.get(), &board_, o);
    });
  }

  // Hands the sink the next snapshot (on a thread inside the node) and waits until its batch
  // committed.
  void apply(const model::SnapshotPtr& snap) {
    model::Delta d = model::diff(last_.get(), *snap);
    node_.run([&] { sink_->apply(snap, d); });
    last_ = snap;
    if (!sink_->wait_idle(5s))
      throw std::runtime_error("proxy on " + node_.name() + " did not apply");
  }

  ProxySink& sink() { return *sink_; }
  std::string table(const std::string& family = "ip") {
    return node_.exec_checked({"nft", "list", "table", family, "endpointd"});
  }

 private:
  Netns& node_;
  std::unique_ptr<Conntrack> conntrack_;
  pipeline::AckBoard board_;
  std::unique_ptr<NetlinkBackend> backend_;
  std::unique_ptr<ProxySink> sink_;
  model::SnapshotPtr last_;
};

// How fast a TCP client must see "refused" from a service without endpoints. With `reject`
// (an ICMP port-unreachable) the error to the first SYN often arrives while connect() still
// holds the socket lock, and the kernel drops it (TcpExtLockDroppedIcmps): the client learns of
// the refusal from its retransmitted SYN, ~1 s later. `reject with tcp reset` (an RST is queued
// to the socket's backlog instead) makes it immediate. Either way it is no timeout.
std::chrono::milliseconds refuse_bound(const std::string& table) {
  return table.find("reject with tcp reset") != std::string::npos ? 500ms : 1500ms;
}

// ---- the fixture ----

constexpr uint16_t kTcpPort = 8080;  // every pod's test server
constexpr uint16_t kUdpPort = 5353;

class TrafficTest : public netns::NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    cluster_ = std::make_unique<Cluster>(ClusterSpec::make(2, 2));
    for (const auto& name : cluster_->pod_names()) {
      servers_[name] = netns::start_server(
          cluster_->pod(name), {.name = name, .tcp_port = kTcpPort, .udp_port = kUdpPort});
    }
  }
  void TearDown() override {
    proxies_.clear();  // before the namespaces their sockets live in
    cluster_.reset();
  }

  Netns& node(int i) { return cluster_->node("node-" + std::to_string(i)); }
  Netns& pod(const std::string& name) { return cluster_->pod(name); }
  Netns& client() { return cluster_->client(); }
  const netns::NodeSpec& node_spec(int i) {
    return cluster_->spec().nodes.at(static_cast<size_t>(i - 1));
  }
  NodeProxy& proxy(int i) { return *proxies_.at(static_cast<size_t>(i - 1)); }

  static std::string node_of(const std::string& pod_name) {
    return pod_name.substr(0, pod_name.find("-pod-"));
  }

  NodeContext context_for(int i) {
    NodeContext c;
    c.node_name = node_spec(i).name;
    c.zone = i == 1 ? "zone-a" : "zone-b";
    c.node_ips = {ip(node_spec(i).ip.c_str())};
    c.cluster_cidrs = {prefix("10.244.0.0/16")};
    c.ipv6 = false;
    return c;
  }

  // Starts the proxy of every node; `tweak` may change each node's context first.
  void start_proxies(const std::function<void(int, NodeContext&)>& tweak = {}) {
    for (int i = 1; i <= static_cast<int>(cluster_->spec().nodes.size()); ++i) {
      NodeContext c = context_for(i);
      if (tweak) tweak(i, c);
      proxies_.push_back(std::make_unique<NodeProxy>(node(i), c));
    }
  }

  // Publishes the next snapshot to every node's proxy, with these Node objects.
  void publish(std::vector<model::ServiceStatePtr> services,
               std::vector<model::NodePtr> nodes = {}) {
    auto snap =
        std::make_shared<model::Snapshot>(*testing::snapshot(++generation_, std::move(services)));
    snap->nodes = std::move(nodes);
    for (auto& p : proxies_) p->apply(snap);
  }

  // A Node object with one InternalIP.
  static model::NodePtr node_object(const std::string& name, const std::string& internal_ip) {
    auto n = std::make_shared<model::Node>();
    n->name = name;
    n->addresses = {{"InternalIP", internal_ip}};
    return n;
  }

  // A NodePort service on 30080 whose endpoints are every pod.
  model::ServiceStatePtr node_port_service() {
    auto svc = testing::service("np", {ip("10.96.0.12")}, 80);
    svc.type = model::ServiceType::kNodePort;
    svc.ports[0].node_port = 30080;
    std::vector<model::MergedEndpoint> eps;
    for (const auto& p : kAllPods) eps.push_back(ep(p));
    return testing::state(svc, eps);
  }

  // Whether the client's connections to addr:port are answered (true) or refused (false)
  // within `within`: the dataplane may take a moment to follow.
  bool serves(const std::string& addr, uint16_t port, bool want, std::chrono::milliseconds within) {
    auto until = Clock::now() + within;
    for (;;) {
      Reply r = client().run([&] { return tcp_request(addr, port, 500); });
      bool served = r.err == 0;
      if (served == want) return true;
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(50ms);
    }
  }

  // A pod as an endpoint of a service (TCP 8080, or UDP 5353).
  model::MergedEndpoint ep(const std::string& pod_name, bool ready = true, bool terminating = false,
                           bool serving = true, model::Protocol proto = model::Protocol::kTCP) {
    const auto& spec = cluster_->pod_spec(pod_name);
    uint16_t port = proto == model::Protocol::kUDP ? kUdpPort : kTcpPort;
    auto e = testing::endpoint(spec.ip.c_str(), port, node_of(pod_name), ready, terminating,
                               serving, proto);
    e.zone = node_of(pod_name) == "node-1" ? "zone-a" : "zone-b";
    e.target_ref = model::ObjectRef{"Pod", "default", pod_name, ""};
    return e;
  }

  // The peers a pod's server logged (accepted TCP connections and UDP datagrams).
  std::vector<std::string> peers(const std::string& pod_name) {
    std::vector<std::string> out;
    for (const auto& e : netns::read_server_events(servers_.at(pod_name).events_path)) {
      if (e.kind == "accept" || e.kind == "udp") out.push_back(e.peer.substr(0, e.peer.rfind(':')));
    }
    return out;
  }

  const std::vector<std::string> kAllPods = {"node-1-pod-1", "node-1-pod-2", "node-2-pod-1",
                                             "node-2-pod-2"};
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, netns::Server> servers_;
  std::vector<std::unique_ptr<NodeProxy>> proxies_;
  uint64_t generation_ = 0;
};

std::set<std::string> set_of(std::initializer_list<const char*> v) {
  return {v.begin(), v.end()};
}

// 1. ClusterIP from a pod and from the node, balanced over endpoints on both nodes; a service
// without endpoints refuses at once.
TEST_F(TrafficTest, ClusterIpBalancesAcrossNodesAndEmptyServiceRefuses) {
  start_proxies();
  std::vector<model::MergedEndpoint> eps;
  for (const auto& p : kAllPods) eps.push_back(ep(p));
  publish({testing::state(testing::service("web", {ip("10.96.0.10")}, 80), eps),
           testing::state(testing::service("empty", {ip("10.96.0.11")}, 80), {})});

  // No endpoints: refused (reject in the forward hook), see refuse_bound. Checked before any
  // hairpin traffic too: a pod reaching itself through the node makes the node send it an ICMP
  // redirect, which uses up the per-host ICMP rate limit (1 s) that the reject's ICMP error
  // then hits.
  const auto bound = refuse_bound(proxy(1).table());
  Reply r = pod("node-1-pod-1").run([] { return tcp_request("10.96.0.11", 80, 3000); });
  EXPECT_EQ(r.err, ECONNREFUSED) << std::strerror(r.err);
  EXPECT_LT(r.took, bound);
  // From the node itself (reject in the output hook).
  Reply n = node(1).run([] { return tcp_request("10.96.0.11", 80, 3000); });
  EXPECT_EQ(n.err, ECONNREFUSED) << std::strerror(n.err);
  EXPECT_LT(n.took, bound);

  auto from_pod = answers(pod("node-1-pod-1"), "10.96.0.10", 80, 40);
  EXPECT_EQ(keys(from_pod), std::set<std::string>(kAllPods.begin(), kAllPods.end()))
      << show(from_pod);
  auto from_node = answers(node(1), "10.96.0.10", 80, 40);
  EXPECT_EQ(keys(from_node), std::set<std::string>(kAllPods.begin(), kAllPods.end()))
      << show(from_node);
  auto from_node2_pod = answers(pod("node-2-pod-2"), "10.96.0.10", 80, 40);
  EXPECT_EQ(keys(from_node2_pod), std::set<std::string>(kAllPods.begin(), kAllPods.end()))
      << show(from_node2_pod);
  // After hairpin traffic (see above): still refused, not a timeout.
  Reply again = pod("node-1-pod-1").run([] { return tcp_request("10.96.0.11", 80, 3000); });
  EXPECT_EQ(again.err, ECONNREFUSED) << std::strerror(again.err);
  EXPECT_LT(again.took, bound);
}

// 2. NodePort from the client to node IPs: on the nodePortAddresses only, never on localhost.
TEST_F(TrafficTest, NodePortHonoursNodePortAddressesAndNeverLocalhost) {
  // node-1 has a second address that nodePortAddresses leaves out; the client can reach it.
  node(1).ip({"addr", "add", "192.168.78.2/24", "dev", "eth0"});
  client().ip({"addr", "add", "192.168.78.100/24", "dev", "eth0"});
  start_proxies([](int i, NodeContext& c) {
    if (i == 1) {
      c.node_ips.push_back(ip("192.168.78.2"));
      c.node_ips.push_back(ip("127.0.0.1"));
      c.node_port_addresses = {prefix("192.168.77.0/24"), prefix("127.0.0.0/8")};
    }
  });
  auto svc = testing::service("np", {ip("10.96.0.12")}, 80);
  svc.type = model::ServiceType::kNodePort;
  svc.ports[0].node_port = 30080;
  std::vector<model::MergedEndpoint> eps;
  for (const auto& p : kAllPods) eps.push_back(ep(p));
  publish({testing::state(svc, eps)});

  auto via1 = answers(client(), "192.168.77.2", 30080, 40);
  EXPECT_EQ(keys(via1), std::set<std::string>(kAllPods.begin(), kAllPods.end())) << show(via1);
  auto via2 = answers(client(), "192.168.77.3", 30080, 40);
  EXPECT_EQ(keys(via2), std::set<std::string>(kAllPods.begin(), kAllPods.end())) << show(via2);
  // Cluster policy: masqueraded, so the servers saw node addresses, never the client.
  for (const auto& p : kAllPods) {
    for (const auto& peer : peers(p)) EXPECT_NE(peer, "192.168.77.100") << p;
  }

  // Not on an address outside nodePortAddresses: nothing listens there, the node's stack resets.
  Reply outside = client().run([] { return tcp_request("192.168.78.2", 30080); });
  EXPECT_EQ(outside.err, ECONNREFUSED) << outside.name;
  // Never on localhost, even when a loopback address is given and selected.
  Reply local = node(1).run([] { return tcp_request("127.0.0.1", 30080); });
  EXPECT_EQ(local.err, ECONNREFUSED) << local.name;
  EXPECT_EQ(proxy(1).table().find("127.0.0.1"), std::string::npos);
  // The node reaches its own node port on its address.
  Reply own = node(1).run([] { return tcp_request("192.168.77.2", 30080); });
  EXPECT_EQ(own.err, 0) << std::strerror(own.err);
}

// 2b. Without nodePortAddresses, node ports are served on the node's primary IP only (the Node
// object's InternalIP, kube-proxy's "primary"), and follow it when the Node's address changes.
TEST_F(TrafficTest, NodePortOnThePrimaryIpByDefaultFollowingTheNode) {
  node(1).ip({"addr", "add", "192.168.78.2/24", "dev", "eth0"});
  client().ip({"addr", "add", "192.168.78.100/24", "dev", "eth0"});
  start_proxies([](int i, NodeContext& c) {
    if (i == 1) c.node_ips.push_back(ip("192.168.78.2"));  // the host has both
  });
  publish({node_port_service()},
          {node_object("node-1", "192.168.77.2"), node_object("node-2", "192.168.77.3")});
  auto primary = answers(client(), "192.168.77.2", 30080, 40);
  EXPECT_EQ(keys(primary), std::set<std::string>(kAllPods.begin(), kAllPods.end()))
      << show(primary);
  Reply other = client().run([] { return tcp_request("192.168.78.2", 30080); });
  EXPECT_EQ(other.err, ECONNREFUSED) << other.name;

  // The Node's InternalIP moves to the other address: the node port moves with it.
  publish({node_port_service()},
          {node_object("node-1", "192.168.78.2"), node_object("node-2", "192.168.77.3")});
  auto moved = answers(client(), "192.168.78.2", 30080, 40);
  EXPECT_EQ(keys(moved), std::set<std::string>(kAllPods.begin(), kAllPods.end())) << show(moved);
  Reply old = client().run([] { return tcp_request("192.168.77.2", 30080); });
  EXPECT_EQ(old.err, ECONNREFUSED) << old.name;
}

// 2c. With nodePortAddresses CIDRs, an address added to the host later serves node ports within
// a second (the address monitor's notification, then a full sync of only what differs), and
// stops when it is removed, as kube-proxy's `fib daddr type local`.
TEST_F(TrafficTest, NodePortFollowsAnAddressAddedToTheHost) {
  client().ip({"addr", "add", "192.168.78.100/24", "dev", "eth0"});
  start_proxies([](int i, NodeContext& c) {
    if (i == 1) c.node_port_addresses = {prefix("192.168.0.0/16")};
  });
  std::unique_ptr<AddressMonitor> monitor;
  node(1).run([&] {
    auto m =
        AddressMonitor::start([this] { proxy(1).sink().set_host_addresses(host_addresses()); });
    if (!m) throw std::runtime_error(m.error());
    monitor = std::move(*m);
  });
  publish({node_port_service()});
  EXPECT_TRUE(serves("192.168.77.2", 30080, true, 1s));
  Reply before = client().run([] { return tcp_request("192.168.78.2", 30080); });
  EXPECT_NE(before.err, 0) << "no such address yet: " << before.name;

  node(1).ip({"addr", "add", "192.168.78.2/24", "dev", "eth0"});
  EXPECT_TRUE(serves("192.168.78.2", 30080, true, 2s)) << proxy(1).table();
  auto added = answers(client(), "192.168.78.2", 30080, 40);
  EXPECT_EQ(keys(added), std::set<std::string>(kAllPods.begin(), kAllPods.end())) << show(added);
  EXPECT_GE(monitor->changes(), 1u);

  node(1).ip({"addr", "del", "192.168.78.2/24", "dev", "eth0"});
  EXPECT_TRUE(serves("192.168.78.2", 30080, false, 2s));
  EXPECT_EQ(proxy(1).table().find("192.168.78.2"), std::string::npos) << proxy(1).table();
  EXPECT_TRUE(serves("192.168.77.2", 30080, true, 1s));
  monitor.reset();  // before the proxies it calls into
}

// 3. externalIPs and load-balancer ingress IPs; loadBalancerSourceRanges.
TEST_F(TrafficTest, ExternalAndLoadBalancerIpsWithSourceRanges) {
  client().ip({"addr", "add", "192.168.77.101/24", "dev", "eth0"});
  client().ip({"route", "add", "203.0.113.0/24", "via", node_spec(1).ip});
  start_proxies();
  auto svc = testing::service("lb", {ip("10.96.0.13")}, 80);
  svc.type = model::ServiceType::kLoadBalancer;
  svc.ports[0].node_port = 30083;
  svc.external_ips = {ip("203.0.113.10")};
  svc.load_balancer_ips = {ip("203.0.113.20")};
  svc.load_balancer_source_ranges = {prefix("192.168.77.100/32")};
  publish({testing::state(svc, {ep("node-1-pod-1"), ep("node-2-pod-1")})});

  const std::set<std::string> both = set_of({"node-1-pod-1", "node-2-pod-1"});
  auto ext = answers(client(), "203.0.113.10", 80, 30, false, 1000, "192.168.77.101");
  EXPECT_EQ(keys(ext), both) << show(ext);
  auto allowed = answers(client(), "203.0.113.20", 80, 30, false, 1000, "192.168.77.100");
  EXPECT_EQ(keys(allowed), both) << show(allowed);
  // A source outside the ranges is dropped (no answer at all).
  Reply denied =
      client().run([] { return tcp_request("203.0.113.20", 80, 700, "192.168.77.101"); });
  EXPECT_EQ(denied.err, ETIMEDOUT) << denied.name << " " << std::strerror(denied.err);

  // The firewall follows the service: widened to the other source, it gets through.
  svc.load_balancer_source_ranges = {prefix("192.168.77.100/32"), prefix("192.168.77.101/32")};
  publish({testing::state(svc, {ep("node-1-pod-1"), ep("node-2-pod-1")})});
  Reply now = client().run([] { return tcp_request("203.0.113.20", 80, 1000, "192.168.77.101"); });
  EXPECT_EQ(now.err, 0) << std::strerror(now.err);
}

// 4a. externalTrafficPolicy Local: local endpoints only, the client's address preserved, and no
// local endpoint -> drop. Cluster: masqueraded across nodes.
TEST_F(TrafficTest, ExternalTrafficPolicyLocalPreservesSourceAndDropsWithoutLocalEndpoints) {
  start_proxies();
  auto local = testing::service("local", {ip("10.96.0.14")}, 80);
  local.type = model::ServiceType::kNodePort;
  local.ports[0].node_port = 30084;
  local.external_traffic_policy = model::TrafficPolicy::kLocal;
  auto only1 = local;
  only1.key.name = "local-only-node-1";
  only1.cluster_ips = {ip("10.96.0.15")};
  only1.ports[0].node_port = 30085;
  auto cluster = testing::service("cluster", {ip("10.96.0.16")}, 80);
  cluster.type = model::ServiceType::kNodePort;
  cluster.ports[0].node_port = 30086;
  publish({testing::state(local, {ep("node-1-pod-1"), ep("node-2-pod-1")}),
           testing::state(only1, {ep("node-1-pod-2")}),
           testing::state(cluster, {ep("node-2-pod-2")})});

  auto via1 = answers(client(), "192.168.77.2", 30084, 20);
  EXPECT_EQ(keys(via1), set_of({"node-1-pod-1"})) << show(via1);
  auto via2 = answers(client(), "192.168.77.3", 30084, 20);
  EXPECT_EQ(keys(via2), set_of({"node-2-pod-1"})) << show(via2);
  for (const char* p : {"node-1-pod-1", "node-2-pod-1"}) {
    auto seen = peers(p);
    ASSERT_FALSE(seen.empty()) << p;
    for (const auto& peer : seen)
      EXPECT_EQ(peer, "192.168.77.100") << p << ": source not preserved";
  }
  // node-2 has no endpoint of local-only-node-1: dropped, not refused.
  Reply none = client().run([] { return tcp_request("192.168.77.3", 30085, 700); });
  EXPECT_EQ(none.err, ETIMEDOUT) << none.name << " " << std::strerror(none.err);
  auto served = answers(client(), "192.168.77.2", 30085, 5);
  EXPECT_EQ(keys(served), set_of({"node-1-pod-2"})) << show(served);
  EXPECT_EQ(peers("node-1-pod-2").at(0), "192.168.77.100");

  // Cluster policy through node-1 to a pod on node-2: masqueraded to node-1's address.
  auto crossed = answers(client(), "192.168.77.2", 30086, 5);
  EXPECT_EQ(keys(crossed), set_of({"node-2-pod-2"})) << show(crossed);
  for (const auto& peer : peers("node-2-pod-2")) EXPECT_EQ(peer, "192.168.77.2");
}

// 4b. internalTrafficPolicy Local: a pod's node uses only its own endpoints; none -> drop.
TEST_F(TrafficTest, InternalTrafficPolicyLocal) {
  start_proxies();
  auto svc = testing::service("itp", {ip("10.96.0.17")}, 80);
  svc.internal_traffic_policy = model::TrafficPolicy::kLocal;
  auto remote_only = svc;
  remote_only.key.name = "itp-remote";
  remote_only.cluster_ips = {ip("10.96.0.18")};
  publish({testing::state(svc, {ep("node-1-pod-1"), ep("node-2-pod-1")}),
           testing::state(remote_only, {ep("node-2-pod-1")})});

  auto on1 = answers(pod("node-1-pod-2"), "10.96.0.17", 80, 20);
  EXPECT_EQ(keys(on1), set_of({"node-1-pod-1"})) << show(on1);
  auto on2 = answers(pod("node-2-pod-2"), "10.96.0.17", 80, 20);
  EXPECT_EQ(keys(on2), set_of({"node-2-pod-1"})) << show(on2);
  Reply none = pod("node-1-pod-2").run([] { return tcp_request("10.96.0.18", 80, 700); });
  EXPECT_EQ(none.err, ETIMEDOUT) << none.name << " " << std::strerror(none.err);
  auto there = answers(pod("node-2-pod-2"), "10.96.0.18", 80, 5);
  EXPECT_EQ(keys(there), set_of({"node-2-pod-1"})) << show(there);
}

// 5. Serving+terminating endpoints are used only while no ready endpoint exists.
TEST_F(TrafficTest, TerminatingEndpointsAreAFallbackOnly) {
  start_proxies();
  auto svc = testing::service("term", {ip("10.96.0.19")}, 80);
  auto terminating = [&](const char* p) { return ep(p, false, true, true); };
  publish({testing::state(
      svc, {ep("node-1-pod-1"), terminating("node-2-pod-1"), terminating("node-2-pod-2")})});
  auto a = answers(pod("node-1-pod-2"), "10.96.0.19", 80, 20);
  EXPECT_EQ(keys(a), set_of({"node-1-pod-1"})) << show(a);

  // The ready one leaves: the terminating, still serving ones take over.
  publish({testing::state(svc, {terminating("node-2-pod-1"), terminating("node-2-pod-2")})});
  auto b = answers(pod("node-1-pod-2"), "10.96.0.19", 80, 30);
  EXPECT_EQ(keys(b), set_of({"node-2-pod-1", "node-2-pod-2"})) << show(b);

  // Terminating and no longer serving: nothing to use, refused.
  publish({testing::state(svc, {ep("node-2-pod-1", false, true, false)})});
  Reply r = pod("node-1-pod-2").run([] { return tcp_request("10.96.0.19", 80, 2000); });
  EXPECT_EQ(r.err, ECONNREFUSED) << r.name << " " << std::strerror(r.err);

  // A ready endpoint back: the fallback stops at once.
  publish({testing::state(svc, {ep("node-1-pod-2"), terminating("node-2-pod-1")})});
  auto c = answers(pod("node-1-pod-1"), "10.96.0.19", 80, 20);
  EXPECT_EQ(keys(c), set_of({"node-1-pod-2"})) << show(c);
}

// 6. Topology: PreferClose with zone hints -> this zone's endpoints only; hints unusable -> all.
TEST_F(TrafficTest, TopologyHintsKeepTrafficInTheZone) {
  start_proxies();
  auto svc = testing::service("topo", {ip("10.96.0.20")}, 80);
  svc.traffic_distribution = "PreferClose";
  auto hinted = [&](const std::string& p) {
    auto e = ep(p);
    e.hint_zones = {e.zone};
    return e;
  };
  std::vector<model::MergedEndpoint> eps;
  for (const auto& p : kAllPods) eps.push_back(hinted(p));
  publish({testing::state(svc, eps)});
  auto a = answers(pod("node-1-pod-1"), "10.96.0.20", 80, 30);
  EXPECT_EQ(keys(a), set_of({"node-1-pod-1", "node-1-pod-2"})) << show(a);
  auto b = answers(pod("node-2-pod-1"), "10.96.0.20", 80, 30);
  EXPECT_EQ(keys(b), set_of({"node-2-pod-1", "node-2-pod-2"})) << show(b);

  // One endpoint without a hint: hints are ignored, every endpoint is used.
  eps.back().hint_zones.clear();
  publish({testing::state(svc, eps)});
  auto c = answers(pod("node-1-pod-1"), "10.96.0.20", 80, 40);
  EXPECT_EQ(keys(c), std::set<std::string>(kAllPods.begin(), kAllPods.end())) << show(c);
}

// 7. Hairpin: a pod reaches itself through its service (masqueraded to the node's gateway).
TEST_F(TrafficTest, HairpinPodReachesItselfThroughItsService) {
  start_proxies();
  publish({testing::state(testing::service("self", {ip("10.96.0.21")}, 80), {ep("node-1-pod-1")}),
           testing::state(testing::service("pair", {ip("10.96.0.22")}, 80),
                          {ep("node-1-pod-1"), ep("node-2-pod-1")})});
  auto a = answers(pod("node-1-pod-1"), "10.96.0.21", 80, 10);
  EXPECT_EQ(keys(a), set_of({"node-1-pod-1"})) << show(a);
  for (const auto& peer : peers("node-1-pod-1")) EXPECT_EQ(peer, "10.244.1.1");
  auto b = answers(pod("node-1-pod-1"), "10.96.0.22", 80, 30);
  EXPECT_EQ(keys(b), set_of({"node-1-pod-1", "node-2-pod-1"})) << show(b);
  // Not hairpin: a pod's own address is kept toward other pods.
  auto from_other = peers("node-2-pod-1");
  ASSERT_FALSE(from_other.empty());
  for (const auto& peer : from_other) EXPECT_EQ(peer, "10.244.1.10");
}

// 8a. A UDP service, balanced; an empty one refuses (ICMP), and going from 0 to some
// endpoints works for the next datagram of the same flow.
TEST_F(TrafficTest, UdpServiceBalancesAndWorksRightAfterGettingEndpoints) {
  start_proxies();
  using model::Protocol;
  auto udp = [&](const std::string& p) { return ep(p, true, false, true, Protocol::kUDP); };
  auto echo = testing::service("echo", {ip("10.96.0.30")}, 53, Protocol::kUDP);
  auto later = testing::service("later", {ip("10.96.0.31")}, 53, Protocol::kUDP);
  std::vector<model::MergedEndpoint> eps;
  for (const auto& p : kAllPods) eps.push_back(udp(p));
  publish({testing::state(echo, eps), testing::state(later, {})});

  // Before any hairpin traffic of this pod (its ICMP redirect would rate-limit the ICMP error;
  // see ClusterIpBalancesAcrossNodesAndEmptyServiceRefuses).
  Reply refused =
      pod("node-1-pod-1").run([] { return udp_request("10.96.0.31", 53, 1000, 40002); });
  EXPECT_EQ(refused.err, ECONNREFUSED) << refused.name << " " << std::strerror(refused.err);

  auto a = answers(pod("node-1-pod-1"), "10.96.0.30", 53, 40, /*udp=*/true);
  EXPECT_EQ(keys(a), std::set<std::string>(kAllPods.begin(), kAllPods.end())) << show(a);
  publish({testing::state(echo, eps), testing::state(later, {udp("node-2-pod-2")})});
  Reply first = pod("node-1-pod-1").run([] { return udp_request("10.96.0.31", 53, 1000, 40002); });
  EXPECT_EQ(first.err, 0) << std::strerror(first.err);
  EXPECT_EQ(first.name, "node-2-pod-2");
}

// 8b. After a UDP endpoint leaves, the sink deletes the conntrack entries still bound to it:
// the next datagram of the same flow (same source port) reaches a current endpoint. And a flow
// blackholed before its service had endpoints works as soon as it has some.
TEST_F(TrafficTest, SinkDeletesStaleAndBlackholedUdpConntrackEntries) {
  start_proxies();
  using model::Protocol;
  auto udp = [&](const std::string& p) { return ep(p, true, false, true, Protocol::kUDP); };
  auto svc = testing::service("udp", {ip("10.96.0.33")}, 53, Protocol::kUDP);
  auto bh = testing::service("blackholed", {ip("10.96.0.34")}, 53, Protocol::kUDP);
  publish({testing::state(svc, {udp("node-2-pod-1")})});
  auto send = [&](const char* vip, uint16_t sport) {
    return pod("node-1-pod-1").run([=] { return udp_request(vip, 53, 700, sport); });
  };
  EXPECT_EQ(send("10.96.0.33", 40004).name, "node-2-pod-1");
  // Before `blackholed` exists the node forwards the datagram unNATed toward the service CIDR,
  // and conntrack remembers that flow.
  EXPECT_NE(send("10.96.0.34", 40005).err, 0);
  int blackholed = node(1).run([] {
    auto flows = make_netlink_conntrack()->list();
    if (!flows) throw std::runtime_error(flows.error());
    int n = 0;
    for (const auto& f : *flows) n += udp_to_service(ip("10.96.0.34"), 53).matches(f);
    return n;
  });
  EXPECT_EQ(blackholed, 1);

  uint64_t deleted_before = proxy(1).sink().conntrack_deleted();
  publish({testing::state(svc, {udp("node-2-pod-2")}), testing::state(bh, {udp("node-1-pod-2")})});
  Reply moved = send("10.96.0.33", 40004);
  EXPECT_EQ(moved.name, "node-2-pod-2") << std::strerror(moved.err);
  Reply now = send("10.96.0.34", 40005);
  EXPECT_EQ(now.name, "node-1-pod-2") << std::strerror(now.err);
  EXPECT_GE(proxy(1).sink().conntrack_deleted() - deleted_before, 2u);
  EXPECT_EQ(proxy(1).sink().conntrack_failures(), 0u);
}

// 10. Stop-accepting without resets: an established connection to an endpoint that left the
// load-balancing map keeps working; new connections go to the others.
TEST_F(TrafficTest, EstablishedConnectionSurvivesItsEndpointLeavingTheMap) {
  start_proxies();
  auto svc = testing::service("drain", {ip("10.96.0.40")}, 80);
  publish({testing::state(svc, {ep("node-2-pod-1")})});
  netns::LoadClient kept(
      pod("node-1-pod-1"),
      {.target = "10.96.0.40:80", .keepalive = true, .duration_ms = 8000, .interval_ms = 20});
  ASSERT_TRUE(netns::eventually([&] { return kept.results_so_far().ok >= 5; }, 3s));

  // Terminating (ready=false, serving): out of the map because a ready endpoint exists.
  publish({testing::state(svc, {ep("node-2-pod-1", false, true, true), ep("node-2-pod-2")})});
  auto fresh = answers(pod("node-1-pod-2"), "10.96.0.40", 80, 20);
  EXPECT_EQ(keys(fresh), set_of({"node-2-pod-2"})) << show(fresh);
  // And gone from the slice altogether: still no reset.
  publish({testing::state(svc, {ep("node-2-pod-2")})});
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);  // the load client stamps records with this clock
  int64_t removed_ns = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  auto after_removal = [&] {
    int n = 0;
    for (const auto& rec : kept.results_so_far().records) n += rec.ok && rec.time_ns > removed_ns;
    return n;
  };
  EXPECT_TRUE(netns::eventually([&] { return after_removal() >= 5; }, 3s)) << after_removal();

  netns::LoadResult r = kept.stop();
  EXPECT_EQ(r.failed, 0) << (r.errors.empty() ? "" : r.errors.begin()->first);
  EXPECT_GE(r.ok, 10);  // at least 5 before the removal and 5 after it
  EXPECT_EQ(r.by_backend.size(), 1u);
  EXPECT_EQ(r.by_backend["node-2-pod-1"], r.ok);
  std::set<uint64_t> conns;
  for (const auto& rec : r.records) conns.insert(rec.conn);
  EXPECT_EQ(conns.size(), 1u) << "the connection was re-opened";
}

// 9a. IPv6 ClusterIP (ip6 endpointd) across both nodes, pods with fd00:… addresses.
TEST_F(TrafficTest, Ipv6ClusterIpBalancesAcrossNodes) {
  const auto& nodes = cluster_->spec().nodes;
  auto v6 = [](int node_no, int host) {
    return "fd00:244:" + std::to_string(node_no) + "::" + std::to_string(host);
  };
  for (int i = 1; i <= 2; ++i) {
    Netns& n = node(i);
    n.set_sysctl("net.ipv6.conf.all.forwarding", "1");
    n.ip(
        {"-6", "addr", "add", "fd00:77::" + std::to_string(i + 1) + "/64", "dev", "eth0", "nodad"});
    n.ip({"-6", "route", "add", "fd00:96::/112", "dev", "eth0"});
    int other = 3 - i;
    n.ip({"-6", "route", "add", "fd00:244:" + std::to_string(other) + "::/64", "via",
          "fd00:77::" + std::to_string(other + 1)});
    const auto& pods = nodes[static_cast<size_t>(i - 1)].pods;
    for (size_t j = 0; j < pods.size(); ++j) {
      std::string host_side = "p" + std::to_string(j);
      std::string gw = v6(i, 1), addr = v6(i, 10 + static_cast<int>(j));
      n.ip({"-6", "addr", "add", gw + "/128", "dev", host_side, "nodad"});
      n.ip({"-6", "route", "add", addr + "/128", "dev", host_side});
      Netns& p = pod(pods[j].name);
      p.ip({"-6", "addr", "add", addr + "/128", "dev", "eth0", "nodad"});
      p.ip({"-6", "route", "add", gw, "dev", "eth0"});
      p.ip({"-6", "route", "add", "default", "via", gw, "dev", "eth0"});
      servers_[pods[j].name + "-v6"] =
          netns::start_server(p, {.name = pods[j].name + "-v6", .tcp_port = 8086, .bind = "::"});
    }
  }
  // The IPv6 network itself first: every pod answers directly (neighbour discovery on the
  // new links takes a moment), before any rule is involved.
  for (int i = 1; i <= 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      std::string a = v6(i, 10 + j);
      for (Netns* from : {&pod("node-1-pod-1"), &node(2)}) {
        ASSERT_TRUE(netns::eventually(
            [&] { return from->run([&] { return tcp_request(a, 8086, 200).err == 0; }); }, 10s))
            << from->name() << " -> " << a;
      }
    }
  }
  start_proxies([](int, NodeContext& c) {
    c.ipv6 = true;
    c.cluster_cidrs.push_back(prefix("fd00:244::/32"));
  });
  std::vector<model::MergedEndpoint> eps;
  for (int i = 1; i <= 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      std::string a = v6(i, 10 + j);
      eps.push_back(testing::endpoint(a.c_str(), 8086, "node-" + std::to_string(i)));
    }
  }
  publish({testing::state(testing::service("web6", {ip("fd00:96::10")}, 80), eps),
           testing::state(testing::service("empty6", {ip("fd00:96::11")}, 80), {})});
  EXPECT_NE(proxy(1).table("ip6").find("fd00:96::10"), std::string::npos);

  Reply r = pod("node-1-pod-2").run([] { return tcp_request("fd00:96::11", 80, 3000); });
  EXPECT_EQ(r.err, ECONNREFUSED) << std::strerror(r.err);
  EXPECT_LT(r.took, refuse_bound(proxy(1).table("ip6")));
  auto a = answers(pod("node-1-pod-1"), "fd00:96::10", 80, 40);
  EXPECT_EQ(keys(a),
            set_of({"node-1-pod-1-v6", "node-1-pod-2-v6", "node-2-pod-1-v6", "node-2-pod-2-v6"}))
      << show(a);
  auto b = answers(node(2), "fd00:96::10", 80, 40);
  EXPECT_EQ(keys(b),
            set_of({"node-1-pod-1-v6", "node-1-pod-2-v6", "node-2-pod-1-v6", "node-2-pod-2-v6"}))
      << show(b);
}

// 9b. SCTP: the rules are accepted; traffic needs the kernel's sctp module.
TEST_F(TrafficTest, SctpService) {
  start_proxies();
  auto svc = testing::service("sctp", {ip("10.96.0.50")}, 9000, model::Protocol::kSCTP);
  publish({testing::state(svc, {ep("node-2-pod-1", true, false, true, model::Protocol::kSCTP)})});
  EXPECT_EQ(proxy(1).sink().failures(), 0u);
  EXPECT_NE(proxy(1).table().find("sctp"), std::string::npos) << proxy(1).table();
  int err = pod("node-2-pod-1").run([] {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_SCTP);
    if (fd < 0) return errno;
    close(fd);
    return 0;
  });
  if (err != 0) {
    GTEST_SKIP()
        << "SCTP traffic not tested: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails with "
        << strerrorname_np(err) << " (no sctp kernel module here, and no modprobe); the "
        << "SCTP rules themselves were programmed and listed";
  }
  // With SCTP available the test servers would need an SCTP mode; not written yet.
  GTEST_SKIP() << "SCTP sockets work here but endpointd-testserver has no SCTP mode yet";
}

}  // namespace
}  // namespace endpointd::proxy
