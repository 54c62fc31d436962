// Stall detection on the watch: a stream that goes silent is abandoned after the stall timeout
// and resumed from its position; a quiet stream that still carries bytes is left alone; the
// defaults and the keepalive options of the API connection.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>

#include "tests/fakeapi/fake_api.h"
#include "tests/watcher/kube_test_util.h"
#include "watcher/kube_client.h"

namespace endpointd::watcher {
namespace {

using fakeapi::FakeApiServer;
using kubetest::Recorder;
using kubetest::service_json;
using kubetest::wait_until;
using model::ObjectKind;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kStall = 2000ms;
// How late after the stall timeout the new watch may arrive: a poll wakeup and a request over
// loopback, with room for a loaded test machine.
constexpr auto kSlack = 1500ms;

class KubeStallTest : public ::testing::Test {
 protected:
  static fakeapi::Options server_options(std::chrono::milliseconds bookmark_interval) {
    fakeapi::Options o;
    o.bookmark_interval = bookmark_interval;
    return o;
  }

  explicit KubeStallTest(std::chrono::milliseconds bookmark_interval = 0ms)
      : server_(server_options(bookmark_interval)) {}

  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.error(); }

  static KubeClientConfig services_only(std::chrono::milliseconds stall) {
    KubeClientConfig c;
    c.watch_services = true;
    c.watch_endpoint_slices = false;
    c.watch_nodes = false;
    c.watch_pods = false;
    c.backoff_initial = 5ms;
    c.backoff_max = 50ms;
    c.watch_timeout_jitter = 0;
    c.watch_stall_timeout = stall;
    c.seed = 42;
    c.list_mode = ListMode::kList;  // a stalled WatchList is kube_watch_list_test's
    return c;
  }

  void start(const KubeClientConfig& cfg) {
    ClusterConfig cluster;
    cluster.server = server_.url();
    client_ = std::make_unique<KubeClient>(cluster, cfg, recorder_.sink(), registry_);
    client_->start();
  }

  std::vector<fakeapi::RecordedRequest> watch_requests() const {
    std::vector<fakeapi::RecordedRequest> out;
    for (auto& r : server_.requests()) {
      if (r.is_watch()) out.push_back(r);
    }
    return out;
  }

  double metric(const std::string& name, const std::string& kind) {
    for (const auto& fam : registry_.Collect()) {
      if (fam.name != name) continue;
      for (const auto& m : fam.metric) {
        for (const auto& l : m.label) {
          if (l.name == "kind" && l.value == kind) return m.counter.value;
        }
      }
    }
    return -1;
  }

  FakeApiServer server_;
  prometheus::Registry registry_;
  Recorder recorder_;
  std::unique_ptr<KubeClient> client_;  // declared last: stops before the server goes away
};

// The first watch delivers one event and then goes silent without closing; a change made
// during the silence arrives on the new watch, which resumes from the last event's position.
TEST_F(KubeStallTest, SilentWatchIsReplacedAfterTheStallTimeoutAndLosesNothing) {
  server_.apply(service_json("a", "10.96.0.1"));
  server_.silence_next_watch(/*events=*/1);
  start(services_only(kStall));
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));

  const uint64_t rv_b = server_.apply(service_json("b", "10.96.0.2"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/b"); }));
  const auto b_seen = Clock::now();  // the last byte the first watch carries
  ASSERT_TRUE(wait_until([&] { return server_.silent_watches() == 1; }));
  server_.apply(service_json("c", "10.96.0.3"));  // not sent on the silent watch

  ASSERT_TRUE(wait_until([&] { return watch_requests().size() == 2; }, kStall + 5s));
  const auto second = watch_requests()[1];
  EXPECT_GE(second.at - b_seen, kStall - 50ms) << "abandoned before the stall timeout";
  EXPECT_LE(second.at - b_seen, kStall + kSlack);
  EXPECT_EQ(second.param("resourceVersion"), std::to_string(rv_b));
  EXPECT_NE(second.remote_port, watch_requests()[0].remote_port) << "the stalled connection";

  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/c"); }));
  server_.apply(service_json("d", "10.96.0.4"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/d"); }));
  for (const char* k : {"Service:default/b", "Service:default/c", "Service:default/d"}) {
    EXPECT_EQ(recorder_.upserts(k), 1) << k;
  }
  EXPECT_EQ(recorder_.total_removes(), 0);

  auto st = client_->stats(ObjectKind::kService);
  EXPECT_EQ(st.stalls, 1u);
  EXPECT_EQ(st.reconnect_count("stalled"), 1u);
  EXPECT_EQ(st.reconnects_total(), 1u);
  EXPECT_EQ(st.lists, 1u);  // resumed, not relisted
  EXPECT_EQ(metric("endpointd_watch_stalls_total", "Service"), 1);
  // The silent stream is still held open by the server: the client left on its own.
  EXPECT_EQ(server_.silent_watches(), 1u);
}

// Silent from its first byte on: the list's position is where the new watch starts.
TEST_F(KubeStallTest, WatchSilentFromTheStartIsReplaced) {
  server_.apply(service_json("a", "10.96.0.1"));
  const std::string listed_rv = std::to_string(server_.resource_version());
  server_.silence_next_watch(/*events=*/0);
  start(services_only(kStall));
  ASSERT_TRUE(wait_until([&] { return server_.silent_watches() == 1; }));
  server_.apply(service_json("b", "10.96.0.2"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/b"); }, kStall + 5s));
  auto watches = watch_requests();
  ASSERT_EQ(watches.size(), 2u);
  EXPECT_EQ(watches[1].param("resourceVersion"), listed_rv);
  EXPECT_EQ(client_->stats(ObjectKind::kService).stalls, 1u);
  EXPECT_EQ(client_->stats(ObjectKind::kService).lists, 1u);
}

// A line written slowly, in pieces that each come within the stall timeout although the
// whole line takes longer: bytes, not whole events, keep a watch alive.
TEST_F(KubeStallTest, SlowBytesWithinTheTimeoutAreNotAStall) {
  constexpr auto kShort = 500ms;
  server_.apply(service_json("a", "10.96.0.1"));
  start(services_only(kShort));
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));
  server_.set_write_split(8, 200ms);  // 1.4 s for the line, 200 ms between pieces
  const auto t0 = Clock::now();
  server_.apply(service_json("b", "10.96.0.2"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/b"); }));
  EXPECT_GE(Clock::now() - t0, 2 * kShort);  // longer than the timeout, in pieces
  EXPECT_EQ(client_->stats(ObjectKind::kService).stalls, 0u);
  EXPECT_EQ(watch_requests().size(), 1u);
  EXPECT_EQ(recorder_.upserts("Service:default/b"), 1);
}

// The client's live connection (found in this process by its port, as the server saw it)
// carries the keepalive settings: curl's socket callback is wired.
TEST_F(KubeStallTest, ApiConnectionCarriesTheKeepaliveSettings) {
  KubeClientConfig cfg = services_only(kStall);
  cfg.tcp_keepalive_idle = 7s;
  cfg.tcp_keepalive_interval = 3s;
  cfg.tcp_keepalive_count = 4;
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));
  const int port = watch_requests().at(0).remote_port;
  ASSERT_GT(port, 0);
  int found = -1;
  for (int fd = 0; fd < 4096 && found < 0; ++fd) {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
        addr.sin_family == AF_INET && ntohs(addr.sin_port) == port) {
      found = fd;
    }
  }
  ASSERT_GE(found, 0) << "no socket on local port " << port;
  auto get = [&](int level, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    EXPECT_EQ(getsockopt(found, level, name, &v, &len), 0);
    return v;
  };
  EXPECT_EQ(get(SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPIDLE), 7);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPINTVL), 3);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPCNT), 4);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_USER_TIMEOUT), 19000);
}

class KubeStallBookmarkTest : public KubeStallTest {
 protected:
  KubeStallBookmarkTest() : KubeStallTest(kBookmarkEvery) {}
  static constexpr auto kBookmarkEvery = 300ms;
};

// A quiet watch (no changes at all) that receives bookmarks more often than the stall
// timeout is never abandoned, however long it lasts.
TEST_F(KubeStallBookmarkTest, QuietWatchWithBookmarksIsNotStalled) {
  constexpr auto kShort = 1000ms;
  server_.apply(service_json("a", "10.96.0.1"));
  start(services_only(kShort));
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));
  // Three stall timeouts' worth of bookmarks.
  ASSERT_TRUE(wait_until([&] { return client_->stats(ObjectKind::kService).bookmarks >= 10; }));
  auto st = client_->stats(ObjectKind::kService);
  EXPECT_EQ(st.stalls, 0u);
  EXPECT_EQ(st.reconnects_total(), 0u);
  EXPECT_EQ(watch_requests().size(), 1u);
  EXPECT_EQ(metric("endpointd_watch_stalls_total", "Service"), 0);
}

// What the defaults promise. A dead peer (no RST) is noticed by the kernel's keepalive and
// the watch re-established within a minute; the stall timeout stays above kube-apiserver's
// bookmark period, so a healthy quiet watch (one bookmark a minute) is not churned.
TEST(KubeStallDefaults, DeadPeerWithinAMinuteQuietWatchNotChurned) {
  const KubeClientConfig d;
  // After a drop, a watch that had made progress reconnects at once; the new connection may
  // take up to connect_timeout.
  const auto reconnect_slack = std::chrono::duration_cast<std::chrono::seconds>(d.connect_timeout);
  EXPECT_EQ(keepalive_dead_peer_bound(d), 30s);
  EXPECT_LE(keepalive_dead_peer_bound(d) + reconnect_slack, 60s);
  // kube-apiserver: a bookmark every 60 s, in one-second buckets popped on a 1-1.25 s tick.
  constexpr auto kApiserverBookmarkGap = 60s + 1s + 1250ms;
  EXPECT_GT(d.watch_stall_timeout, kApiserverBookmarkGap);
  EXPECT_LE(d.watch_stall_timeout + reconnect_slack, 90s);
  // Shorter than the watch itself, or it would never fire before curl's own timeout.
  EXPECT_LT(d.watch_stall_timeout, d.watch_timeout);
  // The kernel probes a quiet connection well before the stall timeout.
  EXPECT_LT(d.tcp_keepalive_idle, d.watch_stall_timeout);
}

TEST(KubeApiSocket, KeepaliveAndUserTimeoutAreSet) {
  KubeClientConfig cfg;
  cfg.tcp_keepalive_idle = 7s;
  cfg.tcp_keepalive_interval = 3s;
  cfg.tcp_keepalive_count = 4;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(tune_api_socket(fd, cfg));
  auto get = [&](int level, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    EXPECT_EQ(getsockopt(fd, level, name, &v, &len), 0);
    return v;
  };
  EXPECT_EQ(get(SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPIDLE), 7);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPINTVL), 3);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPCNT), 4);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_USER_TIMEOUT), 19000);  // 7 + 4 x 3 s
  close(fd);
}

}  // namespace
}  // namespace endpointd::watcher
