// Real traffic for the kube-proxy behaviours the routing rule and the planner carry beyond plain
// balancing: topology hints (PreferSameZone / PreferClose / topology-mode Auto, PreferSameNode)
// and their fallbacks, masqueradeAll, and SCTP. A "node" namespace is programmed by the planner
// and the netlink backend; pods sit behind veths and answer each connection with the address
// they were reached on and the peer address they see.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/snapshot.h"
#include "proxy/netlink.h"
#include "proxy/planner.h"
#include "tests/netns/fixture.h"
#include "tests/netns/netns.h"
#include "tests/proxy/fixtures.h"

namespace endpointd::proxy {
namespace {

using netns::Netns;
using testing::ip;

constexpr uint16_t kPodPort = 8080;

// Runs a shell command in `ns`; throws on failure so the test stops (and the namespaces, owned
// by the test body, are deleted on the way out).
void sh(const Netns& ns, const std::string& cmd) {
  int st = 0;
  std::string out = ns.sh(cmd, &st);
  if (st != 0) throw std::runtime_error(ns.name() + ": " + cmd + ": " + out);
}

sockaddr_in v4_addr(const std::string& addr, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1)
    throw std::runtime_error("not an IPv4 address: " + addr);
  return sa;
}

std::string v4_str(const sockaddr_in& sa) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return buf;
}

sockaddr* as_sockaddr(sockaddr_in& sa) {
  return static_cast<sockaddr*>(static_cast<void*>(&sa));
}

// Stream servers (TCP or SCTP) on pod addresses: each accepted connection is answered with
// "<address it was reached on> <peer address>" and closed.
class PodServers {
 public:
  PodServers(Netns& ns, const std::vector<std::string>& addrs, uint16_t port,
             int proto = IPPROTO_TCP) {
    // A constructor that throws runs no destructor: close what was opened before rethrowing.
    try {
      listen_all(ns, addrs, port, proto);
    } catch (...) {
      for (int fd : fds_) close(fd);
      throw;
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~PodServers() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (int fd : fds_) close(fd);
  }
  PodServers(const PodServers&) = delete;
  PodServers& operator=(const PodServers&) = delete;

 private:
  void listen_all(Netns& ns, const std::vector<std::string>& addrs, uint16_t port, int proto) {
    ns.run([&] {
      for (const auto& a : addrs) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, proto);
        if (fd < 0) throw std::runtime_error("socket: " + std::string(strerrorname_np(errno)));
        fds_.push_back(fd);
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in sa = v4_addr(a, port);
        if (bind(fd, as_sockaddr(sa), sizeof sa) != 0 || listen(fd, 64) != 0)
          throw std::runtime_error("listen on " + a + ": " + strerrorname_np(errno));
      }
    });
  }

  void serve() {
    std::vector<pollfd> p;
    for (int fd : fds_) p.push_back({fd, POLLIN, 0});
    while (!stop_) {
      if (poll(p.data(), p.size(), 50) <= 0) continue;
      for (auto& q : p) {
        if (!(q.revents & POLLIN)) continue;
        sockaddr_in peer{};
        socklen_t plen = sizeof peer;
        int c = accept4(q.fd, as_sockaddr(peer), &plen, SOCK_CLOEXEC);
        if (c < 0) continue;
        sockaddr_in local{};
        socklen_t llen = sizeof local;
        getsockname(c, as_sockaddr(local), &llen);
        std::string reply = v4_str(local) + " " + v4_str(peer);
        (void)!write(c, reply.data(), reply.size());
        close(c);
      }
    }
  }

  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// What one connection saw: the server's address and the peer address the server saw, or the
// error that ended it.
struct Answer {
  int err = 0;
  std::string server;
  std::string peer;
};

// Connects (from the calling thread's namespace) to addr:port, optionally from `source`, and
// reads the server's answer.
Answer ask(const std::string& addr, uint16_t port, const std::string& source = {},
           int proto = IPPROTO_TCP) {
  Answer a;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, proto);
  if (fd < 0) {
    a.err = errno;
    return a;
  }
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (!source.empty()) {
    sockaddr_in src = v4_addr(source, 0);
    if (bind(fd, as_sockaddr(src), sizeof src) != 0) {
      a.err = errno;
      close(fd);
      return a;
    }
  }
  sockaddr_in sa = v4_addr(addr, port);
  if (connect(fd, as_sockaddr(sa), sizeof sa) != 0) {
    a.err = errno;
    close(fd);
    return a;
  }
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  if (n <= 0) {
    a.err = n < 0 ? errno : ECONNRESET;
    return a;
  }
  std::istringstream in(std::string(buf, static_cast<size_t>(n)));
  in >> a.server >> a.peer;
  return a;
}

// Makes `n` connections from `from` and counts them by the server that answered (errors by
// their name, "error:ECONNREFUSED"). Stops after three errors: a broken path should not cost
// three seconds a connection.
std::map<std::string, int> tally(Netns& from, const std::string& vip, uint16_t port, int n) {
  return from.run([&] {
    std::map<std::string, int> seen;
    int errors = 0;
    for (int i = 0; i < n && errors < 3; ++i) {
      Answer a = ask(vip, port);
      if (a.err != 0) {
        ++errors;
        ++seen[std::string("error:") + strerrorname_np(a.err)];
      } else {
        ++seen[a.server];
      }
    }
    return seen;
  });
}

std::set<std::string> keys(const std::map<std::string, int>& m) {
  std::set<std::string> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

std::string show(const std::map<std::string, int>& m) {
  std::string out = "seen:";
  for (const auto& [k, v] : m) out += " " + k + "=" + std::to_string(v);
  return out;
}

// Enough connections that missing one of `k` equally likely endpoints by chance is below 1e-7.
int connections_for(size_t k) {
  return std::max(30, 15 * static_cast<int>(k));
}

// This node's planner and its netlink backend in the node namespace, driven as the proxy sink
// drives them: a full sync first, then the planner's changes per delta.
class NodeTables {
 public:
  NodeTables(Netns& node, NodeContext ctx) : node_(node), planner_(std::move(ctx)) {
    backend_ = node_.run([] {
      auto b = NetlinkBackend::open();
      if (!b.ok()) throw std::runtime_error("netlink: " + b.error());
      return std::move(*b);
    });
  }

  // Programs `services` as the next generation: the whole tables the first time (or when
  // `full` is set, as after a context change), else the update for the delta from the last.
  void program(std::vector<model::ServiceStatePtr> services, bool full = false) {
    auto snap = testing::snapshot(++generation_, std::move(services));
    node_.run([&] {
      if (!prev_ || full) {
        planner_.reset(*snap);
        std::vector<const Table*> tables;
        for (IpFamily f : planner_.families()) tables.push_back(&planner_.table(f));
        auto r = backend_->full_sync(tables);
        if (!r.ok()) throw std::runtime_error("full sync: " + r.error());
      } else {
        auto changes = planner_.update(*snap, model::diff(prev_.get(), *snap));
        auto r = backend_->apply(changes);
        if (!r.ok()) throw std::runtime_error("apply: " + r.error());
      }
    });
    const PlanStats& st = planner_.last_stats();
    if (st.skipped != 0 || st.rejected != 0) {
      std::string why;
      for (const auto& s : st.skip_reasons) why += s + "; ";
      for (const auto& s : st.rejections) why += s + "; ";
      throw std::runtime_error("planner skipped or rejected: " + why);
    }
    prev_ = std::move(snap);
  }

  // A new node context, then everything again with the last services.
  void set_context(NodeContext ctx) {
    planner_.set_context(std::move(ctx));
    std::vector<model::ServiceStatePtr> same;
    for (const auto& st : prev_->services) same.push_back(st);
    program(std::move(same), true);
  }

 private:
  Netns& node_;
  Planner planner_;
  std::unique_ptr<NetlinkBackend> backend_;
  model::SnapshotPtr prev_;
  uint64_t generation_ = 0;
};

// IPv4 only: this node is node-a in zone-a (testing::node_context), pods 10.244.1.0/24.
NodeContext v4_context() {
  NodeContext ctx = testing::node_context();
  ctx.ipv6 = false;
  return ctx;
}

// A node namespace with one pod namespace behind veth0 (node 10.244.1.1), holding `addrs`;
// the service range is routed to the pods so the node's own connections have a route to DNAT.
struct NodeWithPods {
  explicit NodeWithPods(const std::vector<std::string>& addrs)
      : node(netns::unique_prefix() + "node"), pod(netns::unique_prefix() + "pod") {
    sh(node, "ip link add veth0 type veth peer name veth1 netns " + pod.name());
    sh(node, "ip addr add 10.244.1.1/24 dev veth0 && ip link set veth0 up");
    sh(node, "ip route add 10.96.0.0/12 dev veth0");
    for (const auto& a : addrs) sh(pod, "ip addr add " + a + "/24 dev veth1");
    sh(pod, "ip link set veth1 up && ip route add default via 10.244.1.1");
  }
  Netns node;
  Netns pod;
};

model::MergedEndpoint hinted(const char* addr, const char* node, const char* zone,
                             std::vector<std::string> zone_hints,
                             std::vector<std::string> node_hints = {}) {
  auto e = testing::endpoint(addr, kPodPort, node);
  e.zone = zone;
  e.hint_zones = std::move(zone_hints);
  e.hint_nodes = std::move(node_hints);
  return e;
}

model::MergedEndpoint not_ready(model::MergedEndpoint e) {
  e.conditions.ready = false;
  e.conditions.serving = false;
  return e;
}

using Names = std::set<std::string>;

class ParityTraffic : public netns::NetnsTest {};

// --- 1. Zone hints -----------------------------------------------------------------------------

// The three ways a service asks for zone-close routing.
struct CloseMode {
  const char* name;
  const char* traffic_distribution;
  const char* topology_mode;
};
void PrintTo(const CloseMode& m, std::ostream* os) {
  *os << m.name;
}

class ZoneHints : public netns::NetnsTest, public ::testing::WithParamInterface<CloseMode> {};

TEST_P(ZoneHints, SameZoneOnlyThenOtherZoneWhenNoneLeft) {
  const std::vector<std::string> addrs = {"10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5"};
  NodeWithPods net(addrs);
  PodServers pods(net.pod, addrs, kPodPort);
  NodeTables tables(net.node, v4_context());
  const char* vip = "10.96.0.10";

  auto web = testing::service("web", {ip(vip)}, 80);
  auto close = web;
  close.traffic_distribution = GetParam().traffic_distribution;
  close.topology_mode = GetParam().topology_mode;
  // Two endpoints hinted for this node's zone (on this node and a neighbour), two for another.
  auto a2 = hinted("10.244.1.2", "node-a", "zone-a", {"zone-a"});
  auto a3 = hinted("10.244.1.3", "node-b", "zone-a", {"zone-a"});
  auto b4 = hinted("10.244.1.4", "node-c", "zone-b", {"zone-b"});
  auto b5 = hinted("10.244.1.5", "node-d", "zone-b", {"zone-b"});
  auto expect_only = [&](const Names& want, const char* phase) {
    auto seen = tally(net.node, vip, 80, connections_for(want.size()));
    EXPECT_EQ(keys(seen), want) << phase << ": " << show(seen);
  };

  // The hints decide, as in kube-proxy (topologyModeFromHints): a service that no longer asks
  // follows the hints its slices still carry, until the controller drops them.
  tables.program({testing::state(web, {a2, a3, b4, b5})});
  expect_only({"10.244.1.2", "10.244.1.3"}, "hints without a distribution");
  auto unhinted = [](model::MergedEndpoint e) {
    e.hint_zones = {};
    return e;
  };
  tables.program({testing::state(web, {unhinted(a2), unhinted(a3), unhinted(b4), unhinted(b5)})});
  expect_only({"10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5"}, "no hints");

  // Asked: only the same-zone two, both of them.
  tables.program({testing::state(close, {a2, a3, b4, b5})});
  expect_only({"10.244.1.2", "10.244.1.3"}, "hinted");

  // One ready endpoint without hints (its slice is being rewritten): hints are not used.
  auto b5_unhinted = b5;
  b5_unhinted.hint_zones = std::vector<std::string>{};
  tables.program({testing::state(close, {a2, a3, b4, b5_unhinted})});
  expect_only({"10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5"}, "one unhinted");

  // Hinted again, then the same-zone ones stop being ready: no ready endpoint matches this
  // zone, so every ready endpoint (the other zone's) receives.
  tables.program({testing::state(close, {a2, a3, b4, b5})});
  expect_only({"10.244.1.2", "10.244.1.3"}, "hinted again");
  tables.program({testing::state(close, {not_ready(a2), not_ready(a3), b4, b5})});
  expect_only({"10.244.1.4", "10.244.1.5"}, "same zone not ready");

  // Ready again, then removed altogether: the same.
  tables.program({testing::state(close, {a2, a3, b4, b5})});
  expect_only({"10.244.1.2", "10.244.1.3"}, "ready again");
  tables.program({testing::state(close, {b4, b5})});
  expect_only({"10.244.1.4", "10.244.1.5"}, "same zone removed");
}

INSTANTIATE_TEST_SUITE_P(Modes, ZoneHints,
                         ::testing::Values(CloseMode{"PreferSameZone", "PreferSameZone", ""},
                                           CloseMode{"PreferClose", "PreferClose", ""},
                                           CloseMode{"TopologyModeAuto", "", "Auto"}),
                         [](const auto& info) { return std::string(info.param.name); });

// --- 2. Node hints -----------------------------------------------------------------------------

TEST_F(ParityTraffic, PreferSameNodeThenZoneThenCluster) {
  const std::vector<std::string> addrs = {"10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5"};
  NodeWithPods net(addrs);
  PodServers pods(net.pod, addrs, kPodPort);
  NodeTables tables(net.node, v4_context());
  const char* vip = "10.96.0.20";

  auto svc = testing::service("local-first", {ip(vip)}, 80);
  svc.traffic_distribution = "PreferSameNode";
  // Two on this node (node-a), one on another node of this zone, one in another zone; node
  // and zone hints as the EndpointSlice controller writes them for PreferSameNode.
  auto a2 = hinted("10.244.1.2", "node-a", "zone-a", {"zone-a"}, {"node-a"});
  auto a3 = hinted("10.244.1.3", "node-a", "zone-a", {"zone-a"}, {"node-a"});
  auto b4 = hinted("10.244.1.4", "node-b", "zone-a", {"zone-a"}, {"node-b"});
  auto c5 = hinted("10.244.1.5", "node-c", "zone-b", {"zone-b"}, {"node-c"});
  auto expect_only = [&](const Names& want, const char* phase) {
    auto seen = tally(net.node, vip, 80, connections_for(want.size()));
    EXPECT_EQ(keys(seen), want) << phase << ": " << show(seen);
  };

  tables.program({testing::state(svc, {a2, a3, b4, c5})});
  expect_only({"10.244.1.2", "10.244.1.3"}, "this node's");

  // One ready endpoint without node hints: node hints are not used, zone hints are.
  auto c5_no_node_hint = c5;
  c5_no_node_hint.hint_nodes = std::vector<std::string>{};
  tables.program({testing::state(svc, {a2, a3, b4, c5_no_node_hint})});
  expect_only({"10.244.1.2", "10.244.1.3", "10.244.1.4"}, "one without node hints");

  // None for this node left: this zone's.
  tables.program({testing::state(svc, {not_ready(a2), not_ready(a3), b4, c5})});
  expect_only({"10.244.1.4"}, "this node's not ready");

  // None for this zone either: every ready endpoint.
  tables.program({testing::state(svc, {not_ready(a2), not_ready(a3), not_ready(b4), c5})});
  expect_only({"10.244.1.5"}, "this zone's not ready");

  // Back on this node once its endpoints are ready.
  tables.program({testing::state(svc, {a2, a3, b4, c5})});
  expect_only({"10.244.1.2", "10.244.1.3"}, "this node's ready again");
}

// --- 3. masqueradeAll ------------------------------------------------------------------------

// A client pod (10.244.1.10, plus 172.31.1.10, an address outside the cluster CIDRs) and a
// server pod (10.244.2.10) on two veths of a forwarding node (10.244.1.1, 172.31.1.1,
// 10.244.2.1). The server reports the peer address it sees.
TEST_F(ParityTraffic, MasqueradeAllSourceNatsPodTraffic) {
  Netns node(netns::unique_prefix() + "node");
  Netns client(netns::unique_prefix() + "client");
  Netns server(netns::unique_prefix() + "server");
  sh(node, "ip link add vc0 type veth peer name vc1 netns " + client.name());
  sh(node, "ip link add vs0 type veth peer name vs1 netns " + server.name());
  sh(node, "ip addr add 10.244.1.1/24 dev vc0 && ip addr add 172.31.1.1/24 dev vc0");
  sh(node, "ip addr add 10.244.2.1/24 dev vs0");
  sh(node, "ip link set vc0 up && ip link set vs0 up");
  node.set_sysctl("net.ipv4.ip_forward", "1");
  sh(client, "ip addr add 10.244.1.10/24 dev vc1 && ip addr add 172.31.1.10/24 dev vc1");
  sh(client, "ip link set vc1 up && ip route add default via 10.244.1.1");
  sh(server, "ip addr add 10.244.2.10/24 dev vs1");
  sh(server, "ip link set vs1 up && ip route add default via 10.244.2.1");
  PodServers pods(server, {"10.244.2.10"}, kPodPort);

  const char* vip = "10.96.0.30";
  NodeContext ctx = v4_context();
  ASSERT_FALSE(ctx.masquerade_all);
  NodeTables tables(node, ctx);
  tables.program({testing::state(testing::service("peer", {ip(vip)}, 80),
                                 {testing::endpoint("10.244.2.10", kPodPort)})});

  // The peer addresses the server saw for five connections from `source`.
  auto peers_from = [&](const std::string& source) {
    return client.run([&] {
      std::map<std::string, int> seen;
      for (int i = 0; i < 5; ++i) {
        Answer a = ask(vip, 80, source);
        if (a.err != 0) {
          ++seen[std::string("error:") + strerrorname_np(a.err)];
          break;
        }
        EXPECT_EQ(a.server, "10.244.2.10");
        ++seen[a.peer];
      }
      return seen;
    });
  };
  auto expect_peer = [&](const std::string& source, const std::string& want, const char* phase) {
    auto seen = peers_from(source);
    EXPECT_EQ(keys(seen), Names{want}) << phase << ", from " << source << ": " << show(seen);
  };

  // Default: a pod keeps its address; a source outside the cluster CIDRs is masqueraded to
  // the node's address towards the server.
  expect_peer("10.244.1.10", "10.244.1.10", "masqueradeAll off");
  expect_peer("172.31.1.10", "10.244.2.1", "masqueradeAll off");

  ctx.masquerade_all = true;
  tables.set_context(ctx);
  expect_peer("10.244.1.10", "10.244.2.1", "masqueradeAll on");
  expect_peer("172.31.1.10", "10.244.2.1", "masqueradeAll on");

  // And off again: the full sync takes the rule out.
  ctx.masquerade_all = false;
  tables.set_context(ctx);
  expect_peer("10.244.1.10", "10.244.1.10", "masqueradeAll off again");
}

// --- 4. SCTP ---------------------------------------------------------------------------------

TEST_F(ParityTraffic, SctpThroughClusterIp) {
  NodeWithPods net({"10.244.1.2"});
  NodeTables tables(net.node, v4_context());
  const char* vip = "10.96.0.40";
  // The rules are taken whether or not the kernel can carry SCTP sockets.
  tables.program({testing::state(testing::service("sctp", {ip(vip)}, 9000, model::Protocol::kSCTP),
                                 {testing::endpoint("10.244.1.2", kPodPort, "node-a", true, false,
                                                    true, model::Protocol::kSCTP)})});

  // The sctp module may be loadable; if not (or it is not built at all), the socket says so.
  (void)!std::system("modprobe sctp >/dev/null 2>&1");
  int err = net.pod.run([] {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_SCTP);
    if (fd < 0) return errno;
    close(fd);
    return 0;
  });
  if (err != 0) {
    GTEST_SKIP() << "SCTP traffic not tested: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails "
                 << "with " << strerrorname_np(err)
                 << " (this kernel has no SCTP: no module, or CONFIG_IP_SCTP unset); the SCTP "
                 << "rules themselves were programmed";
  }

  PodServers pods(net.pod, {"10.244.1.2"}, kPodPort, IPPROTO_SCTP);
  Answer a = net.node.run([&] { return ask(vip, 9000, {}, IPPROTO_SCTP); });
  ASSERT_EQ(a.err, 0) << strerrorname_np(a.err);
  EXPECT_EQ(a.server, "10.244.1.2");
  EXPECT_EQ(a.peer, "10.244.1.1");  // the node itself, from a pod address: not masqueraded
}

// --- 5. Unallocated cluster IPs and unserved ports (kube-proxy's cluster-ips-check) ------------

// Connects (from the calling thread's namespace) without blocking and waits up to `wait_ms` for
// the outcome: "answer:<server>" (the server's reply: the address it was reached on),
// "error:<ERRNO>" (refused or failed within the wait), or "no answer".
std::string reach(const std::string& addr, uint16_t port, int wait_ms,
                  const std::string& source = {}) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
  if (fd < 0) return std::string("error:") + strerrorname_np(errno);
  auto done = [fd](std::string out) {
    close(fd);
    return out;
  };
  if (!source.empty()) {
    sockaddr_in src = v4_addr(source, 0);
    if (bind(fd, as_sockaddr(src), sizeof src) != 0)
      return done(std::string("error:") + strerrorname_np(errno));
  }
  sockaddr_in sa = v4_addr(addr, port);
  if (connect(fd, as_sockaddr(sa), sizeof sa) != 0 && errno != EINPROGRESS)
    return done(std::string("error:") + strerrorname_np(errno));
  pollfd p{fd, POLLOUT, 0};
  if (poll(&p, 1, wait_ms) == 0) return done("no answer");
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return done(std::string("error:") + strerrorname_np(err));
  p = {fd, POLLIN, 0};
  if (poll(&p, 1, 3000) <= 0) return done("connected, no reply");
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n <= 0) return done("connected, no reply");
  std::istringstream in(std::string(buf, static_cast<size_t>(n)));
  std::string server;
  in >> server;
  return done("answer:" + server);
}

// Long enough that a refusal (a reset, at once) or an answer over veths is never missed; a drop
// is this wait without either.
constexpr int kRefusedWithinMs = 500;

TEST_F(ParityTraffic, ServiceCidrDropsUnallocatedClusterIpsAndUnservedPortsAreRefused) {
  NodeWithPods net({"10.244.1.2"});
  PodServers pods(net.pod, {"10.244.1.2"}, kPodPort);
  // Something that answers where the service range is routed: 10.96.0.51 is no cluster IP, and
  // without a drop rule the node's connections to it reach this listener.
  sh(net.pod, "ip addr add 10.96.0.51/32 dev veth1");
  PodServers rogue(net.pod, {"10.96.0.51"}, 80);
  net.node.set_sysctl("net.ipv4.ip_forward", "1");

  const char* vip = "10.96.0.50";
  auto web = testing::state(testing::service("web", {ip(vip)}, 80),
                            {testing::endpoint("10.244.1.2", kPodPort)});
  NodeContext ctx = v4_context();
  ASSERT_TRUE(ctx.service_cidrs.empty());
  NodeTables tables(net.node, ctx);
  tables.program({web});
  auto from_node = [&](const std::string& addr, uint16_t port) {
    return net.node.run([&] { return reach(addr, port, kRefusedWithinMs); });
  };
  auto from_pod = [&](const std::string& addr, uint16_t port) {
    return net.pod.run([&] { return reach(addr, port, kRefusedWithinMs, "10.244.1.2"); });
  };

  // Without --service-cidr: the served port works, another port of the cluster IP is refused
  // at once (from the node, and forwarded from a pod), and nothing is dropped.
  EXPECT_EQ(from_node(vip, 80), "answer:10.244.1.2");
  EXPECT_EQ(from_node(vip, 81), "error:ECONNREFUSED");
  EXPECT_EQ(from_pod(vip, 81), "error:ECONNREFUSED");
  EXPECT_EQ(from_node("10.96.0.51", 80), "answer:10.96.0.51");

  // With the service CIDR: the unallocated address in it is dropped (no answer, no refusal).
  ctx.service_cidrs = {testing::prefix("10.96.0.0/12")};
  tables.set_context(ctx);
  EXPECT_EQ(from_node("10.96.0.51", 80), "no answer");
  EXPECT_EQ(from_node(vip, 80), "answer:10.244.1.2");
  EXPECT_EQ(from_node(vip, 81), "error:ECONNREFUSED");
  EXPECT_EQ(from_pod(vip, 81), "error:ECONNREFUSED");

  // Updates: the service leaves (its cluster IP is unallocated: dropped, no longer refused),
  // then two services come, one on 10.96.0.51 (now served, its other ports refused).
  tables.program({});
  EXPECT_EQ(from_node(vip, 81), "no answer");
  auto second = testing::state(testing::service("second", {ip("10.96.0.51")}, 80),
                               {testing::endpoint("10.244.1.2", kPodPort)});
  tables.program({web, second});
  EXPECT_EQ(from_node("10.96.0.51", 80), "answer:10.244.1.2");
  EXPECT_EQ(from_node("10.96.0.51", 81), "error:ECONNREFUSED");
  EXPECT_EQ(from_node(vip, 81), "error:ECONNREFUSED");
}

// --- 6. Detect-local modes -------------------------------------------------------------------

// How each mode is set up, and which clients it takes for pods.
struct LocalMode {
  const char* name;
  DetectLocal mode;
  bool bridge;  // the pods' side of the node is a bridge (cbr0) rather than the veth itself
  // Whether each client is local: 10.244.1.10 and 10.244.3.10 and 172.31.1.10 from the pods'
  // interface, 192.168.77.10 from another.
  bool pod1, pod3, odd, outside;
};
void PrintTo(const LocalMode& m, std::ostream* os) {
  *os << m.name;
}

class DetectLocalModes : public netns::NetnsTest,
                         public ::testing::WithParamInterface<LocalMode> {};

// A node forwarding between pods behind "vcpod0" (or the bridge cbr0 holding it), an outside
// network behind "ext0", and a server pod (10.244.2.10, on another node) behind "vs0". Local
// traffic to a cluster IP keeps its source; other traffic is masqueraded to the node's address
// towards the server. An externalTrafficPolicy Local external IP with no endpoint on this node
// is served to local clients (every endpoint) and dropped for the rest.
TEST_P(DetectLocalModes, LocalTrafficKeepsItsSourceOtherTrafficIsMasqueraded) {
  const LocalMode& m = GetParam();
  Netns node(netns::unique_prefix() + "node");
  Netns pods(netns::unique_prefix() + "pods");
  Netns outside(netns::unique_prefix() + "out");
  Netns server(netns::unique_prefix() + "server");
  sh(node, "ip link add vcpod0 type veth peer name eth0 netns " + pods.name());
  sh(node, "ip link add ext0 type veth peer name eth0 netns " + outside.name());
  sh(node, "ip link add vs0 type veth peer name eth0 netns " + server.name());
  std::string pod_side = "vcpod0";
  if (m.bridge) {
    sh(node,
       "ip link add cbr0 type bridge && ip link set vcpod0 master cbr0 && ip link set cbr0 up");
    pod_side = "cbr0";
  }
  for (const char* a : {"10.244.1.1/24", "10.244.3.1/24", "172.31.1.1/24"})
    sh(node, "ip addr add " + std::string(a) + " dev " + pod_side);
  sh(node, "ip addr add 192.168.77.1/24 dev ext0 && ip addr add 10.244.2.1/24 dev vs0");
  sh(node, "ip link set vcpod0 up && ip link set ext0 up && ip link set vs0 up");
  node.set_sysctl("net.ipv4.ip_forward", "1");
  for (const char* a : {"10.244.1.10/24", "10.244.3.10/24", "172.31.1.10/24"})
    sh(pods, "ip addr add " + std::string(a) + " dev eth0");
  sh(pods, "ip link set eth0 up && ip route add default via 10.244.1.1");
  sh(outside, "ip addr add 192.168.77.10/24 dev eth0 && ip link set eth0 up");
  sh(outside, "ip route add default via 192.168.77.1");
  sh(server, "ip addr add 10.244.2.10/24 dev eth0 && ip link set eth0 up");
  sh(server, "ip route add default via 10.244.2.1");
  PodServers servers(server, {"10.244.2.10"}, kPodPort);

  // This node's Node object: its pod CIDR (NodeCIDR) is 10.244.1.0/24 of the cluster's /16.
  auto node_obj = [](const char* pod_cidr) {
    auto snap = std::make_shared<model::Snapshot>(*testing::snapshot(1, {}));
    model::Node n;
    n.name = "node-a";
    n.pod_cidrs = {testing::prefix(pod_cidr)};
    snap->nodes.push_back(std::make_shared<const model::Node>(n));
    return snap;
  };
  NodeContext base = v4_context();  // cluster CIDRs 10.244.0.0/16
  base.detect_local = m.mode;
  base.local_interface = m.mode == DetectLocal::kBridgeInterface ? "cbr0" : "vcpod";
  NodeContext ctx = node_context_from(base, *node_obj("10.244.1.0/24"));
  ASSERT_EQ(ctx.node_pod_cidrs.size(), 1u);

  const char* vip = "10.96.0.70";
  const char* ext_ip = "203.0.113.70";
  auto svc = testing::service("peer", {ip(vip)}, 80);
  auto ext = testing::service("local-ext", {ip("10.96.0.71")}, 80);
  ext.external_ips = {ip(ext_ip)};
  ext.external_traffic_policy = model::TrafficPolicy::kLocal;
  NodeTables tables(node, ctx);
  tables.program({testing::state(svc, {testing::endpoint("10.244.2.10", kPodPort, "node-b")}),
                  testing::state(ext, {testing::endpoint("10.244.2.10", kPodPort, "node-b")})});

  struct Client {
    Netns* ns;
    const char* source;
    bool local;
  };
  auto check = [&](const std::vector<Client>& clients, const char* phase) {
    for (const auto& c : clients) {
      SCOPED_TRACE(std::string(phase) + ": from " + c.source);
      Answer a = c.ns->run([&] { return ask(vip, 80, c.source); });
      ASSERT_EQ(a.err, 0) << strerrorname_np(a.err);
      EXPECT_EQ(a.server, "10.244.2.10");
      EXPECT_EQ(a.peer, c.local ? c.source : "10.244.2.1") << (c.local ? "masqueraded" : "kept");
      std::string r = c.ns->run([&] { return reach(ext_ip, 80, kRefusedWithinMs, c.source); });
      EXPECT_EQ(r, c.local ? "answer:10.244.2.10" : "no answer") << "externalTrafficPolicy Local";
    }
  };
  check({{&pods, "10.244.1.10", m.pod1},
         {&pods, "10.244.3.10", m.pod3},
         {&pods, "172.31.1.10", m.odd},
         {&outside, "192.168.77.10", m.outside}},
        "start");

  // NodeCIDR follows the Node object: its pod CIDR moves to 10.244.3.0/24.
  if (m.mode == DetectLocal::kNodeCidr) {
    tables.set_context(node_context_from(base, *node_obj("10.244.3.0/24")));
    check({{&pods, "10.244.1.10", false}, {&pods, "10.244.3.10", true}}, "pod CIDR moved");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, DetectLocalModes,
    ::testing::Values(
        LocalMode{"ClusterCIDR", DetectLocal::kClusterCidr, false, true, true, false, false},
        LocalMode{"NodeCIDR", DetectLocal::kNodeCidr, false, true, false, false, false},
        LocalMode{"BridgeInterface", DetectLocal::kBridgeInterface, true, true, true, true, false},
        LocalMode{"InterfaceNamePrefix", DetectLocal::kInterfaceNamePrefix, false, true, true, true,
                  false}),
    [](const auto& info) { return std::string(info.param.name); });

// --- 7. loadBalancerSourceRanges and the node itself -------------------------------------------

// A VIP-like load balancer: its IP (203.0.113.10) is a local address of the node, so the node's
// own connections to it leave from that IP. kube-proxy allows them when a source range holds
// the node's IP (it adds the LB IPs to the allowed sources); otherwise they are dropped like
// any other source outside the ranges.
TEST_F(ParityTraffic, LoadBalancerSourceRangesLetTheNodeThroughWhenTheyHoldItsIp) {
  NodeWithPods net({"10.244.1.2"});
  PodServers pods(net.pod, {"10.244.1.2"}, kPodPort);
  Netns outside(netns::unique_prefix() + "out");
  sh(net.node, "ip link add ext0 type veth peer name eth0 netns " + outside.name());
  sh(net.node, "ip addr add 198.51.100.1/24 dev ext0 && ip link set ext0 up");
  sh(net.node, "ip link set lo up");
  sh(net.node, "ip addr add 192.168.50.1/32 dev lo");  // the node's primary IP
  sh(net.node, "ip addr add 203.0.113.10/32 dev lo");  // the load balancer's IP
  net.node.set_sysctl("net.ipv4.ip_forward", "1");
  sh(outside, "ip addr add 198.51.100.10/24 dev eth0 && ip link set eth0 up");
  sh(outside, "ip route add default via 198.51.100.1");

  NodeContext ctx = v4_context();
  ctx.primary_ips = {ip("192.168.50.1")};
  const char* lb_ip = "203.0.113.10";
  auto lb = [&](std::vector<const char*> ranges) {
    auto svc = testing::service("lb", {ip("10.96.0.80")}, 80);
    svc.type = model::ServiceType::kLoadBalancer;
    svc.ports[0].node_port = 30080;
    svc.load_balancer_ips = {ip(lb_ip)};
    for (const char* r : ranges) svc.load_balancer_source_ranges.push_back(testing::prefix(r));
    return testing::state(svc, {testing::endpoint("10.244.1.2", kPodPort)});
  };
  NodeTables tables(net.node, ctx);
  auto from_node = [&] { return net.node.run([&] { return reach(lb_ip, 80, kRefusedWithinMs); }); };
  auto from_outside = [&] {
    return outside.run([&] { return reach(lb_ip, 80, kRefusedWithinMs); });
  };
  // The node's connections to its local LB IP leave from that IP.
  EXPECT_NE(net.node.sh("ip route get 203.0.113.10").find("src 203.0.113.10"), std::string::npos);

  // A range holding the node's IP: the node is let through (from the LB IP), others outside
  // the ranges are dropped.
  tables.program({lb({"192.168.50.0/24"})});
  EXPECT_EQ(from_node(), "answer:10.244.1.2");
  EXPECT_EQ(from_outside(), "no answer");

  // Ranges without the node's IP: the node's connections from the LB IP are dropped too, as
  // kube-proxy's; a client inside the ranges is let through.
  tables.program({lb({"198.51.100.0/24", "10.123.0.0/16"})});
  EXPECT_EQ(from_node(), "no answer");
  EXPECT_EQ(from_outside(), "answer:10.244.1.2");

  // Both: everyone here; overlapping ranges are taken (the inner one adds nothing).
  tables.program({lb({"192.168.50.0/24", "198.51.100.0/24", "198.51.100.0/25"})});
  EXPECT_EQ(from_node(), "answer:10.244.1.2");
  EXPECT_EQ(from_outside(), "answer:10.244.1.2");
}

// --- 8. ClientIP affinity for outside clients of an externalTrafficPolicy Local service --------

// Clients outside the cluster reach an external IP of a Local-policy service with three
// endpoints on this node: each sticks to one of them while it keeps connecting, different
// clients are balanced, and after timeoutSeconds of silence a client is balanced again.
TEST_F(ParityTraffic, AffinityHoldsForOutsideClientsOfALocalPolicyService) {
  const std::vector<std::string> eps = {"10.244.1.2", "10.244.1.3", "10.244.1.4"};
  NodeWithPods net(eps);
  PodServers pods(net.pod, eps, kPodPort);
  Netns outside(netns::unique_prefix() + "out");
  std::vector<std::string> clients;
  for (int i = 0; i < 8; ++i) clients.push_back("198.51.100." + std::to_string(10 + i));
  sh(net.node, "ip link add ext0 type veth peer name eth0 netns " + outside.name());
  sh(net.node, "ip addr add 198.51.100.1/24 dev ext0 && ip link set ext0 up");
  net.node.set_sysctl("net.ipv4.ip_forward", "1");
  for (const auto& c : clients) sh(outside, "ip addr add " + c + "/24 dev eth0");
  sh(outside, "ip link set eth0 up && ip route add default via 198.51.100.1");

  constexpr uint32_t kTimeout = 3;
  const char* ext_ip = "203.0.113.90";
  auto svc = testing::service("sticky-local", {ip("10.96.0.90")}, 80);
  svc.external_ips = {ip(ext_ip)};
  svc.external_traffic_policy = model::TrafficPolicy::kLocal;
  svc.session_affinity_client_ip = true;
  svc.session_affinity_timeout_seconds = kTimeout;
  std::vector<model::MergedEndpoint> endpoints;
  for (const auto& e : eps) endpoints.push_back(testing::endpoint(e.c_str(), kPodPort));
  endpoints.push_back(testing::endpoint("10.244.2.9", kPodPort, "node-b"));  // not this node's
  NodeTables tables(net.node, v4_context());
  tables.program({testing::state(svc, endpoints)});

  // Connects `n` times from `client`: the endpoints that answered (errors by name).
  auto from = [&](const std::string& client, int n) {
    return outside.run([&] {
      std::map<std::string, int> seen;
      for (int i = 0; i < n; ++i) {
        Answer a = ask(ext_ip, 80, client);
        ++seen[a.err ? std::string("error:") + strerrorname_np(a.err) : a.server];
        if (a.err == 0) {
          EXPECT_EQ(a.peer, client) << "Local policy keeps the client's address";
        }
      }
      return seen;
    });
  };
  std::map<std::string, std::string> sticky;
  std::set<std::string> used;
  for (const auto& c : clients) {
    auto seen = from(c, c == clients[0] ? 15 : 5);
    ASSERT_EQ(seen.size(), 1u) << c << " " << show(seen);
    sticky[c] = seen.begin()->first;
    ASSERT_TRUE(std::find(eps.begin(), eps.end(), sticky[c]) != eps.end()) << sticky[c];
    used.insert(sticky[c]);
  }
  // All eight on one endpoint by chance: 1 in 3^7.
  EXPECT_GT(used.size(), 1u) << "new clients are balanced";

  // After timeoutSeconds of silence, balanced again: eight clients all staying put by chance is
  // 1 in 3^8.
  std::this_thread::sleep_for(std::chrono::seconds(kTimeout + 1));
  int moved = 0;
  for (const auto& c : clients) {
    auto seen = from(c, 3);
    ASSERT_EQ(seen.size(), 1u) << c << " " << show(seen);
    moved += seen.begin()->first != sticky[c] ? 1 : 0;
  }
  EXPECT_GT(moved, 0) << "no client moved: the affinity never expired";
}

}  // namespace
}  // namespace endpointd::proxy
