// NewFlowWatch with real connections: a "client" namespace opens TCP connections to two
// addresses of a "node" namespace, whose conntrack announces each as NEW; the watch sees only
// the addresses it was told to, filtered in the kernel.
#include "proxy/new_flows.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "tests/netns/netns.h"

namespace endpointd::proxy {
namespace {

using namespace std::chrono_literals;

model::IpAddr ip(const char* s) {
  return *model::IpAddr::parse(s);
}

sockaddr_in at(const char* addr, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, addr, &sa.sin_addr);
  return sa;
}

int listen_on(const char* addr, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa = at(addr, port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(fd, 64) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool connect_to(const char* addr, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in sa = at(addr, port);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  close(fd);
  return ok;
}

class NewFlowWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = std::make_unique<netns::Netns>(netns::unique_prefix() + "-flows-node");
    client_ = std::make_unique<netns::Netns>(netns::unique_prefix() + "-flows-client");
    node_->exec_checked({"ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1",
                         "netns", client_->name()});
    node_->exec_checked({"ip", "addr", "add", "10.77.0.2/24", "dev", "veth0"});
    node_->exec_checked({"ip", "addr", "add", "10.77.0.3/24", "dev", "veth0"});
    node_->exec_checked({"ip", "link", "set", "veth0", "up"});
    client_->exec_checked({"ip", "addr", "add", "10.77.0.1/24", "dev", "veth1"});
    client_->exec_checked({"ip", "link", "set", "veth1", "up"});
    // Connection tracking runs in a namespace once a rule there needs it.
    node_->sh(
        "nft add table inet flows && nft add chain inet flows in '{ type filter hook input "
        "priority 0; }' && nft add rule inet flows in ct state new counter");
    for (const char* a : {"10.77.0.2", "10.77.0.3"}) {
      int fd = node_->run([&] { return listen_on(a, 8080); });
      ASSERT_GE(fd, 0) << a;
      listeners_.push_back(fd);
    }
    open_watch(4096);
  }
  // Opens the watch inside the node's namespace (its socket stays there).
  void open_watch(size_t queue_max) {
    std::string error;
    NewFlowWatch* w = nullptr;
    node_->run([&] {
      auto r = NewFlowWatch::open(queue_max);
      if (r.ok())
        w = r.value().release();
      else
        error = r.error();
    });
    watch_.reset(w);
    ASSERT_NE(w, nullptr) << error;
  }
  void TearDown() override {
    watch_.reset();
    for (int fd : listeners_) close(fd);
  }

  // Connects from the client to each address in turn (each succeeds: the listeners are there).
  void connect_all(std::initializer_list<const char*> addrs) {
    for (const char* a : addrs) ASSERT_TRUE(client_->run([&] { return connect_to(a, 8080); })) << a;
  }
  // What the watch saw, waiting until `n` flows arrived or 3 s passed, then 200 ms more for any
  // that should not come.
  std::vector<NewFlow> seen(size_t n) {
    std::vector<NewFlow> out;
    auto until = std::chrono::steady_clock::now() + 3s;
    while (out.size() < n && std::chrono::steady_clock::now() < until) {
      for (auto& f : watch_->take()) out.push_back(f);
      std::this_thread::sleep_for(10ms);
    }
    std::this_thread::sleep_for(200ms);
    for (auto& f : watch_->take()) out.push_back(f);
    return out;
  }

  std::unique_ptr<netns::Netns> node_, client_;
  std::vector<int> listeners_;
  std::unique_ptr<NewFlowWatch> watch_;
};

// The watched address's new connections are seen with their sender; the other address's never
// reach the reader (the kernel's filter dropped them: nothing filtered here).
TEST_F(NewFlowWatchTest, SeesNewConnectionsToTheWatchedAddressOnly) {
  ASSERT_TRUE(watch_->watch({ip("10.77.0.2")}).ok());
  // The other address first: were its event let through, it would arrive before the watched
  // one's.
  connect_all({"10.77.0.3", "10.77.0.2", "10.77.0.3", "10.77.0.2"});
  auto flows = seen(2);
  ASSERT_EQ(flows.size(), 2u);
  for (const auto& f : flows) {
    EXPECT_EQ(f.src, ip("10.77.0.1"));
    EXPECT_EQ(f.dst, ip("10.77.0.2"));
    EXPECT_EQ(f.dst_port, 8080);
    EXPECT_EQ(f.l4proto, IPPROTO_TCP);
  }
  auto st = watch_->stats();
  EXPECT_TRUE(st.kernel_filter);
  EXPECT_EQ(st.filtered_here, 0u) << "the kernel filter let another address's events through";
  EXPECT_EQ(st.seen, 2u);
}

// Nothing watched: nothing seen. Then another address: only its connections.
TEST_F(NewFlowWatchTest, FollowsTheWatchedSet) {
  ASSERT_TRUE(watch_->watch({}).ok());
  connect_all({"10.77.0.2", "10.77.0.3"});
  EXPECT_TRUE(seen(1).empty());
  ASSERT_TRUE(watch_->watch({ip("10.77.0.3")}).ok());
  connect_all({"10.77.0.2", "10.77.0.3"});
  auto flows = seen(1);
  ASSERT_EQ(flows.size(), 1u);
  EXPECT_EQ(flows[0].dst, ip("10.77.0.3"));
}

// A reader that does not take: the queue stays at its bound and the rest are counted dropped.
TEST_F(NewFlowWatchTest, AFullQueueDropsAndCounts) {
  watch_.reset();
  open_watch(2);
  ASSERT_TRUE(watch_->watch({ip("10.77.0.2")}).ok());
  connect_all({"10.77.0.2", "10.77.0.2", "10.77.0.2", "10.77.0.2", "10.77.0.2"});
  auto until = std::chrono::steady_clock::now() + 3s;
  while (watch_->stats().seen + watch_->stats().dropped < 5 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  auto st = watch_->stats();
  EXPECT_EQ(st.seen, 2u);
  EXPECT_EQ(st.dropped, 3u);
  EXPECT_EQ(watch_->take().size(), 2u);
}

}  // namespace
}  // namespace endpointd::proxy
