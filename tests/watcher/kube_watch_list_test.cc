// How the API client gets a kind's state: WatchList where the API server offers it (the
// default), lists where it is off or ignored, never a state older than one held, and the
// faults of a WatchList stream (no end bookmark, a 410 among the initial events, an end or a
// bookmark that goes back, a server that ignores resourceVersion=0).
#include <gtest/gtest.h>
#include <prometheus/registry.h>

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

fakeapi::Options with_watch_list(fakeapi::Options::WatchList mode,
                                 std::chrono::milliseconds bookmarks = 0ms) {
  fakeapi::Options o;
  o.watch_list = mode;
  o.bookmark_interval = bookmarks;
  return o;
}

class WatchListTest : public ::testing::Test {
 protected:
  explicit WatchListTest(fakeapi::Options o = {}) : server_(std::move(o)) {}
  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.error(); }

  static KubeClientConfig services_only() {
    KubeClientConfig c;
    c.watch_services = true;
    c.watch_endpoint_slices = false;
    c.watch_nodes = false;
    c.watch_pods = false;
    c.backoff_initial = 5ms;
    c.backoff_max = 50ms;
    c.relist_spread = 5ms;
    c.watch_timeout_jitter = 0;
    c.seed = 7;
    return c;
  }

  void start(KubeClientConfig cfg = services_only()) {
    ClusterConfig cluster;
    cluster.server = server_.url();
    client_ = std::make_unique<KubeClient>(cluster, cfg, recorder_.sink(), registry_);
    client_->start();
  }

  std::vector<fakeapi::RecordedRequest> watches() const {
    std::vector<fakeapi::RecordedRequest> out;
    for (auto& r : server_.requests())
      if (r.is_watch()) out.push_back(r);
    return out;
  }
  std::vector<fakeapi::RecordedRequest> lists() const {
    std::vector<fakeapi::RecordedRequest> out;
    for (auto& r : server_.requests())
      if (!r.is_watch() && r.path == "/api/v1/services") out.push_back(r);
    return out;
  }
  KindStats stats() const { return client_->stats(ObjectKind::kService); }
  uint64_t fallbacks(const std::string& reason) const {
    auto s = stats();
    auto it = s.watch_list_fallbacks.find(reason);
    return it == s.watch_list_fallbacks.end() ? 0 : it->second;
  }
  void three_services() {
    server_.apply(service_json("a", "10.96.0.1"));
    server_.apply(service_json("b", "10.96.0.2"));
    server_.apply(service_json("c", "10.96.0.3"));
  }

  FakeApiServer server_;
  prometheus::Registry registry_;
  Recorder recorder_;
  std::unique_ptr<KubeClient> client_;  // declared last: stops before the server goes away
};

// The default: one watch whose initial events are the state, consistent (no version), posted
// as one Replace; no list at all; changes then come on the same stream.
TEST_F(WatchListTest, TheStateComesByWatchListAndNoListIsMade) {
  three_services();
  start();
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 3u);
  EXPECT_EQ(recorder_.total_upserts(), 0) << "the initial events are the Replace, not upserts";
  EXPECT_TRUE(lists().empty());
  auto w = watches();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].param("sendInitialEvents"), "true");
  EXPECT_EQ(w[0].param("resourceVersionMatch"), "NotOlderThan");
  EXPECT_EQ(w[0].param("allowWatchBookmarks"), "true");
  EXPECT_FALSE(w[0].has_param("resourceVersion")) << "the first state is a consistent one";
  EXPECT_EQ(stats().resource_version, std::to_string(server_.resource_version()));
  EXPECT_EQ(stats().watch_lists, 1u);
  EXPECT_EQ(stats().lists, 1u);

  const uint64_t rv = server_.apply(service_json("d", "10.96.0.4"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/d"); }));
  EXPECT_EQ(watches().size(), 1u) << "the change came on the WatchList's own stream";
  EXPECT_EQ(stats().resource_version, std::to_string(rv));
}

// After an expired watch the state is asked for again by WatchList, not older than the
// version this agent held: a state never goes back.
TEST_F(WatchListTest, AfterAnExpiredWatchTheStateIsNotOlderThanTheOneHeld) {
  three_services();
  start();
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));
  const std::string held = stats().resource_version;
  server_.remove("services", "default", "b");
  ASSERT_TRUE(wait_until([&] { return recorder_.total_removes() == 1; }));
  const std::string held_after = stats().resource_version;
  EXPECT_NE(held_after, held);
  server_.expire_next_watch();
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 2; }));
  auto w = watches();
  ASSERT_GE(w.size(), 3u);  // the WatchList, the expired watch, the new WatchList
  EXPECT_EQ(w[1].param("resourceVersion"), held_after);
  EXPECT_FALSE(w[1].has_param("sendInitialEvents"));
  EXPECT_EQ(w[2].param("sendInitialEvents"), "true");
  EXPECT_EQ(w[2].param("resourceVersion"), held_after);
  EXPECT_EQ(w[2].param("resourceVersionMatch"), "NotOlderThan");
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 2u);
  EXPECT_TRUE(lists().empty());
  EXPECT_EQ(stats().relists, 1u);
  EXPECT_EQ(stats().reconnect_count("expired"), 1u);
}

// A 410 among the initial events: nothing of the cut state is posted; the WatchList starts
// over and the state comes whole, once.
TEST_F(WatchListTest, AnExpiryAmongTheInitialEventsPostsNothingAndStartsOver) {
  three_services();
  server_.expire_next_watch_list_after(1);
  start();
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 3u);
  EXPECT_EQ(recorder_.total_upserts(), 0);
  EXPECT_EQ(stats().reconnect_count("expired"), 1u);
  EXPECT_EQ(watches().size(), 2u);
  EXPECT_EQ(fallbacks("refused") + fallbacks("no_end") + fallbacks("not_offered"), 0u);
  EXPECT_TRUE(lists().empty());
}

// A server that sends the state but never its end: abandoned at the bound, then listed
// (consistent) and watched as before; WatchList is not tried again by this process.
TEST_F(WatchListTest, NoEndBookmarkWithinTheBoundIsListedInstead) {
  three_services();
  server_.withhold_initial_events_end(true);
  KubeClientConfig cfg = services_only();
  cfg.list_stream_timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 3u);
  EXPECT_EQ(recorder_.total_upserts(), 0) << "the unended initial events were not posted";
  EXPECT_EQ(fallbacks("no_end"), 1u);
  auto l = lists();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_FALSE(l[0].has_param("resourceVersion")) << "a consistent list";
  // Expired later: a list again, not a WatchList. (The abandoned stream may still be open on
  // the server's side until it next writes.)
  ASSERT_TRUE(wait_until([&] { return watches().size() == 2; }));
  server_.expire_next_watch();
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 2; }));
  EXPECT_EQ(lists().size(), 2u);
  size_t watch_lists = 0;
  for (const auto& w : watches()) watch_lists += w.param("sendInitialEvents") == "true";
  EXPECT_EQ(watch_lists, 1u);
}

// An end bookmark older than the version held (a lagging server) is not taken: the state is
// listed, not older than the version held, and the next relist tries WatchList again. A
// plain bookmark that goes back does not move the watch position either.
TEST_F(WatchListTest, AnEndOrABookmarkThatGoesBackIsNotTaken) {
  three_services();
  start();
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));
  const uint64_t held = server_.apply(service_json("d", "10.96.0.4"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/d"); }));

  server_.send_raw_watch_line("services",
                              R"({"type":"BOOKMARK","object":{"kind":"Service","apiVersion":"v1",)"
                              R"("metadata":{"resourceVersion":")" +
                                  std::to_string(held - 2) + R"("}}})");
  ASSERT_TRUE(wait_until([&] { return stats().bookmarks_behind == 1; }));
  EXPECT_EQ(stats().resource_version, std::to_string(held));

  server_.set_initial_events_end_version(held - 1);
  server_.expire_next_watch();
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 2; }));
  EXPECT_EQ(fallbacks("behind"), 1u);
  EXPECT_EQ(stats().bookmarks_behind, 2u);
  auto l = lists();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].param("resourceVersion"), std::to_string(held));
  EXPECT_EQ(l[0].param("resourceVersionMatch"), "NotOlderThan");
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 4u);
  EXPECT_EQ(recorder_.total_removes(), 0);
}

// A relist whose version the API server's cache has not reached (504) asks again at once
// without a version: a consistent state, still by WatchList.
TEST_F(WatchListTest, AVersionTheCacheHasNotReachedIsAskedAgainConsistent) {
  three_services();
  start();
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));
  server_.set_cache_behind(true);
  server_.expire_next_watch();
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] {
    auto w = watches();  // the WatchList, the expired watch, the 504, the consistent one
    return w.size() >= 4 && w.back().param("sendInitialEvents") == "true" &&
           !w.back().has_param("resourceVersion");
  }));
  server_.set_cache_behind(false);
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 2; }));
  EXPECT_EQ(stats().reconnect_count("version_unavailable"), 1u);
  EXPECT_TRUE(lists().empty());
}

class WatchListOffTest : public WatchListTest {
 protected:
  WatchListOffTest() : WatchListTest(with_watch_list(fakeapi::Options::WatchList::kOff)) {}
};

// A server whose WatchList is off refuses it (422): listed at once, consistent; counted.
TEST_F(WatchListOffTest, ARefusedWatchListIsListedAtOnce) {
  three_services();
  start();
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 3u);
  EXPECT_EQ(fallbacks("refused"), 1u);
  ASSERT_EQ(lists().size(), 1u);
  EXPECT_FALSE(lists()[0].has_param("resourceVersion"));
  auto w = watches();
  ASSERT_EQ(w.size(), 2u);  // the refused WatchList, then the watch from the list
  EXPECT_EQ(w[1].param("resourceVersion"), stats().resource_version);
  EXPECT_EQ(stats().watch_lists, 0u);
}

class WatchListIgnoredTest : public WatchListTest {
 protected:
  WatchListIgnoredTest()
      : WatchListTest(with_watch_list(fakeapi::Options::WatchList::kIgnored, 100ms)) {}
};

// A server from before WatchList ignores its parameters: it sends the state as ADDED events
// and bookmarks without the end annotation. The first such bookmark ends the attempt (well
// before the bound); the state is listed.
TEST_F(WatchListIgnoredTest, AServerThatIgnoresSendInitialEventsIsListed) {
  three_services();
  KubeClientConfig cfg = services_only();
  cfg.list_stream_timeout = 20s;
  const auto t0 = std::chrono::steady_clock::now();
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(fallbacks("not_offered"), 1u);
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 3u);
  EXPECT_EQ(recorder_.total_upserts(), 0);
  EXPECT_EQ(lists().size(), 1u);
}

// --api-list-mode=cache: the first list from the watch cache (resourceVersion=0). A server
// that ignores that (and answers a consistent, paged list) is read just the same; a relist
// after an expired watch is not older than the version held.
TEST_F(WatchListTest, CacheModeListsAtVersionZeroAndRelistsNotOlder) {
  for (int i = 0; i < 7; ++i)
    server_.apply(service_json("s" + std::to_string(i), "10.96.1." + std::to_string(i + 1)));
  KubeClientConfig cfg = services_only();
  cfg.list_mode = ListMode::kCache;
  cfg.page_size = 3;
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced() && server_.open_watches() == 1; }));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 7u);
  auto l = lists();
  ASSERT_EQ(l.size(), 3u);  // the server paged it
  EXPECT_EQ(l[0].param("resourceVersion"), "0");
  EXPECT_FALSE(l[0].has_param("resourceVersionMatch"));
  const std::string held = stats().resource_version;
  server_.expire_next_watch();
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 2; }));
  l = lists();
  ASSERT_GE(l.size(), 4u);
  EXPECT_EQ(l[3].param("resourceVersion"), held);
  EXPECT_EQ(l[3].param("resourceVersionMatch"), "NotOlderThan");
  for (const auto& w : watches()) EXPECT_FALSE(w.has_param("sendInitialEvents"));
}

}  // namespace
}  // namespace endpointd::watcher
