// Events on pods: written to the fake API server as events.k8s.io/v1 Events, repeats folded
// into a series, the per-object and global limits, a bounded queue that never blocks the
// caller, API errors counted; and the drain events from the coordinator's published state.
#include "daemon/events.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "daemon/daemon.h"
#include "daemon/kube_request.h"
#include "tests/fakeapi/fake_api.h"
#include "watcher/kube_auth.h"

namespace endpointd::daemon {
namespace {

using namespace std::chrono_literals;

EventRecorder::Send to(KubeRequester& api) {
  return [&api](std::string_view method, const std::string& path, const std::string& body,
                std::string_view type,
                std::chrono::milliseconds timeout) -> Result<EventRecorder::Reply> {
    auto r = api.request(method, path, body, timeout, type);
    if (!r) return Error{r.error()};
    return EventRecorder::Reply{r->status};
  };
}

PodEvent event(std::string pod, std::string reason, std::string note) {
  PodEvent e;
  e.ns = "demo";
  e.pod = std::move(pod);
  e.uid = "uid-" + e.pod;
  e.reason = std::move(reason);
  e.note = std::move(note);
  return e;
}

class EventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok());
    watcher::ClusterConfig c;
    c.server = fake_.url();
    api_ = std::make_unique<KubeRequester>(c);
    opts_.node = "node-a";
    opts_.registry = &registry_;
  }
  std::string metrics() { return prometheus::TextSerializer().Serialize(registry_.Collect()); }
  fakeapi::FakeApiServer fake_;
  std::unique_ptr<KubeRequester> api_;
  prometheus::Registry registry_;
  EventRecorderOptions opts_;
};

TEST_F(EventsTest, WrittenAsEventsOnThePodInOrder) {
  EventRecorder rec(opts_, to(*api_));
  rec.record(event("web-2", "DrainRemoved", "10.244.1.11 removed from every consumer"));
  rec.record(event("web-2", "DrainReleased", "10.244.1.11 released: confirmed"));
  auto w = event("web-2", "DrainUnconfirmed", "without confirmation from node-b/agent");
  w.type = "Warning";
  rec.record(w);
  rec.record(event("web-1", "DrainReleased", "other pod"));
  ASSERT_TRUE(rec.flush(5s));
  EXPECT_EQ(rec.counts().written, 4u);
  // As `kubectl get events --field-selector` would list them.
  httplib::Client http("127.0.0.1", fake_.port());
  auto r = http.Get(
      "/apis/events.k8s.io/v1/namespaces/demo/events?fieldSelector=regarding.name%3Dweb-2");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  simdjson::dom::parser p;
  simdjson::dom::element list = p.parse(r->body);
  std::vector<std::string> reasons;
  for (simdjson::dom::element e : list["items"].get_array()) {
    reasons.emplace_back(std::string_view(e["reason"]));
    EXPECT_EQ(std::string_view(e["reportingController"]), "endpointd.io/agent");
    EXPECT_EQ(std::string_view(e["reportingInstance"]), "node-a");
    EXPECT_EQ(std::string_view(e["regarding"]["kind"]), "Pod");
    EXPECT_EQ(std::string_view(e["regarding"]["uid"]), "uid-web-2");
    EXPECT_EQ(std::string_view(e["action"]), "Drain");
    std::string_view t = e["eventTime"];
    EXPECT_EQ(t.size(), 27u) << t;  // 2026-11-28T02:00:00.123456Z
  }
  EXPECT_EQ(reasons,
            (std::vector<std::string>{"DrainRemoved", "DrainReleased", "DrainUnconfirmed"}));
  EXPECT_NE(r->body.find(R"("type":"Warning")"), std::string::npos);
  EXPECT_NE(metrics().find(R"(endpointd_events_total{result="written"} 4)"), std::string::npos)
      << metrics();
}

// The same events as kubectl lists them: core/v1 Events (kube-apiserver's conversion:
// involvedObject, message, reportingComponent, a series' count), selected by
// involvedObject.name, as a list or as the Table `kubectl get` asks for; a field that is not
// selectable is a 400 naming it.
TEST_F(EventsTest, ListedAsCoreV1EventsForKubectl) {
  EventRecorder rec(opts_, to(*api_));
  rec.record(event("web-2", "DrainRemoved", "10.244.1.11 removed from every consumer"));
  rec.record(event("web-2", "DrainReleased", "10.244.1.11 released: confirmed"));
  rec.record(event("web-2", "DrainReleased", "10.244.1.11 released: confirmed"));  // a series
  rec.record(event("web-1", "DrainReleased", "other pod"));
  ASSERT_TRUE(rec.flush(5s));
  httplib::Client http("127.0.0.1", fake_.port());
  auto r = http.Get("/api/v1/namespaces/demo/events?fieldSelector=involvedObject.name%3Dweb-2");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  simdjson::dom::parser p;
  simdjson::dom::element list = p.parse(r->body);
  EXPECT_EQ(std::string_view(list["kind"]), "EventList");
  std::vector<std::string> reasons;
  for (simdjson::dom::element e : list["items"].get_array()) {
    reasons.emplace_back(std::string_view(e["reason"]));
    EXPECT_EQ(std::string_view(e["apiVersion"]), "v1");
    EXPECT_EQ(std::string_view(e["involvedObject"]["name"]), "web-2");
    EXPECT_EQ(std::string_view(e["involvedObject"]["uid"]), "uid-web-2");
    EXPECT_EQ(std::string_view(e["reportingComponent"]), "endpointd.io/agent");
    EXPECT_EQ(std::string_view(e["reportingInstance"]), "node-a");
    EXPECT_TRUE(e["firstTimestamp"].is_null());  // no deprecated fields were written
    EXPECT_EQ(std::string_view(e["eventTime"]).size(), 27u);
  }
  EXPECT_EQ(reasons, (std::vector<std::string>{"DrainRemoved", "DrainReleased"}));
  EXPECT_EQ(int64_t(list["items"].at(1)["series"]["count"]), 2);
  EXPECT_NE(std::string_view(list["items"].at(0)["message"]).find("removed from every consumer"),
            std::string_view::npos);
  // The Table: LAST SEEN, TYPE, REASON, OBJECT, …, MESSAGE, …, COUNT.
  r = http.Get("/api/v1/namespaces/demo/events?fieldSelector=involvedObject.name%3Dweb-2",
               {{"Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  simdjson::dom::element table = p.parse(r->body);
  EXPECT_EQ(std::string_view(table["kind"]), "Table");
  EXPECT_EQ(table["columnDefinitions"].get_array().size(), 10u);
  auto rows = table["rows"].get_array();
  ASSERT_EQ(rows.size(), 2u);
  simdjson::dom::element row = rows.at(1);
  EXPECT_EQ(std::string_view(row["cells"].at(1)), "Normal");
  EXPECT_EQ(std::string_view(row["cells"].at(2)), "DrainReleased");
  EXPECT_EQ(std::string_view(row["cells"].at(3)), "pod/web-2");
  EXPECT_EQ(std::string_view(row["cells"].at(5)), "endpointd.io/agent, node-a");
  EXPECT_EQ(int64_t(row["cells"].at(8)), 2);
  EXPECT_EQ(std::string_view(row["object"]["kind"]), "PartialObjectMetadata");
  // Every namespace; a != term.
  r = http.Get("/api/v1/events?fieldSelector=reason%3DDrainReleased,involvedObject.name!%3Dweb-2");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  list = p.parse(r->body);
  ASSERT_EQ(list["items"].get_array().size(), 1u);
  EXPECT_EQ(std::string_view(list["items"].at(0)["involvedObject"]["name"]), "web-1");
  // Not selectable, not a selector.
  r = http.Get("/api/v1/namespaces/demo/events?fieldSelector=spec.nodeName%3Dnode-a");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("field label not supported: spec.nodeName"), std::string::npos) << r->body;
  r = http.Get("/api/v1/namespaces/demo/events?fieldSelector=reason");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  // Discovery: events in the core group, which kubectl prefers.
  r = http.Get("/api/v1");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find(R"("name":"events")"), std::string::npos) << r->body;
}

TEST_F(EventsTest, ARepeatPatchesTheSeries) {
  EventRecorder rec(opts_, to(*api_));
  for (int i = 0; i < 3; ++i) rec.record(event("web-2", "DrainReleased", "same"));
  rec.record(event("web-2", "DrainReleased", "different"));
  ASSERT_TRUE(rec.flush(5s));
  auto c = rec.counts();
  EXPECT_EQ(c.written, 2u);
  EXPECT_EQ(c.patched, 2u);
  auto stored = fake_.events("demo");
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_NE(stored[0].find(R"("series":{"count":3,)"), std::string::npos) << stored[0];
  EXPECT_EQ(stored[1].find("series"), std::string::npos) << stored[1];
}

TEST_F(EventsTest, PerObjectAndGlobalLimits) {
  opts_.object_burst = 3;
  opts_.global_burst = 5;
  opts_.global_per_second = 0.001;
  EventRecorder rec(opts_, to(*api_));
  for (int i = 0; i < 10; ++i) rec.record(event("web-2", "DrainReleased", std::to_string(i)));
  // Another pod is not held back by web-2's flood, until the global bucket is empty.
  for (int i = 0; i < 4; ++i) rec.record(event("web-1", "DrainReleased", std::to_string(i)));
  ASSERT_TRUE(rec.flush(5s));
  auto c = rec.counts();
  EXPECT_EQ(c.written, 5u);  // 3 of web-2, 2 of web-1: the global burst
  EXPECT_EQ(c.dropped_rate_limit, 9u);
  EXPECT_NE(metrics().find(R"(endpointd_events_total{result="dropped_rate_limit"} 9)"),
            std::string::npos);
}

TEST_F(EventsTest, ABlockedApiNeverBlocksTheCallerAndTheQueueIsBounded) {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> sent{0};
  opts_.queue = 8;
  opts_.global_burst = 1e9;
  EventRecorder rec(opts_,
                    [&](std::string_view, const std::string&, const std::string&, std::string_view,
                        std::chrono::milliseconds) -> Result<EventRecorder::Reply> {
                      std::unique_lock lock(mu);
                      cv.wait(lock, [&] { return open; });
                      ++sent;
                      return EventRecorder::Reply{201};
                    });
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) rec.record(event("p" + std::to_string(i), "DrainReleased", "x"));
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 500ms) << "record() waited on the API";
  auto c = rec.counts();
  // One taken by the writer (blocked), 8 queued, the rest dropped; or all 9 queued when the
  // writer had not taken one yet.
  EXPECT_GE(c.dropped_queue, 1000u - 9u);
  EXPECT_LE(c.dropped_queue, 1000u - 8u);
  {
    std::lock_guard lock(mu);
    open = true;
  }
  cv.notify_all();
  ASSERT_TRUE(rec.flush(5s));
  EXPECT_EQ(static_cast<uint64_t>(sent.load()), 1000u - c.dropped_queue);
}

TEST_F(EventsTest, ApiErrorsAreCountedAndNotRetried) {
  fake_.fail_next_requests(2, 429, 1);
  EventRecorder rec(opts_, to(*api_));
  rec.record(event("web-2", "DrainRemoved", "a"));
  rec.record(event("web-2", "DrainReleased", "b"));
  rec.record(event("web-2", "DrainUnconfirmed", "c"));
  ASSERT_TRUE(rec.flush(5s));
  auto c = rec.counts();
  EXPECT_EQ(c.failed, 2u);
  EXPECT_EQ(c.written, 1u);
  ASSERT_EQ(fake_.events("demo").size(), 1u);
  EXPECT_NE(fake_.events("demo")[0].find("DrainUnconfirmed"), std::string::npos);
}

std::string drain(const std::string& stage, const std::string& timeline, bool forced,
                  const std::string& outcome, const std::string& unconfirmed) {
  return R"({"address":"10.244.1.11","pod":"demo/web-2","pod_uid":"u2","stage":")" + stage +
         R"(","release_after":"removed","timeline_ms":{)" + timeline + R"(},"removal_forced":)" +
         (forced ? "true" : "false") + R"(,"outcome":)" + outcome + R"(,"unconfirmed":[)" +
         unconfirmed + "]}";
}

TEST(DrainEvents, EachDrainTellsEachStepOnce) {
  DrainEvents ev;
  EXPECT_TRUE(
      ev.observe("[" + drain("stop-accepting", R"("stop_accepting":0)", false, "null", "") + "]", 2)
          .empty());
  std::string removed =
      "[" + drain("removed", R"("stop_accepting":0,"removed":37)", false, "null", "") + "]";
  auto out = ev.observe(removed, 2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].reason, "DrainRemoved");
  EXPECT_EQ(out[0].ns, "demo");
  EXPECT_EQ(out[0].pod, "web-2");
  EXPECT_EQ(out[0].uid, "u2");
  EXPECT_NE(out[0].note.find("on 2 nodes in 37 ms"), std::string::npos) << out[0].note;
  EXPECT_TRUE(ev.observe(removed, 2).empty());
  out =
      ev.observe("[" +
                     drain("released", R"("removed":37,"released":5003)", false, R"("unconfirmed")",
                           R"({"node":"node-b","consumer":"agent","reason":"excluded"})") +
                     "]",
                 2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].reason, "DrainReleased");
  EXPECT_NE(out[0].note.find("after 5003 ms: unconfirmed"), std::string::npos) << out[0].note;
  EXPECT_EQ(out[1].reason, "DrainUnconfirmed");
  EXPECT_EQ(out[1].type, "Warning");
  EXPECT_NE(out[1].note.find("node-b/agent (excluded)"), std::string::npos) << out[1].note;
}

// A removal with a node left unconfirmed (its agent excluded) is not "removed from every
// consumer": the release's DrainUnconfirmed names the node instead.
TEST(DrainEvents, ARemovalWithAnUnconfirmedNodeIsNotCalledRemoved) {
  DrainEvents ev;
  std::string who = R"({"node":"node-b","consumer":"agent","reason":"excluded"})";
  EXPECT_TRUE(
      ev.observe("[" + drain("removed", R"("removed":3100)", false, "null", who) + "]", 2).empty());
  auto out = ev.observe(
      "[" + drain("released", R"("removed":3100,"released":3101)", false, R"("unconfirmed")", who) +
          "]",
      2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].reason, "DrainReleased");
  EXPECT_EQ(out[1].reason, "DrainUnconfirmed");
  EXPECT_NE(out[1].note.find("node-b/agent (excluded)"), std::string::npos) << out[1].note;
}

TEST(DrainEvents, AForcedRemovalIsNotCalledRemoved) {
  DrainEvents ev;
  auto out = ev.observe(
      "[" +
          drain("released", R"("removed":5000,"released":5001)", true, R"("unconfirmed")",
                R"({"node":"node-b","consumer":"agent","reason":"silent"})") +
          "]",
      2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].reason, "DrainReleased");
  EXPECT_EQ(out[1].reason, "DrainUnconfirmed");
  // A confirmed release: no warning.
  DrainEvents ok;
  out = ok.observe(
      "[" + drain("released", R"("removed":20,"released":21)", false, R"("confirmed")", "") + "]",
      1);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].reason, "DrainRemoved");
  EXPECT_NE(out[0].note.find("on 1 node in 20 ms"), std::string::npos) << out[0].note;
  EXPECT_EQ(out[1].reason, "DrainReleased");
}

// A snapshot of service demo/web with these endpoints (address, node, ready) at `revision`,
// its slice triggered at `trigger`.
struct Ep {
  std::string address, node;
  bool ready;
};
model::SnapshotPtr web_snapshot(uint64_t generation, uint64_t revision, std::vector<Ep> eps,
                                std::chrono::system_clock::time_point trigger) {
  model::ServiceState st;
  st.service.key = {"demo", "web"};
  st.trigger_time = trigger;
  std::sort(eps.begin(), eps.end(), [](const Ep& a, const Ep& b) {
    return *model::IpAddr::parse(a.address) < *model::IpAddr::parse(b.address);
  });
  for (const auto& e : eps) {
    model::MergedEndpoint m;
    m.address = *model::IpAddr::parse(e.address);
    m.conditions.ready = e.ready;
    m.conditions.terminating = !e.ready;
    m.node_name = e.node;
    m.target_ref = model::ObjectRef{"Pod", "demo", "pod-" + e.address, "uid-" + e.address};
    st.endpoints.push_back(std::move(m));
  }
  auto snap = std::make_shared<model::Snapshot>();
  snap->generation = generation;
  snap->synced = true;
  snap->slice_revision = revision;
  snap->services =
      std::vector<model::ServiceStatePtr>{std::make_shared<model::ServiceState>(std::move(st))};
  return snap;
}

// The cluster programming latency: per endpoint of this node that turned ready or stopped
// being ready, from the slice's trigger time to the cluster watermark covering the change;
// other nodes' endpoints, changes without a trigger time or from before the agent started are
// left out.
TEST(PropagationEvents, ClusterProgrammingLatencyFromTriggerTimeToTheWatermark) {
  prometheus::Registry reg;
  auto& family = prometheus::BuildHistogram()
                     .Name("endpointd_cluster_programming_duration_seconds")
                     .Help("test")
                     .Register(reg);
  auto& hist = family.Add({}, PropagationEvents::buckets());
  auto t0 = std::chrono::system_clock::now();
  auto steady = std::chrono::steady_clock::now();
  PropagationEvents pe(&hist, t0 - 10s);
  auto count_and_sum = [&] {
    auto m = family.Collect().at(0).metric.at(0).histogram;
    return std::make_pair(m.sample_count, m.sample_sum);
  };
  // The first snapshot: what was ready before the agent looked is not measured.
  pe.on_snapshot(*web_snapshot(1, 100, {{"10.0.0.1", "node-a", true}}, t0 - 60s), "node-a", steady);
  EXPECT_EQ(pe.pending(), 0u);
  // 10.0.0.2 (node-a) turns ready, 10.0.0.3 on node-b too: only node-a's is this agent's.
  pe.on_snapshot(*web_snapshot(2, 110,
                               {{"10.0.0.1", "node-a", true},
                                {"10.0.0.2", "node-a", true},
                                {"10.0.0.3", "node-b", true}},
                               t0),
                 "node-a", steady);
  EXPECT_EQ(pe.pending(), 1u);
  // The watermark short of revision 110: nothing yet.
  EXPECT_TRUE(pe.observe(109, 2, steady, t0 + 1500ms).empty());
  EXPECT_EQ(count_and_sum().first, 0u);
  auto out = pe.observe(110, 2, steady, t0 + 1500ms);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].reason, "Propagated");
  EXPECT_EQ(out[0].pod, "pod-10.0.0.2");
  EXPECT_EQ(count_and_sum().first, 1u);
  EXPECT_DOUBLE_EQ(count_and_sum().second, 1.5);
  // 10.0.0.1 stops being ready (terminating): no event, but the latency, 250 ms.
  pe.on_snapshot(*web_snapshot(3, 120,
                               {{"10.0.0.1", "node-a", false},
                                {"10.0.0.2", "node-a", true},
                                {"10.0.0.3", "node-b", true}},
                               t0 + 2s),
                 "node-a", steady);
  EXPECT_TRUE(pe.observe(125, 2, steady, t0 + 2250ms).empty());
  EXPECT_EQ(count_and_sum().first, 2u);
  EXPECT_DOUBLE_EQ(count_and_sum().second, 1.75);
  EXPECT_EQ(pe.programmed(), 2u);
  // 10.0.0.2 leaves the slice while ready: stopped being ready too.
  pe.on_snapshot(
      *web_snapshot(4, 130, {{"10.0.0.1", "node-a", false}, {"10.0.0.3", "node-b", true}}, t0 + 3s),
      "node-a", steady);
  EXPECT_TRUE(pe.observe(130, 2, steady, t0 + 3100ms).empty());
  EXPECT_EQ(count_and_sum().first, 3u);
  // A change with a trigger time from before the agent started: the event, no latency.
  pe.on_snapshot(*web_snapshot(5, 140,
                               {{"10.0.0.1", "node-a", false},
                                {"10.0.0.3", "node-b", true},
                                {"10.0.0.4", "node-a", true}},
                               t0 - 20s),
                 "node-a", steady);
  EXPECT_EQ(pe.observe(140, 2, steady, t0 + 4s).size(), 1u);
  EXPECT_EQ(count_and_sum().first, 3u);
  // 0.1 s falls in a bucket below kube-proxy's first (0.25 s).
  auto b = PropagationEvents::buckets();
  EXPECT_EQ(b.front(), 0.01);
  EXPECT_NE(std::find(b.begin(), b.end(), 0.25), b.end());
  EXPECT_EQ(b.back(), 300);
}

// A service of namespace "many" with one endpoint on `node`, ready or not, its pod named after
// the service.
model::ServiceStatePtr one_endpoint_service(const std::string& name, const std::string& address,
                                            const std::string& node, bool ready) {
  model::ServiceState st;
  st.service.key = {"many", name};
  model::MergedEndpoint m;
  m.address = *model::IpAddr::parse(address);
  m.conditions.ready = ready;
  m.node_name = node;
  m.target_ref = model::ObjectRef{"Pod", "many", "pod-" + name, "uid-" + name};
  st.endpoints.push_back(std::move(m));
  return std::make_shared<model::ServiceState>(std::move(st));
}

// A look compares the snapshot with the last one it read (model::diff, the chunks both share
// skipped), not with every service: over many services and generations it never saw, it finds
// exactly the endpoints that turned ready — in a changed service, in an added one — and nothing
// in the services that stayed the same objects.
TEST(PropagationEvents, ALookFindsWhatChangedSinceTheLastOneOverGenerationsItSkipped) {
  PropagationEvents pe;
  auto steady = std::chrono::steady_clock::now();
  auto name = [](int i) {
    char b[16];
    std::snprintf(b, sizeof(b), "svc-%03d", i);
    return std::string(b);
  };
  auto address = [](int i) {
    return "10.1." + std::to_string(i / 200) + "." + std::to_string(i % 200 + 1);
  };
  // 300 services over several chunks of the list, each ready on node-a, but 150 not yet ready.
  std::vector<model::ServiceStatePtr> all;
  for (int i = 0; i < 300; ++i)
    all.push_back(one_endpoint_service(name(i), address(i), "node-a", i != 150));
  auto first = std::make_shared<model::Snapshot>();
  first->generation = 1;
  first->synced = true;
  first->slice_revision = 100;
  first->services = model::ServiceList(all);
  ASSERT_GT(first->services.chunks().size(), 2u);
  pe.on_snapshot(*first, "node-a", steady);  // the baseline: nothing waits
  EXPECT_EQ(pe.pending(), 0u);
  // Generation 2, never looked at: 150 turns ready. Generation 3: 320 is added, ready; 10
  // changes on node-b only (not this node's to wait for).
  auto second = std::make_shared<model::Snapshot>(*first);
  second->generation = 2;
  second->slice_revision = 110;
  second->services = first->services.with(
      {{{"many", name(150)}, one_endpoint_service(name(150), address(150), "node-a", true)}});
  auto third = std::make_shared<model::Snapshot>(*second);
  third->generation = 3;
  third->slice_revision = 120;
  third->services = second->services.with(
      {{{"many", name(10)}, one_endpoint_service(name(10), "10.9.9.9", "node-b", true)},
       {{"many", name(320)}, one_endpoint_service(name(320), "10.2.0.1", "node-a", true)}});
  pe.on_snapshot(*third, "node-a", steady);
  EXPECT_EQ(pe.pending(), 2u);
  auto out = pe.observe(120, 1, steady);
  ASSERT_EQ(out.size(), 2u);
  std::vector<std::string> pods{out[0].pod, out[1].pod};
  std::sort(pods.begin(), pods.end());
  EXPECT_EQ(pods, (std::vector<std::string>{"pod-" + name(150), "pod-" + name(320)}));
  // A new generation whose services are the same objects: nothing turned ready.
  auto fourth = std::make_shared<model::Snapshot>(*third);
  fourth->generation = 4;
  fourth->slice_revision = 130;
  pe.on_snapshot(*fourth, "node-a", steady);
  EXPECT_EQ(pe.pending(), 0u);
  // The same list built again from its services (no chunk shared, every service the same
  // object): nothing either.
  std::vector<model::ServiceStatePtr> again(third->services.begin(), third->services.end());
  auto fifth = std::make_shared<model::Snapshot>(*fourth);
  fifth->generation = 5;
  fifth->services = model::ServiceList(std::move(again));
  pe.on_snapshot(*fifth, "node-a", steady);
  EXPECT_EQ(pe.pending(), 0u);
}

// Through `endpointd run`'s wiring against the fake API: web-2 on node-a turns terminating and
// the agent on node-a writes DrainRemoved on it; the events are off with --events false.
class EventsDaemonTest : public ::testing::TestWithParam<bool> {};

std::string web_slice(bool terminating) {
  return std::string(
             R"({"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"demo","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","ports":[{"name":"http","port":8080}],"endpoints":[{"addresses":["10.244.1.11"],"nodeName":"node-a","targetRef":{"kind":"Pod","namespace":"demo","name":"web-2","uid":"u-web-2"},"conditions":{"ready":)") +
         (terminating ? "false" : "true") + R"(,"serving":true,"terminating":)" +
         (terminating ? "true" : "false") + "}}]}";
}

std::string web_pod(bool deleted) {
  return std::string(
             R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-2","namespace":"demo","uid":"u-web-2")") +
         (deleted ? R"(,"deletionTimestamp":"2030-01-01T00:00:00Z","deletionGracePeriodSeconds":30)"
                  : "") +
         R"(},"spec":{"nodeName":"node-a","terminationGracePeriodSeconds":30},"status":{"phase":"Running","podIP":"10.244.1.11","podIPs":[{"ip":"10.244.1.11"}]}})";
}

TEST_P(EventsDaemonTest, ATerminatingPodOnThisNodeGetsDrainRemoved) {
  bool on = GetParam();
  fakeapi::FakeApiServer api;
  ASSERT_TRUE(api.ok());
  api.apply(R"({"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"}})");
  api.apply(
      R"({"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"demo"},"spec":{"clusterIP":"10.96.0.10","ports":[{"name":"http","port":80}]}})");
  api.apply(web_slice(false));
  api.apply(web_pod(false));
  std::string kubeconfig = api.write_kubeconfig();
  ASSERT_FALSE(kubeconfig.empty());
  Config cfg;
  cfg.kubeconfig = kubeconfig;
  cfg.admin_listen = model::HostPort{"127.0.0.1", 0};
  cfg.health_listen = std::nullopt;
  cfg.node_name = "node-a";
  cfg.dataplane = Dataplane::kNone;
  cfg.drain_socket = kubeconfig + ".sock";
  cfg.drain_peer_listen = std::nullopt;
  cfg.events = on;
  auto d = std::make_unique<Daemon>(cfg);
  auto st = d->start();
  ASSERT_TRUE(st) << st.error();
  httplib::Client http("127.0.0.1", d->admin_port());
  auto wait = [](const std::function<bool()>& cond, std::chrono::milliseconds for_) {
    auto deadline = std::chrono::steady_clock::now() + for_;
    while (std::chrono::steady_clock::now() < deadline) {
      if (cond()) return true;
      std::this_thread::sleep_for(10ms);  // polling HTTP and the fake's store
    }
    return cond();
  };
  EXPECT_TRUE(wait(
      [&] {
        auto r = http.Get("/readyz");
        return r && r->status == 200;
      },
      10s));
  api.apply(web_pod(true));
  api.apply(web_slice(true));
  auto removed = [&] {
    for (const auto& e : api.events("demo"))
      if (e.find(R"("reason":"DrainRemoved")") != std::string::npos) return true;
    return false;
  };
  // The drain itself, as /debug/state shows it.
  EXPECT_TRUE(wait(
      [&] {
        auto r = http.Get("/debug/state");
        return r && r->body.find(R"("pod":"demo/web-2")") != std::string::npos &&
               r->body.find(R"("removed":)") != std::string::npos;
      },
      10s));
  if (on) {
    ASSERT_TRUE(wait(removed, 10s)) << "no DrainRemoved";
    auto events = api.events("demo");
    EXPECT_NE(events[0].find(R"("reportingInstance":"node-a")"), std::string::npos) << events[0];
    EXPECT_NE(events[0].find(R"("name":"web-2","uid":"u-web-2")"), std::string::npos) << events[0];
  } else {
    std::this_thread::sleep_for(300ms);  // three polls of the drain state
    EXPECT_FALSE(removed());
    EXPECT_TRUE(api.events().empty());
  }
  d.reset();
  unlink(kubeconfig.c_str());
  unlink((kubeconfig + ".sock").c_str());
}

INSTANTIATE_TEST_SUITE_P(OnAndOff, EventsDaemonTest, ::testing::Bool());

// A pod on node-a whose endpoint turns ready gets Propagated once the cluster watermark (here
// node-a alone, with its peer port so the watermark runs) covers the slice that showed it.
TEST(EventsDaemon, ANewReadyEndpointIsPropagated) {
  fakeapi::FakeApiServer api;
  ASSERT_TRUE(api.ok());
  // A member of the drain's cluster: a Node with an InternalIP (where peers would dial it).
  api.apply(
      R"({"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"},"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"}]}})");
  api.apply(
      R"({"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"demo"},"spec":{"clusterIP":"10.96.0.10","ports":[{"name":"http","port":80}]}})");
  api.apply(web_slice(false));
  api.apply(web_pod(false));
  std::string kubeconfig = api.write_kubeconfig();
  ASSERT_FALSE(kubeconfig.empty());
  Config cfg;
  cfg.kubeconfig = kubeconfig;
  cfg.admin_listen = model::HostPort{"127.0.0.1", 0};
  cfg.health_listen = std::nullopt;
  cfg.node_name = "node-a";
  cfg.dataplane = Dataplane::kNone;
  cfg.drain_socket = kubeconfig + ".sock";
  cfg.drain_peer_listen = model::HostPort{"127.0.0.1", 0};
  cfg.drain_peer_insecure = true;
  auto d = std::make_unique<Daemon>(cfg);
  auto st = d->start();
  ASSERT_TRUE(st) << st.error();
  httplib::Client http("127.0.0.1", d->admin_port());
  auto wait = [](const std::function<bool()>& cond, std::chrono::milliseconds for_) {
    auto deadline = std::chrono::steady_clock::now() + for_;
    while (std::chrono::steady_clock::now() < deadline) {
      if (cond()) return true;
      std::this_thread::sleep_for(10ms);  // polling HTTP and the fake's store
    }
    return cond();
  };
  ASSERT_TRUE(wait(
      [&] {
        auto r = http.Get("/readyz");
        return r && r->status == 200;
      },
      10s));
  std::this_thread::sleep_for(300ms);  // the poller's first look: web-2 was ready before it
  std::string slice = web_slice(false);
  slice.replace(
      slice.rfind("]}"), 2,
      R"(,{"addresses":["10.244.1.12"],"nodeName":"node-a","targetRef":{"kind":"Pod","namespace":"demo","name":"web-3","uid":"u-web-3"},"conditions":{"ready":true,"serving":true,"terminating":false}}]})");
  // The EndpointSlice controller's trigger time: the cluster programming latency starts there.
  // (RFC 3339 with microseconds, as the controller writes it: after the agent started.)
  char trigger[48];
  {
    auto now = std::chrono::system_clock::now();
    time_t t = std::chrono::system_clock::to_time_t(now);
    tm parts{};
    gmtime_r(&t, &parts);
    size_t n = std::strftime(trigger, sizeof trigger, "%Y-%m-%dT%H:%M:%S", &parts);
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
    std::snprintf(trigger + n, sizeof trigger - n, ".%06lldZ",
                  static_cast<long long>(us % 1000000));
  }
  slice.replace(slice.find(R"("labels":)"), 0,
                R"("annotations":{"endpoints.kubernetes.io/last-change-trigger-time":")" +
                    std::string(trigger) + R"("},)");
  api.apply(slice);
  auto propagated = [&](const std::string& pod) {
    for (const auto& e : api.events("demo"))
      if (e.find(R"("reason":"Propagated")") != std::string::npos &&
          e.find(R"("name":")" + pod + R"(")") != std::string::npos)
        return true;
    return false;
  };
  EXPECT_TRUE(wait([&] { return propagated("web-3"); }, 10s))
      << "no Propagated; state: " << http.Get("/debug/state")->body;
  EXPECT_FALSE(propagated("web-2")) << "web-2 was ready before the agent looked";
  // The cluster programming latency of web-3's endpoint: one observation, under 5 s.
  std::string metrics = http.Get("/metrics")->body;
  EXPECT_NE(metrics.find("endpointd_cluster_programming_duration_seconds_count 1\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find(R"(endpointd_cluster_programming_duration_seconds_bucket{le="5"} 1)"),
            std::string::npos)
      << metrics;
  for (const auto& e : api.events("demo"))
    if (e.find("Propagated") != std::string::npos) {
      EXPECT_NE(e.find("10.244.1.12 routable on 1/1 node"), std::string::npos) << e;
    }
  d.reset();
  unlink(kubeconfig.c_str());
  unlink((kubeconfig + ".sock").c_str());
}

}  // namespace
}  // namespace endpointd::daemon
