// Real traffic through programmed rules: a "node" namespace with a veth into a "pod"
// namespace that serves TCP on two pod addresses.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
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

// Connects and reads the server's one-line answer; returns "" and sets *err on failure.
std::string request(const char* addr, uint16_t port, int* err) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
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

}  // namespace
}  // namespace endpointd::proxy
