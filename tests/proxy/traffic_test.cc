// Real traffic through programmed rules: a "node" namespace with a veth into a "pod"
// namespace that serves TCP on two pod addresses.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "proxy/netlink.h"
#include "proxy/planner.h"
#include "tests/netns/netns.h"
#include "tests/proxy/fixtures.h"

namespace endpointd::proxy {
namespace {

using NetNs = netns::Netns;

int listen_on(const char* addr, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, addr, &sa.sin_addr);
  if (bind(fd, static_cast<sockaddr*>(static_cast<void*>(&sa)), sizeof(sa)) != 0 ||
      listen(fd, 64) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Connects (from `from`, when given) and reads the server's one-line answer; returns "" and
// sets *err on failure.
std::string request(const char* addr, uint16_t port, int* err, const char* from = nullptr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (from) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, from, &src.sin_addr);
    if (bind(fd, static_cast<sockaddr*>(static_cast<void*>(&src)), sizeof(src)) != 0) {
      *err = errno;
      close(fd);
      return {};
    }
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, addr, &sa.sin_addr);
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  if (connect(fd, static_cast<sockaddr*>(static_cast<void*>(&sa)), sizeof(sa)) != 0) {
    *err = errno;
    close(fd);
    return out;
  }
  char buf[64];
  ssize_t n = read(fd, buf, sizeof(buf));
  if (n > 0) out.assign(buf, static_cast<size_t>(n));
  close(fd);
  *err = 0;
  return out;
}

class Pods {
 public:
  Pods(NetNs& ns, std::vector<std::string> addrs) {
    ns.run([&] {
      for (const auto& a : addrs) {
        int fd = listen_on(a.c_str(), 8080);
        if (fd < 0) throw std::runtime_error("listen " + a);
        fds_.push_back(fd);
        names_.push_back(a);
      }
    });
    thread_ = std::thread([this] {
      while (!stop_) {
        std::vector<pollfd> p;
        for (int fd : fds_) p.push_back({fd, POLLIN, 0});
        if (poll(p.data(), p.size(), 50) <= 0) continue;
        for (size_t i = 0; i < p.size(); ++i) {
          if (!(p[i].revents & POLLIN)) continue;
          int c = accept4(fds_[i], nullptr, nullptr, SOCK_CLOEXEC);
          if (c < 0) continue;
          (void)!write(c, names_[i].data(), names_[i].size());
          close(c);
        }
      }
    });
  }
  ~Pods() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) close(fd);
  }

 private:
  std::vector<int> fds_;
  std::vector<std::string> names_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(ProxyTraffic, ClusterIpBalancesAndEmptyServiceRefuses) {
  NetNs node(netns::unique_prefix() + "node"), pod(netns::unique_prefix() + "pod");
  auto sh = [](NetNs& ns, const std::string& cmd) {
    int st = 0;
    std::string out = ns.sh(cmd, &st);
    ASSERT_EQ(st, 0) << cmd << ": " << out;
  };
  sh(node, "ip link add veth0 type veth peer name veth1 netns " + pod.name());
  sh(node, "ip addr add 10.244.1.1/24 dev veth0");
  sh(node, "ip link set veth0 up");
  sh(node, "ip route add 10.96.0.0/12 dev veth0");
  sh(pod, "ip addr add 10.244.1.2/24 dev veth1");
  sh(pod, "ip addr add 10.244.1.3/24 dev veth1");
  sh(pod, "ip link set veth1 up");
  sh(pod, "ip route add default via 10.244.1.1");
  Pods pods(pod, {"10.244.1.2", "10.244.1.3"});

  auto snap = testing::snapshot(
      1, {testing::state(
              testing::service("web", {testing::ip("10.96.0.10")}, 80),
              {testing::endpoint("10.244.1.2", 8080), testing::endpoint("10.244.1.3", 8080)}),
          testing::state(testing::service("empty", {testing::ip("10.96.0.11")}, 80), {})});
  NodeContext ctx = testing::node_context();
  ctx.ipv6 = false;
  Planner p(ctx);
  p.reset(*snap);
  node.run([&] {
    auto b = NetlinkBackend::open();
    ASSERT_TRUE(b.ok()) << b.error();
    auto r = (*b)->full_sync({&p.table(IpFamily::kV4)});
    ASSERT_TRUE(r.ok()) << r.error();
  });

  std::map<std::string, int> seen;
  node.run([&] {
    for (int i = 0; i < 40; ++i) {
      int err = 0;
      std::string who = request("10.96.0.10", 80, &err);
      ASSERT_EQ(err, 0) << std::strerror(err);
      ++seen[who];
    }
  });
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen["10.244.1.2"], 5);
  EXPECT_GT(seen["10.244.1.3"], 5);

  node.run([&] {
    auto t0 = std::chrono::steady_clock::now();
    int err = 0;
    request("10.96.0.11", 80, &err);
    EXPECT_EQ(err, ECONNREFUSED);
    // At once: the first SYN is answered with a reset. (An ICMP error met while connect()
    // holds the socket is only a soft error, refused after the SYN's retransmit, ~1 s.)
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  });
}

// ClientIP affinity with a timeout: sticky while the client keeps connecting, free to move
// after timeoutSeconds of silence, and never kept on an endpoint that was removed.
TEST(ProxyTraffic, ClientIpAffinityExpiresAndNeverKeepsARemovedEndpoint) {
  NetNs node(netns::unique_prefix() + "node"), pod(netns::unique_prefix() + "pod");
  auto sh = [](NetNs& ns, const std::string& cmd) {
    int st = 0;
    std::string out = ns.sh(cmd, &st);
    ASSERT_EQ(st, 0) << cmd << ": " << out;
  };
  // Eight clients on the node, each with its own source address.
  std::vector<std::string> clients;
  for (int i = 0; i < 8; ++i) clients.push_back("10.244.1." + std::to_string(101 + i));
  sh(node, "ip link add veth0 type veth peer name veth1 netns " + pod.name());
  sh(node, "ip addr add 10.244.1.1/24 dev veth0");
  for (const auto& c : clients) sh(node, "ip addr add " + c + "/32 dev veth0");
  sh(node, "ip link set veth0 up");
  sh(node, "ip route add 10.96.0.0/12 dev veth0");
  std::vector<std::string> eps = {"10.244.1.2", "10.244.1.3", "10.244.1.4"};
  for (const auto& e : eps) sh(pod, "ip addr add " + e + "/24 dev veth1");
  sh(pod, "ip link set veth1 up");
  sh(pod, "ip route add default via 10.244.1.1");
  Pods pods(pod, eps);

  constexpr uint32_t kTimeout = 3;
  auto svc = testing::service("sticky", {testing::ip("10.96.0.20")}, 80);
  svc.session_affinity_client_ip = true;
  svc.session_affinity_timeout_seconds = kTimeout;
  auto endpoints = [&](const std::vector<std::string>& addrs) {
    std::vector<model::MergedEndpoint> v;
    for (const auto& a : addrs) v.push_back(testing::endpoint(a.c_str(), 8080));
    return v;
  };
  auto s1 = testing::snapshot(1, {testing::state(svc, endpoints(eps))});
  NodeContext ctx = testing::node_context();
  ctx.ipv6 = false;
  Planner p(ctx);
  p.reset(*s1);
  std::unique_ptr<NetlinkBackend> backend;
  node.run([&] {
    auto b = NetlinkBackend::open();
    ASSERT_TRUE(b.ok()) << b.error();
    backend = std::move(*b);
    auto r = backend->full_sync({&p.table(IpFamily::kV4)});
    ASSERT_TRUE(r.ok()) << r.error();
  });
  ASSERT_NE(backend, nullptr);

  // Connects from `client` `n` times; the endpoints that answered, or "" for a failure.
  auto connect_n = [&](const std::string& client, int n) {
    std::map<std::string, int> seen;
    node.run([&] {
      for (int i = 0; i < n; ++i) {
        int err = 0;
        std::string who = request("10.96.0.20", 80, &err, client.c_str());
        EXPECT_EQ(err, 0) << client << ": " << std::strerror(err);
        ++seen[who];
      }
    });
    return seen;
  };
  auto only = [](const std::map<std::string, int>& seen) {
    return seen.size() == 1 ? seen.begin()->first
                            : std::string("several: ") + std::to_string(seen.size());
  };

  // (1) Sticky: 20 connections from one client, one endpoint; every client has its own.
  std::map<std::string, std::string> sticky;
  for (const auto& c : clients) {
    auto seen = connect_n(c, c == clients[0] ? 20 : 5);
    sticky[c] = only(seen);
    ASSERT_EQ(seen.size(), 1u) << c;
    ASSERT_NE(std::find(eps.begin(), eps.end(), sticky[c]), eps.end()) << sticky[c];
  }
  // Without them the eight would all be on one endpoint only with odds of 1 in 3^7.
  std::set<std::string> used;
  for (const auto& [_, e] : sticky) used.insert(e);
  EXPECT_GT(used.size(), 1u) << "a new client is balanced, not sent to one endpoint";
  // nft lists what endpointd programmed, the packet path's records included.
  int listed = 0;
  std::string dump = node.sh("nft list ruleset", &listed);
  EXPECT_EQ(listed, 0) << dump;
  if (getenv("AFF_DUMP")) fprintf(stderr, "%s\n", dump.c_str());
  EXPECT_NE(dump.find("update @affinity"), std::string::npos) << dump;
  for (const auto& c : clients)
    EXPECT_NE(dump.find(c + " . 10.96.0.20 . tcp . 80 "), std::string::npos) << c << dump;

  // Each new connection restarts the client's timer: connecting every 2 s for longer than the
  // timeout in all keeps it where it is.
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    EXPECT_EQ(only(connect_n(clients[0], 1)), sticky[clients[0]])
        << "after " << 2 * (i + 1) << " s";
  }

  // (2) After timeoutSeconds of silence a client is balanced again: with the endpoints
  // unchanged, eight clients that each stay where they were has odds of 1 in 3^8.
  std::this_thread::sleep_for(std::chrono::seconds(kTimeout + 1));
  std::map<std::string, std::string> after;
  int moved = 0;
  for (const auto& c : clients) {
    auto seen = connect_n(c, 3);
    ASSERT_EQ(seen.size(), 1u) << c << " is sticky again at once";
    after[c] = seen.begin()->first;
    moved += after[c] != sticky[c] ? 1 : 0;
  }
  EXPECT_GT(moved, 0) << "no client moved: the affinity never expired";

  // (3) The endpoint clients[0] sticks to is removed: its next connections go to one of the
  // others at once (it still listens, so a stale record would be answered by it).
  const std::string gone = after[clients[0]];
  std::vector<std::string> rest;
  for (const auto& e : eps) {
    if (e != gone) rest.push_back(e);
  }
  auto s2 = testing::snapshot(2, {testing::state(svc, endpoints(rest))});
  auto changes = p.update(*s2, model::diff(s1.get(), *s2));
  node.run([&] {
    auto r = backend->apply(changes);
    ASSERT_TRUE(r.ok()) << r.error();
  });
  for (const auto& c : clients) {
    auto seen = connect_n(c, c == clients[0] ? 10 : 3);
    EXPECT_EQ(seen.count(gone), 0u) << c << " still reaches the removed " << gone;
    EXPECT_EQ(seen.count(""), 0u) << c;
    EXPECT_EQ(seen.size(), 1u) << c << " sticks to its new endpoint";
    if (after[c] != gone) {
      EXPECT_EQ(only(seen), after[c]) << c << " was not on the removed endpoint and stays";
    }
  }

  // (4) The service loses its affinity by an update: nothing jumps to affinity-record any more
  // and one client is balanced again (20 connections on one of two endpoints: 1 in 2^19).
  auto plain = svc;
  plain.session_affinity_client_ip = false;
  auto s3 = testing::snapshot(3, {testing::state(plain, endpoints(rest))});
  changes = p.update(*s3, model::diff(s2.get(), *s3));
  node.run([&] {
    auto r = backend->apply(changes);
    ASSERT_TRUE(r.ok()) << r.error();
  });
  dump = node.sh("nft list ruleset", &listed);
  ASSERT_EQ(listed, 0) << dump;
  EXPECT_EQ(dump.find("jump affinity-record"), std::string::npos) << dump;
  EXPECT_GT(connect_n(clients[0], 20).size(), 1u) << "still sticky without affinity";

  // (5) It gains affinity again by an update: the first affinity service brings the jumps back
  // and each client sticks from its first connection on.
  auto s4 = testing::snapshot(4, {testing::state(svc, endpoints(rest))});
  changes = p.update(*s4, model::diff(s3.get(), *s4));
  node.run([&] {
    auto r = backend->apply(changes);
    ASSERT_TRUE(r.ok()) << r.error();
  });
  dump = node.sh("nft list ruleset", &listed);
  ASSERT_EQ(listed, 0) << dump;
  EXPECT_NE(dump.find("jump affinity-record"), std::string::npos) << dump;
  for (const auto& c : {clients[0], clients[1]}) {
    auto seen = connect_n(c, 20);
    EXPECT_EQ(seen.count(""), 0u) << c;
    EXPECT_EQ(seen.size(), 1u) << c << " is not sticky after affinity came back";
  }
  node.run([&] { backend.reset(); });
}

}  // namespace
}  // namespace endpointd::proxy
