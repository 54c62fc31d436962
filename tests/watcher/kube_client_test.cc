// The API client against the fake API server: sync, events, paging, bookmarks, 410 Gone,
// dropped streams, backoff, token rotation, malformed objects, selectors, prompt stop.
#include <gtest/gtest.h>
#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <memory>
#include <set>

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

constexpr const char* kSvcA = "Service:default/a";
constexpr const char* kSvcB = "Service:default/b";

class KubeClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.error(); }

  KubeClientConfig services_only() {
    KubeClientConfig c;
    c.watch_services = true;
    c.watch_endpoint_slices = false;
    c.watch_nodes = false;
    c.watch_pods = false;
    c.backoff_initial = 5ms;
    c.backoff_max = 50ms;
    c.watch_timeout_jitter = 0;
    c.relist_spread = 5ms;
    c.seed = 42;
    // These tests are of lists (pages, continue tokens, protobuf, versions): WatchList, the
    // default, is kube_watch_list_test's.
    c.list_mode = ListMode::kList;
    return c;
  }

  void start(KubeClientConfig cfg, ClusterConfig cluster = {}) {
    if (cluster.server.empty()) cluster.server = server_.url();
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
  std::vector<fakeapi::RecordedRequest> list_requests(const std::string& path) const {
    std::vector<fakeapi::RecordedRequest> out;
    for (auto& r : server_.requests()) {
      if (!r.is_watch() && r.path == path) out.push_back(r);
    }
    return out;
  }
  bool watching() const { return server_.open_watches() > 0; }

  double metric(const std::string& name, const std::map<std::string, std::string>& labels) {
    for (const auto& fam : registry_.Collect()) {
      if (fam.name != name) continue;
      for (const auto& m : fam.metric) {
        bool all = true;
        for (const auto& [k, v] : labels) {
          bool found = false;
          for (const auto& l : m.label) found |= l.name == k && l.value == v;
          all &= found;
        }
        if (all) return m.counter.value;
      }
    }
    return 0;
  }

  FakeApiServer server_;
  prometheus::Registry registry_;
  Recorder recorder_;
  std::unique_ptr<KubeClient> client_;  // declared last: stops before the server goes away
};

TEST_F(KubeClientTest, InitialSyncPostsOneReplacePerKind) {
  server_.apply(service_json("a", "10.96.0.1"));
  server_.apply(service_json("b", "10.96.0.2"));
  server_.apply(kubetest::slice_json("a-1", "a", "10.244.1.1"));
  server_.apply(kubetest::node_json("n1"));
  KubeClientConfig cfg = services_only();
  cfg.watch_endpoint_slices = true;
  cfg.watch_nodes = true;
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
  EXPECT_EQ(recorder_.replaces(ObjectKind::kEndpointSlice), 1);
  EXPECT_EQ(recorder_.replaces(ObjectKind::kNode), 1);
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 2u);
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kEndpointSlice), 1u);
  EXPECT_TRUE(recorder_.has("Node:n1"));
  EXPECT_TRUE(client_->stats(ObjectKind::kService).synced);
  EXPECT_EQ(client_->stats(ObjectKind::kService).resource_version,
            std::to_string(server_.resource_version()));

  auto lists = list_requests("/api/v1/services");
  ASSERT_FALSE(lists.empty());
  const auto& req = lists.front();
  EXPECT_EQ(req.header("accept"), "application/json");
  EXPECT_TRUE(req.header("user-agent").starts_with("endpointd/")) << req.header("user-agent");
  EXPECT_NE(req.header("accept-encoding").find("gzip"), std::string::npos);
  // No label selector: another proxy's services are listed too, for DNS and the feed.
  EXPECT_FALSE(req.has_param("labelSelector"));
  EXPECT_EQ(req.param("limit"), "500");
  EXPECT_FALSE(
      list_requests("/apis/discovery.k8s.io/v1/endpointslices").front().has_param("labelSelector"));
  EXPECT_FALSE(list_requests("/api/v1/nodes").front().has_param("labelSelector"));

  // The watch starts at the list's resourceVersion with bookmarks and a timeout.
  ASSERT_TRUE(wait_until([&] { return watch_requests().size() >= 3; }));
  for (const auto& w : watch_requests()) {
    EXPECT_EQ(w.param("resourceVersion"), std::to_string(server_.resource_version()));
    EXPECT_EQ(w.param("allowWatchBookmarks"), "true");
    EXPECT_EQ(w.param("timeoutSeconds"), "300");
  }
}

TEST_F(KubeClientTest, WatchEventsBecomeUpsertAndRemove) {
  server_.apply(service_json("a", "10.96.0.1"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));

  server_.apply(service_json("b", "10.96.0.2"));  // ADDED
  ASSERT_TRUE(wait_until([&] { return recorder_.has(kSvcB); }));
  server_.apply(service_json("a", "10.96.0.1", 443));  // MODIFIED
  ASSERT_TRUE(wait_until([&] { return recorder_.upserts(kSvcA) == 1; }));
  auto a = recorder_.get(kSvcA);
  ASSERT_TRUE(a);
  EXPECT_EQ(std::get<model::Service>(*a).ports.at(0).port, 443);
  server_.remove("services", "default", "b");  // DELETED
  ASSERT_TRUE(wait_until([&] { return !recorder_.has(kSvcB); }));
  EXPECT_EQ(recorder_.removes(kSvcB), 1);

  auto st = client_->stats(ObjectKind::kService);
  EXPECT_EQ(st.added, 1u);
  EXPECT_EQ(st.modified, 1u);
  EXPECT_EQ(st.deleted, 1u);
  EXPECT_EQ(st.resource_version, std::to_string(server_.resource_version()));
  EXPECT_EQ(metric("endpointd_watch_events_total", {{"kind", "Service"}, {"type", "ADDED"}}), 1);
  EXPECT_EQ(metric("endpointd_watch_events_total", {{"kind", "Service"}, {"type", "MODIFIED"}}), 1);
  EXPECT_EQ(metric("endpointd_watch_events_total", {{"kind", "Service"}, {"type", "DELETED"}}), 1);
}

TEST_F(KubeClientTest, ListIsPagedWithLimitAndContinue) {
  for (int i = 0; i < 7; ++i)
    server_.apply(service_json("s" + std::to_string(i), "10.96.1." + std::to_string(i + 1)));
  auto cfg = services_only();
  cfg.page_size = 2;
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 7u);
  auto lists = list_requests("/api/v1/services");
  ASSERT_EQ(lists.size(), 4u);
  EXPECT_FALSE(lists[0].has_param("continue"));
  std::set<std::string> tokens;
  for (size_t i = 0; i < lists.size(); ++i) {
    EXPECT_EQ(lists[i].param("limit"), "2");
    if (i > 0) {
      EXPECT_FALSE(lists[i].param("continue").empty());
      tokens.insert(lists[i].param("continue"));
    }
  }
  EXPECT_EQ(tokens.size(), 3u);
  EXPECT_EQ(client_->stats(ObjectKind::kService).list_pages, 4u);
}

// The benchmarks' fake API can answer lists from pages it encoded beforehand; the client reads
// them as it reads live ones (compressed pages included), and a change makes lists live again.
TEST_F(KubeClientTest, PreparedListPagesReadAsLiveOnes) {
  for (int i = 0; i < 1200; ++i)
    server_.apply(service_json("s" + std::to_string(i),
                               "10.96." + std::to_string(i / 200) + "." + std::to_string(i % 200)));
  server_.prepare_lists(500);
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 1200u);
  EXPECT_TRUE(recorder_.has("Service:default/s1199"));
  EXPECT_EQ(server_.prepared_pages_served(), 3u);
  EXPECT_EQ(client_->stats(ObjectKind::kService).list_pages, 3u);
  client_.reset();

  server_.apply(service_json("late", "10.96.9.1"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 1201u);
  EXPECT_EQ(server_.prepared_pages_served(), 3u);
}

// The kubeconfig's disable-compression: neither lists nor watches ask for gzip, and a list
// large enough that the API server would compress it is read as it comes.
TEST_F(KubeClientTest, DisableCompressionAsksForNoGzip) {
  for (int i = 0; i < 1200; ++i)
    server_.apply(service_json("s" + std::to_string(i),
                               "10.96." + std::to_string(i / 200) + "." + std::to_string(i % 200)));
  ClusterConfig cluster;
  cluster.server = server_.url();
  cluster.disable_compression = true;
  start(services_only(), cluster);
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 1200u);
  auto lists = list_requests("/api/v1/services");
  ASSERT_EQ(lists.size(), 3u);
  for (const auto& r : lists) EXPECT_EQ(r.header("accept-encoding"), "") << r.path;
  ASSERT_FALSE(watch_requests().empty());
  EXPECT_EQ(watch_requests().front().header("accept-encoding"), "");
}

// EndpointSlice lists are asked for in protobuf, as kube-proxy asks, and read as the API server
// answers: the same objects from protobuf pages, from JSON pages when the server has no
// protobuf, and when the agent asks for JSON (--kube-api-content-type application/json).
// Services, and every watch, stay JSON.
TEST_F(KubeClientTest, EndpointSliceListsComeInProtobufOrJsonAlike) {
  for (int i = 0; i < 5; ++i)
    server_.apply(
        kubetest::slice_json("web-" + std::to_string(i), "web", "10.0.0." + std::to_string(i + 1)));
  server_.apply(service_json("web"));
  const std::string slices = "/apis/discovery.k8s.io/v1/endpointslices";
  struct Run {
    std::vector<model::Object> objects;
    KindStats stats;
    std::vector<fakeapi::RecordedRequest> lists, services, watches;
  };
  auto run = [&](bool ask_protobuf, bool serve_protobuf) {
    server_.set_serve_protobuf(serve_protobuf);
    const size_t before = server_.requests().size();
    auto cfg = services_only();
    cfg.watch_endpoint_slices = true;
    cfg.page_size = 2;
    cfg.protobuf_lists = ask_protobuf;
    Recorder rec;
    prometheus::Registry registry;
    ClusterConfig cluster;
    cluster.server = server_.url();
    KubeClient client(cluster, cfg, rec.sink(), registry);
    client.start();
    EXPECT_TRUE(wait_until([&] {
      auto all = server_.requests();
      return client.synced() &&
             std::count_if(all.begin() + static_cast<ptrdiff_t>(before), all.end(),
                           [](const auto& q) { return q.is_watch(); }) == 2;
    }));
    Run r;
    for (int i = 0; i < 5; ++i)
      if (auto o = rec.get("EndpointSlice:default/web-" + std::to_string(i)))
        r.objects.push_back(*o);
    r.stats = client.stats(ObjectKind::kEndpointSlice);
    client.stop();
    auto requests = server_.requests();
    for (size_t i = before; i < requests.size(); ++i) {
      const auto& q = requests[i];
      if (q.is_watch())
        r.watches.push_back(q);
      else if (q.path == slices)
        r.lists.push_back(q);
      else
        r.services.push_back(q);
    }
    return r;
  };
  const Run pb = run(true, true);
  const Run json_server = run(true, false);
  const Run json_agent = run(false, true);

  ASSERT_EQ(pb.objects.size(), 5u);
  EXPECT_EQ(pb.stats.list_pages, 3u);
  EXPECT_EQ(pb.stats.list_protobuf_pages, 3u);
  for (const auto& q : pb.lists)
    EXPECT_EQ(q.header("accept"), "application/vnd.kubernetes.protobuf, application/json");
  ASSERT_FALSE(pb.services.empty());
  for (const auto& q : pb.services) EXPECT_EQ(q.header("accept"), "application/json");
  ASSERT_EQ(pb.watches.size(), 2u);
  for (const auto& q : pb.watches) EXPECT_EQ(q.header("accept"), "application/json");

  EXPECT_EQ(json_server.stats.list_pages, 3u);
  EXPECT_EQ(json_server.stats.list_protobuf_pages, 0u);  // asked, answered in JSON
  EXPECT_EQ(json_agent.stats.list_protobuf_pages, 0u);
  for (const auto& q : json_agent.lists) EXPECT_EQ(q.header("accept"), "application/json");
  for (const Run* other : {&json_server, &json_agent}) {
    ASSERT_EQ(other->objects.size(), 5u);
    for (size_t i = 0; i < 5; ++i)
      kubetest::expect_same_slice(std::get<model::EndpointSlice>(pb.objects[i]),
                                  std::get<model::EndpointSlice>(other->objects[i]));
  }
}

TEST_F(KubeClientTest, ExpiredContinueTokenRestartsTheList) {
  for (int i = 0; i < 4; ++i)
    server_.apply(service_json("s" + std::to_string(i), "10.96.1." + std::to_string(i + 1)));
  // The second page is answered 410: the list starts over and still completes.
  server_.expire_next_continue();
  auto cfg = services_only();
  cfg.page_size = 2;
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  auto lists = list_requests("/api/v1/services");
  ASSERT_EQ(lists.size(), 4u);  // page 1, page 2 (410), page 1, page 2
  EXPECT_FALSE(lists[2].has_param("continue"));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 4u);
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
}

TEST_F(KubeClientTest, BookmarkAdvancesResourceVersionAndReconnectResumesFromIt) {
  server_.apply(service_json("a"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  // Changes to another resource move the global resourceVersion; only a bookmark tells the
  // services watch about it.
  server_.apply(kubetest::node_json("n1"));
  server_.apply(kubetest::node_json("n2"));
  const std::string rv = std::to_string(server_.resource_version());
  ASSERT_NE(client_->stats(ObjectKind::kService).resource_version, rv);
  server_.send_bookmarks();
  ASSERT_TRUE(wait_until([&] { return client_->stats(ObjectKind::kService).bookmarks == 1; }));
  EXPECT_EQ(client_->stats(ObjectKind::kService).resource_version, rv);
  EXPECT_EQ(metric("endpointd_watch_bookmarks_total", {{"kind", "Service"}}), 1);
  EXPECT_EQ(recorder_.events(), 1u);  // the Replace only: a bookmark posts nothing

  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return watch_requests().size() == 2; }));
  EXPECT_EQ(watch_requests().back().param("resourceVersion"), rv);
  EXPECT_EQ(client_->stats(ObjectKind::kService).lists, 1u);
}

// 410 Gone on a watch: the client relists and posts a new Replace. An object present before
// and after is never removed in between.
TEST_F(KubeClientTest, GoneWatchRelistsWithoutSpuriousRemoval) {
  server_.apply(service_json("a", "10.96.0.1"));
  server_.apply(service_json("b", "10.96.0.2"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));

  // The stream dies after delivering c; the next watch is told its resourceVersion is too
  // old, so d only arrives through the relist.
  server_.expire_next_watch();
  server_.close_watch_after_events(1);
  // c and d are written at once (replace_all is atomic; a and b are unchanged).
  server_.replace_all({service_json("a", "10.96.0.1"), service_json("b", "10.96.0.2"),
                       service_json("c", "10.96.0.3"), service_json("d", "10.96.0.4")});
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 2; }));
  EXPECT_TRUE(recorder_.has("Service:default/d"));
  EXPECT_EQ(recorder_.upserts("Service:default/d"), 0);  // via the Replace
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 4u);
  EXPECT_EQ(recorder_.total_removes(), 0);
  auto st = client_->stats(ObjectKind::kService);
  EXPECT_EQ(st.relists, 1u);
  EXPECT_EQ(st.error_events, 1u);
  EXPECT_EQ(st.reconnect_count("expired"), 1u);
  EXPECT_EQ(metric("endpointd_watch_relists_total", {{"kind", "Service"}}), 1);
}

// The first list is consistent (no version: a list from a cache that trails could put back an
// endpoint whose removal this node confirmed before it restarted); a relist after an expired
// watch asks for a state not older than the last seen, which the API server's watch cache
// answers; a continued page names none; and when the cache cannot answer (504: not caught
// up), a consistent list follows at once.
TEST_F(KubeClientTest, RelistsAskForTheApiServersCacheTheFirstListIsConsistent) {
  server_.apply(service_json("a", "10.96.0.1"));
  server_.apply(service_json("b", "10.96.0.2"));
  KubeClientConfig cfg = services_only();
  cfg.page_size = 1;  // two pages: the second is continued
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  auto lists = list_requests("/api/v1/services");
  ASSERT_EQ(lists.size(), 2u);
  EXPECT_FALSE(lists[0].has_param("resourceVersion"));
  EXPECT_FALSE(lists[0].has_param("resourceVersionMatch"));
  EXPECT_EQ(lists[0].param("limit"), "1");
  EXPECT_FALSE(lists[1].param("continue").empty());
  EXPECT_FALSE(lists[1].has_param("resourceVersion"));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 2u);

  // The watch expires: the relist asks for nothing older than what the client has seen.
  server_.apply(service_json("c", "10.96.0.3"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/c"); }));
  const std::string seen = client_->stats(ObjectKind::kService).resource_version;
  ASSERT_EQ(seen, std::to_string(server_.resource_version()));
  server_.expire_next_watch(/*http=*/true);
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 2; }));
  lists = list_requests("/api/v1/services");
  ASSERT_GE(lists.size(), 3u);
  EXPECT_EQ(lists[2].param("resourceVersion"), seen);
  EXPECT_EQ(lists[2].param("resourceVersionMatch"), "NotOlderThan");
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 3u);
  EXPECT_EQ(client_->stats(ObjectKind::kService).reconnect_count("version_unavailable"), 0u);

  // A cache behind that version: 504, then at once a consistent list, which syncs.
  ASSERT_TRUE(wait_until([&] { return watching(); }));
  server_.set_cache_behind(true);
  server_.apply(service_json("d", "10.96.0.4"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/d"); }));
  const size_t before = list_requests("/api/v1/services").size();
  server_.expire_next_watch(/*http=*/true);
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 3; }));
  lists = list_requests("/api/v1/services");
  ASSERT_GE(lists.size(), before + 2);
  EXPECT_EQ(lists[before].param("resourceVersionMatch"), "NotOlderThan");
  EXPECT_FALSE(lists[before + 1].has_param("resourceVersion"));
  EXPECT_FALSE(lists[before + 1].has_param("resourceVersionMatch"));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 4u);
  EXPECT_EQ(client_->stats(ObjectKind::kService).reconnect_count("version_unavailable"), 1u);
  EXPECT_EQ(recorder_.total_removes(), 0);
}

TEST_F(KubeClientTest, HttpGoneAndCompactionAlsoRelist) {
  server_.apply(service_json("a", "10.96.0.1"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  server_.expire_next_watch(/*http=*/true);
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) == 2; }));
  ASSERT_TRUE(wait_until([&] { return watching(); }));

  // History compacted past the client's position: the watch gets an ERROR 410 event. The
  // client is held off by a Retry-After while c is written and the history goes.
  server_.fail_next_requests(1, 429, 1);
  server_.close_watch_after_events(1);
  server_.apply(service_json("b", "10.96.0.2"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has(kSvcB); }));
  ASSERT_TRUE(wait_until(
      [&] { return client_->stats(ObjectKind::kService).reconnect_count("throttled") == 1; }));
  server_.apply(service_json("c", "10.96.0.3"));
  server_.compact();
  ASSERT_TRUE(wait_until([&] { return recorder_.replaces(ObjectKind::kService) >= 3; }));
  EXPECT_TRUE(recorder_.has("Service:default/c"));
  EXPECT_EQ(recorder_.total_removes(), 0);
  EXPECT_GE(client_->stats(ObjectKind::kService).relists, 2u);
}

TEST_F(KubeClientTest, DroppedStreamResumesWithoutLossOrDuplicates) {
  server_.apply(service_json("a"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));

  server_.close_watch_after_events(3);
  std::vector<uint64_t> rvs;
  for (int i = 0; i < 10; ++i) {
    rvs.push_back(
        server_.apply(service_json("n" + std::to_string(i), "10.96.2." + std::to_string(i + 1))));
  }
  ASSERT_TRUE(wait_until([&] { return recorder_.count(ObjectKind::kService) == 11; }));
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(recorder_.upserts("Service:default/n" + std::to_string(i)), 1) << i;
  }
  auto watches = watch_requests();
  ASSERT_GE(watches.size(), 2u);
  EXPECT_EQ(watches[1].param("resourceVersion"), std::to_string(rvs[2]));
  EXPECT_EQ(client_->stats(ObjectKind::kService).reconnect_count("dropped"), 1u);
  EXPECT_EQ(client_->stats(ObjectKind::kService).lists, 1u);  // resumed, not relisted
}

TEST_F(KubeClientTest, EventCutMidwayIsDroppedAndRedelivered) {
  server_.apply(service_json("a"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  server_.cut_next_event_midway();
  server_.apply(service_json("b"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has(kSvcB); }));
  EXPECT_EQ(recorder_.upserts(kSvcB), 1);
  EXPECT_EQ(client_->stats(ObjectKind::kService).decode_errors, 0u);
  EXPECT_GE(watch_requests().size(), 2u);
}

TEST_F(KubeClientTest, EventsSplitAcrossSlowWritesAreReassembled) {
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  server_.set_write_split(5, 3ms);
  for (int i = 0; i < 5; ++i) server_.apply(service_json("s" + std::to_string(i)));
  ASSERT_TRUE(wait_until([&] { return recorder_.count(ObjectKind::kService) == 5; }));
  EXPECT_EQ(client_->stats(ObjectKind::kService).decode_errors, 0u);
  EXPECT_EQ(watch_requests().size(), 1u);
}

TEST_F(KubeClientTest, ServerErrorsAreRetriedWithBackoff) {
  server_.apply(service_json("a"));
  server_.fail_next_requests(3, 503);
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  EXPECT_EQ(list_requests("/api/v1/services").size(), 4u);
  EXPECT_EQ(client_->stats(ObjectKind::kService).reconnect_count("server_error"), 3u);
  EXPECT_EQ(
      metric("endpointd_watch_reconnects_total", {{"kind", "Service"}, {"reason", "server_error"}}),
      3);
  EXPECT_EQ(recorder_.replaces(ObjectKind::kService), 1);
}

// client-go's request metrics (what kube-proxy's dashboards read): every request by status
// code, method and the server's host:port; list pages and watches in the latency histogram,
// list pages in the response size one; a server that cannot be reached is code "<error>".
TEST_F(KubeClientTest, RequestsAreCountedUnderClientGosMetrics) {
  server_.apply(service_json("a"));
  server_.fail_next_requests(2, 503);
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  std::string host = server_.url().substr(std::string("http://").size());
  auto histogram = [&](const std::string& name) -> const prometheus::ClientMetric::Histogram {
    for (const auto& fam : registry_.Collect())
      if (fam.name == name)
        for (const auto& m : fam.metric) {
          std::map<std::string, std::string> l;
          for (const auto& x : m.label) l[x.name] = x.value;
          if (l == std::map<std::string, std::string>{{"verb", "GET"}, {"host", host}})
            return m.histogram;
        }
    return {};
  };
  // The server has the watch request before the client has its answer and counts it. A
  // request is counted, then its latency observed: the watch's latency, the last thing
  // written, is what is waited for (waiting for the counter read the histogram one short).
  ASSERT_TRUE(wait_until(
      [&] { return histogram("rest_client_request_duration_seconds").sample_count >= 4; }));
  EXPECT_EQ(
      metric("rest_client_requests_total", {{"code", "503"}, {"method", "GET"}, {"host", host}}),
      2);
  EXPECT_EQ(
      metric("rest_client_requests_total", {{"code", "200"}, {"method", "GET"}, {"host", host}}),
      2);  // the list and the watch
  auto latency = histogram("rest_client_request_duration_seconds");
  EXPECT_EQ(latency.sample_count, 4u);
  ASSERT_FALSE(latency.bucket.empty());
  EXPECT_DOUBLE_EQ(latency.bucket.front().upper_bound, 0.005);
  EXPECT_DOUBLE_EQ(latency.bucket[latency.bucket.size() - 2].upper_bound, 60.0);
  // A watch's latency is until its answer began, not its life so far.
  EXPECT_LT(latency.sample_sum, 5.0);
  auto size = histogram("rest_client_response_size_bytes");
  EXPECT_EQ(size.sample_count, 3u);  // the list page and the two error bodies; not the watch
  EXPECT_GT(size.sample_sum, 100.0);

  // Nothing listens here (and nothing else takes the port while the test runs).
  kubetest::RefusingPort refusing;
  std::string gone_url = refusing.url();
  prometheus::Registry other;
  ClusterConfig cluster;
  cluster.server = gone_url;
  Recorder rec;
  KubeClient c2(cluster, services_only(), rec.sink(), other);
  c2.start();
  std::string gone_host = gone_url.substr(std::string("http://").size());
  ASSERT_TRUE(wait_until([&] {
    for (const auto& fam : other.Collect())
      if (fam.name == "rest_client_requests_total")
        for (const auto& m : fam.metric)
          for (const auto& l : m.label)
            if (l.name == "code" && l.value == "<error>" && m.counter.value >= 2) return true;
    return false;
  }));
  auto text = prometheus::TextSerializer().Serialize(other.Collect());
  EXPECT_NE(text.find("host=\"" + gone_host + "\""), std::string::npos) << text;
  c2.stop();
}

TEST_F(KubeClientTest, TooManyRequestsHonoursRetryAfter) {
  server_.apply(service_json("a"));
  server_.fail_next_requests(1, 429, /*retry_after_seconds=*/1);
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced(); }));
  auto lists = list_requests("/api/v1/services");
  ASSERT_EQ(lists.size(), 2u);
  EXPECT_GE(lists[1].at - lists[0].at, 1s);
  EXPECT_EQ(client_->stats(ObjectKind::kService).reconnect_count("throttled"), 1u);

  // The same on a watch.
  ASSERT_TRUE(wait_until([&] { return watching(); }));
  server_.fail_next_requests(1, 429, 1);
  server_.close_watches();
  ASSERT_TRUE(wait_until([&] { return watch_requests().size() == 3; }, 5s));
  auto w = watch_requests();
  EXPECT_GE(w[2].at - w[1].at, 1s);
  EXPECT_EQ(client_->stats(ObjectKind::kService).reconnect_count("throttled"), 2u);
}

TEST_F(KubeClientTest, RotatedTokenFileIsReread) {
  kubetest::TempDir dir;
  std::string token_file = dir.write("token", "first-token\n");
  server_.set_required_token("first-token");
  server_.apply(service_json("a"));
  ClusterConfig cluster;
  cluster.server = server_.url();
  cluster.token_file = token_file;
  start(services_only(), cluster);
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  EXPECT_EQ(list_requests("/api/v1/services").front().header("authorization"),
            "Bearer first-token");

  // The token rotates: the server accepts only the new one, the file changes.
  server_.set_required_token("second-token");
  server_.close_watches();
  ASSERT_TRUE(wait_until(
      [&] { return client_->stats(ObjectKind::kService).reconnect_count("unauthorized") >= 1; }));
  dir.write("token", "second-token\n");
  server_.apply(service_json("b"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has(kSvcB); }));
  EXPECT_EQ(watch_requests().back().header("authorization"), "Bearer second-token");
  EXPECT_EQ(recorder_.total_removes(), 0);
}

TEST_F(KubeClientTest, MalformedObjectIsRejectedAndCountedOthersStay) {
  server_.apply(service_json("a", "10.96.0.1"));
  server_.apply(service_json("bad", "not-an-ip"));
  server_.apply(service_json("c", "10.96.0.3"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 2u);
  EXPECT_FALSE(recorder_.has("Service:default/bad"));
  EXPECT_EQ(client_->stats(ObjectKind::kService).decode_errors, 1u);
  EXPECT_EQ(metric("endpointd_decode_errors_total", {{"kind", "Service"}}), 1);

  // A malformed update: nothing is posted, the last good version stays; later events flow.
  server_.apply(service_json("a", "10.96.0.1", 70000));
  server_.apply(service_json("c", "10.96.0.3", 8443));
  ASSERT_TRUE(wait_until([&] { return recorder_.upserts("Service:default/c") == 1; }));
  EXPECT_EQ(recorder_.upserts(kSvcA), 0);
  ASSERT_TRUE(recorder_.has(kSvcA));
  EXPECT_EQ(std::get<model::Service>(*recorder_.get(kSvcA)).ports.at(0).port, 80);
  EXPECT_EQ(client_->stats(ObjectKind::kService).decode_errors, 2u);
  // The malformed event still moved the watch position.
  EXPECT_EQ(client_->stats(ObjectKind::kService).resource_version,
            std::to_string(server_.resource_version()));

  // A line that is not a watch event at all: counted, and the watch is re-established from
  // the last good position without losing anything.
  server_.send_raw_watch_line("services", "{\"type\":\"ADDED\",\"object\":{not json");
  ASSERT_TRUE(wait_until(
      [&] { return client_->stats(ObjectKind::kService).reconnect_count("bad_stream") == 1; }));
  server_.apply(service_json("e", "10.96.0.5"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/e"); }));
  EXPECT_EQ(client_->stats(ObjectKind::kService).decode_errors, 3u);
  EXPECT_EQ(recorder_.total_removes(), 0);
}

TEST_F(KubeClientTest, OtherErrorEventReconnectsFromTheSamePosition) {
  server_.apply(service_json("a"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  const std::string rv = client_->stats(ObjectKind::kService).resource_version;
  server_.send_raw_watch_line(
      "services",
      R"({"type":"ERROR","object":{"kind":"Status","code":500,"reason":"InternalError","message":"etcd hiccup"}})");
  ASSERT_TRUE(wait_until([&] { return watch_requests().size() == 2; }));
  EXPECT_EQ(watch_requests()[1].param("resourceVersion"), rv);
  auto st = client_->stats(ObjectKind::kService);
  EXPECT_EQ(st.error_events, 1u);
  EXPECT_EQ(st.reconnect_count("error_event"), 1u);
  EXPECT_EQ(st.relists, 0u);  // not a 410: no relist
  EXPECT_EQ(metric("endpointd_watch_events_total", {{"kind", "Service"}, {"type", "ERROR"}}), 1);
}

// Another proxy's services are listed and watched like any other: DNS and the feed serve them
// (the dataplane's skipping them is model::has_proxy_rules, tested with the routing rules).
TEST_F(KubeClientTest, ObjectsOfAnotherServiceProxyAreKept) {
  server_.apply(service_json("a"));
  server_.apply(service_json("other", "10.96.0.9", 80, "default",
                             R"("service.kubernetes.io/service-proxy-name":"someone-else")"));
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  EXPECT_EQ(recorder_.last_replace_size(ObjectKind::kService), 2u);
  // Labelling a service later keeps it: an update, not a removal.
  server_.apply(service_json("a", "10.96.0.10", 80, "default",
                             R"("service.kubernetes.io/service-proxy-name":"someone-else")"));
  ASSERT_TRUE(wait_until([&] { return recorder_.upserts(kSvcA) >= 1; }));
  EXPECT_TRUE(recorder_.has(kSvcA));
  EXPECT_EQ(recorder_.removes(kSvcA), 0);
}

// DNS's verified pod records need every node's pods: no field selector, and the other nodes'
// pods arrive without the labels and annotations only this node's drains read.
TEST_F(KubeClientTest, PodsClusterWideForVerifiedPodRecordsKeepOnlyWhatDnsReads) {
  auto mine = kubetest::pod_json("mine", "node-1", "10.244.0.5");
  auto theirs = kubetest::pod_json("theirs", "node-2", "10.244.1.5");
  for (auto* j : {&mine, &theirs})
    j->replace(j->find(R"("uid")"), 0, R"("labels":{"app":"web"},"annotations":{"a":"b"},)");
  server_.apply(mine);
  server_.apply(theirs);
  auto cfg = services_only();
  cfg.watch_services = false;
  cfg.watch_pods = true;
  cfg.pods_cluster_wide = true;
  cfg.node_name = "node-1";
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  EXPECT_TRUE(recorder_.has("Pod:default/mine"));
  EXPECT_TRUE(recorder_.has("Pod:default/theirs"));
  EXPECT_FALSE(list_requests("/api/v1/pods").front().has_param("fieldSelector"));
  auto pod = [&](const std::string& k) { return std::get<model::Pod>(*recorder_.get(k)); };
  EXPECT_EQ(pod("Pod:default/mine").labels.size(), 1u);
  EXPECT_EQ(pod("Pod:default/mine").annotations.size(), 1u);
  EXPECT_TRUE(pod("Pod:default/theirs").labels.empty());
  EXPECT_TRUE(pod("Pod:default/theirs").annotations.empty());
  ASSERT_EQ(pod("Pod:default/theirs").pod_ips.size(), 1u);
  EXPECT_EQ(pod("Pod:default/theirs").pod_ips[0].str(), "10.244.1.5");
  // Watched too: a later pod of another node arrives, slimmed.
  auto later = kubetest::pod_json("later", "node-2", "10.244.1.6");
  later.replace(later.find(R"("uid")"), 0, R"("labels":{"app":"web"},)");
  server_.apply(later);
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Pod:default/later"); }));
  EXPECT_TRUE(pod("Pod:default/later").labels.empty());
}

TEST_F(KubeClientTest, PodsAreWatchedForThisNodeOnly) {
  server_.apply(kubetest::pod_json("mine", "node-1", "10.244.0.5"));
  server_.apply(kubetest::pod_json("theirs", "node-2", "10.244.1.5"));
  auto cfg = services_only();
  cfg.watch_services = false;
  cfg.watch_pods = true;
  cfg.node_name = "node-1";
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  EXPECT_TRUE(recorder_.has("Pod:default/mine"));
  EXPECT_FALSE(recorder_.has("Pod:default/theirs"));
  EXPECT_EQ(list_requests("/api/v1/pods").front().param("fieldSelector"), "spec.nodeName=node-1");
  server_.apply(kubetest::pod_json("later", "node-2", "10.244.1.6"));
  server_.apply(kubetest::pod_json("mine2", "node-1", "10.244.0.6"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Pod:default/mine2"); }));
  EXPECT_FALSE(recorder_.has("Pod:default/later"));
}

// With the drain's members from the agents' Service, the agent watches its own Node alone:
// the API server then sends it no other node's status writes.
TEST_F(KubeClientTest, OwnNodeOnlyWatchesThisNodesNodeAlone) {
  server_.apply(kubetest::node_json("node-1", "192.168.0.1"));
  server_.apply(kubetest::node_json("node-2", "192.168.0.2"));
  auto cfg = services_only();
  cfg.watch_services = false;
  cfg.watch_nodes = true;
  cfg.own_node_only = true;
  cfg.node_name = "node-1";
  start(cfg);
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  EXPECT_TRUE(recorder_.has("Node:node-1"));
  EXPECT_FALSE(recorder_.has("Node:node-2"));
  EXPECT_EQ(list_requests("/api/v1/nodes").front().param("fieldSelector"), "metadata.name=node-1");
  server_.apply(kubetest::node_json("node-3", "192.168.0.3"));
  server_.apply(kubetest::node_json("node-1", "192.168.0.11"));
  ASSERT_TRUE(wait_until([&] {
    auto n = recorder_.get("Node:node-1");
    return n && std::get<model::Node>(*n).addresses.front().address == "192.168.0.11";
  }));
  EXPECT_FALSE(recorder_.has("Node:node-3"));
}

TEST_F(KubeClientTest, StopIsPromptDuringWatchAndBackoff) {
  start(services_only());
  ASSERT_TRUE(wait_until([&] { return client_->synced() && watching(); }));
  auto t0 = std::chrono::steady_clock::now();
  client_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);

  // Also while waiting out a long Retry-After.
  Recorder other;
  server_.fail_next_requests(1, 429, 60);
  ClusterConfig cluster;
  cluster.server = server_.url();
  KubeClient c2(cluster, services_only(), other.sink(), registry_);
  c2.start();
  ASSERT_TRUE(
      wait_until([&] { return c2.stats(ObjectKind::kService).reconnect_count("throttled") == 1; }));
  t0 = std::chrono::steady_clock::now();
  c2.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
}

TEST_F(KubeClientTest, UnreachableServerIsRetried) {
  // Nothing listens on the port, and nothing else can take it while the test runs.
  kubetest::RefusingPort refusing;
  ClusterConfig cluster;
  cluster.server = refusing.url();
  start(services_only(), cluster);
  ASSERT_TRUE(wait_until(
      [&] { return client_->stats(ObjectKind::kService).reconnect_count("connect") >= 3; }));
  EXPECT_FALSE(client_->synced());
}

}  // namespace
}  // namespace endpointd::watcher

namespace endpointd::watcher {
namespace {

// The fake server takes a list's resourceVersion and resourceVersionMatch as the API server
// does (the API concepts' "Semantics for get and list"), so that the client's choice is tested
// against answers that can tell them apart.
TEST(FakeApiListVersions, AnsweredAsTheApiServerAnswersThem) {
  fakeapi::FakeApiServer server;
  ASSERT_TRUE(server.ok());
  server.apply(kubetest::service_json("a", "10.96.0.1"));
  const std::string now = std::to_string(server.resource_version());
  const std::string older = std::to_string(server.resource_version() - 1);
  const std::string newer = std::to_string(server.resource_version() + 5);
  httplib::Client http("127.0.0.1", server.port());
  auto status = [&](const std::string& query) {
    auto r = http.Get("/api/v1/services?" + query);
    return r ? r->status : -1;
  };
  EXPECT_EQ(status("limit=10"), 200);                    // most recent
  EXPECT_EQ(status("limit=10&resourceVersion=0"), 200);  // any
  EXPECT_EQ(status("limit=10&resourceVersion=" + older + "&resourceVersionMatch=NotOlderThan"),
            200);
  EXPECT_EQ(status("limit=10&resourceVersion=" + newer + "&resourceVersionMatch=NotOlderThan"),
            504);                                      // a cache not there yet
  EXPECT_EQ(status("resourceVersion=" + newer), 504);  // legacy: no limit is NotOlderThan
  EXPECT_EQ(status("limit=10&resourceVersion=" + now + "&resourceVersionMatch=Exact"), 200);
  EXPECT_EQ(status("limit=10&resourceVersion=" + older), 410);  // legacy: a limit is Exact
  EXPECT_EQ(status("limit=10&resourceVersion=0&resourceVersionMatch=Exact"), 400);
  EXPECT_EQ(status("limit=10&resourceVersionMatch=NotOlderThan"), 400);
  EXPECT_EQ(status("limit=10&resourceVersion=abc&resourceVersionMatch=NotOlderThan"), 400);
  EXPECT_EQ(status("limit=10&resourceVersion=1&resourceVersionMatch=Newest"), 400);
  EXPECT_EQ(status("limit=10&continue=1:1&resourceVersion=" + now), 400);
  server.set_cache_behind(true);
  EXPECT_EQ(status("limit=10&resourceVersion=" + older + "&resourceVersionMatch=NotOlderThan"),
            504);
  EXPECT_EQ(status("limit=10&resourceVersion=0"), 200);
  EXPECT_EQ(status("limit=10"), 200);
}

// The fake server fed from a manifest directory, as endpointd-fakeapi runs it.
TEST(FakeApiDirectory, ServesManifestsAndTheirChanges) {
  kubetest::TempDir dir;
  dir.write("a.json", kubetest::service_json("a", "10.96.0.1"));
  dir.write("list.json", "{\"kind\":\"List\",\"items\":[" +
                             kubetest::service_json("b", "10.96.0.2") + "," +
                             kubetest::node_json("n1") + "]}");
  fakeapi::FakeApiServer server;
  ASSERT_TRUE(server.ok());
  std::vector<std::string> errors;
  server.replace_all(fakeapi::load_manifest_dir(dir.path().string(), &errors));
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(server.object_count("services"), 2u);
  EXPECT_EQ(server.object_count("nodes"), 1u);

  prometheus::Registry registry;
  kubetest::Recorder recorder;
  ClusterConfig cluster;
  cluster.server = server.url();
  KubeClientConfig cfg;
  cfg.watch_endpoint_slices = false;
  KubeClient client(cluster, cfg, recorder.sink(), registry);
  client.start();
  ASSERT_TRUE(kubetest::wait_until([&] { return client.synced() && server.open_watches() == 2; }));
  EXPECT_TRUE(recorder.has("Node:n1"));

  // Rewriting the directory and loading it again turns into watch events; unchanged
  // objects produce none.
  std::filesystem::remove(dir.path() / "a.json");
  dir.write("list.json", "{\"kind\":\"List\",\"items\":[" +
                             kubetest::service_json("b", "10.96.0.2", 8080) + "," +
                             kubetest::node_json("n1") + "]}");
  server.replace_all(fakeapi::load_manifest_dir(dir.path().string(), &errors));
  ASSERT_TRUE(kubetest::wait_until([&] { return !recorder.has("Service:default/a"); }));
  ASSERT_TRUE(kubetest::wait_until([&] { return recorder.upserts("Service:default/b") == 1; }));
  EXPECT_EQ(recorder.upserts("Node:n1"), 0);
  client.stop();
}

}  // namespace
}  // namespace endpointd::watcher
