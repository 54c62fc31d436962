// A drain is for one pod (DESIGN.md, "What confirmed means"): an address given to a new pod
// after its old pod was released (pod IP reuse), or shared by hostNetwork pods on one node, is
// never answered by another pod's drain. Each test walks drain::Machine with an injected clock.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "drain/machine.h"
#include "drain/machine_json.h"
#include "tests/drain/fixture.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using testing::ip;

// One endpoint of a service: its address, the pod its targetRef names (empty: no targetRef;
// `uid` empty with a pod: a targetRef without a UID), and its conditions.
struct End {
  std::string ip;
  std::string pod;
  bool ready = true, terminating = false;
  bool uid = true;
  uint16_t port = 8080;
  std::string node = "node-a";
};
struct Svc {
  std::string name;
  std::vector<End> ends;
  bool local = false;  // internalTrafficPolicy: Local
};
struct P {
  std::string name;
  std::string ip;
  bool terminating = false;
  bool host_network = false;
};

// Services of "demo" on node-a (this node) and node-b, with the given pods of node-a.
model::SnapshotPtr snap(uint64_t g, const std::vector<Svc>& svcs, const std::vector<P>& pods) {
  auto s = std::make_shared<model::Snapshot>();
  s->generation = g;
  s->slice_revision = g;
  s->synced = true;
  std::vector<model::ServiceStatePtr> states;
  for (const auto& sv : svcs) {
    auto st = std::make_shared<model::ServiceState>();
    st->service.key = {"demo", sv.name};
    st->service.cluster_ips = {ip("10.96.0." + std::to_string(10 + states.size()))};
    model::ServicePort sp;
    sp.name = "http";
    sp.port = 80;
    sp.target_port_name = "http";
    if (sv.local) st->service.internal_traffic_policy = model::TrafficPolicy::kLocal;
    st->service.ports = {sp};
    for (const auto& e : sv.ends) {
      model::MergedEndpoint m;
      m.address = ip(e.ip);
      m.conditions = {e.ready && !e.terminating, true, e.terminating};
      m.ports = {model::EndpointPort{"http", model::Protocol::kTCP, e.port, ""}};
      m.node_name = e.node;
      if (!e.pod.empty())
        m.target_ref = model::ObjectRef{"Pod", "demo", e.pod, e.uid ? "uid-" + e.pod : ""};
      st->endpoints.push_back(m);
    }
    std::sort(st->endpoints.begin(), st->endpoints.end(),
              [](const auto& a, const auto& b) { return a.address < b.address; });
    st->revision = g;
    states.push_back(st);
  }
  s->services = model::ServiceList(std::move(states));
  testing::add_nodes(*s);
  for (const auto& p : pods) {
    auto pod = std::make_shared<model::Pod>();
    pod->key = {"demo", p.name};
    pod->uid = "uid-" + p.name;
    pod->node_name = "node-a";
    pod->pod_ips = {ip(p.ip)};
    pod->host_network = p.host_network;
    pod->terminating = p.terminating;
    pod->termination_grace_period_seconds = 30;
    pod->annotations[kReleaseAfterAnnotation] = "removed";
    s->pods.push_back(pod);
  }
  std::sort(s->pods.begin(), s->pods.end(),
            [](const auto& a, const auto& b) { return a->key < b->key; });
  return s;
}

// The same services' pods on node-b (in its host network), ready throughout: a terminating pod
// of node-a is never the service's last resort here.
const End kOtherExporter{"192.168.77.3", "exporter-b", true, false, true, 9100};
const End kOtherShipper{"192.168.77.3", "shipper-b", true, false, true, 9200};
const End kOtherDs{"192.168.77.3", "ds-b", true, false, true, 9100};

struct PodDrainTest : ::testing::Test {
  TimePoint t0 = TimePoint(std::chrono::seconds(1000));
  // Peers are asked one by one (no cluster watermark), and a silent one is waited for: node-b's
  // agent is stopped in every test here unless it answers.
  Machine m{[] {
    Options o;
    o.node_name = "node-a";
    o.peer_policy = PeerPolicy::kWait;
    o.default_release_after = ReleaseAfter::kRemoved;
    return o;
  }()};
  Machine::Inputs in(TimePoint now, const model::SnapshotPtr& applied) {
    Machine::Inputs i;
    i.now = now;
    pipeline::AckBoard::Entry e;
    e.consumer = "proxy";
    e.view = model::RouteView::kDataplane;
    e.snapshot = applied;
    i.consumers = {e};
    return i;
  }
  // Drives one pod's drain to its release with node-b confirming: returns the verdict's reason.
  std::string release(const std::string& pod, const model::SnapshotPtr& terminating, TimePoint at) {
    uint64_t w = m.add_waiter({"demo", pod}, "uid-" + pod, at);
    m.on_snapshot(terminating, at);
    m.peer_answered(ip("10.244.1.5"), "node-b", true, "", at + 5ms);
    m.evaluate(in(at + 10ms, terminating));
    auto v = m.verdict(w);
    m.remove_waiter(w);
    return v && v->release ? v->reason : std::string();
  }
};

// The first failure: web-1 drains and is released; the EndpointSlice controller gives
// its address to web-1b in the same slice write; node-b's agent then stops, and web-1b
// terminates. Its prestop must wait for its own removal — not be answered "released,
// confirmed" by web-1's finished drain (which it was, in under 0.1 s).
TEST_F(PodDrainTest, AnAddressReusedInOneSliceWriteIsANewPodsDrain) {
  m.on_snapshot(snap(1, {{"web", {{"10.244.1.5", "web-1"}, {"10.244.1.9", "web-2"}}}},
                     {{"web-1", "10.244.1.5"}, {"web-2", "10.244.1.9"}}),
                t0);
  auto s2 = snap(2, {{"web", {{"10.244.1.5", "web-1", false, true}, {"10.244.1.9", "web-2"}}}},
                 {{"web-1", "10.244.1.5", true}, {"web-2", "10.244.1.9"}});
  EXPECT_NE(release("web-1", s2, t0 + 10ms).find("confirmed"), std::string::npos);
  // One slice write: web-1's endpoint goes, web-1b's comes at the same address.
  auto s3 =
      snap(3, {{"web", {{"10.244.1.5", "web-1b"}, {"10.244.1.9", "web-2"}}}},
           {{"web-1", "10.244.1.5", true}, {"web-1b", "10.244.1.5"}, {"web-2", "10.244.1.9"}});
  m.on_snapshot(s3, t0 + 100ms);
  m.evaluate(in(t0 + 110ms, s3));
  auto s4 = snap(4, {{"web", {{"10.244.1.5", "web-1b", false, true}, {"10.244.1.9", "web-2"}}}},
                 {{"web-1b", "10.244.1.5", true}, {"web-2", "10.244.1.9"}});
  uint64_t w = m.add_waiter({"demo", "web-1b"}, "uid-web-1b", t0 + 200ms);
  m.on_snapshot(s4, t0 + 200ms);
  // Every local consumer has removed it; node-b's agent is stopped and never answers.
  for (auto t = t0 + 210ms; t < t0 + 5s; t += 100ms) {
    m.evaluate(in(t, s4));
    ASSERT_FALSE(m.verdict(w)) << m.verdict(w)->reason;
  }
  const Drain& d = m.drain(ip("10.244.1.5"));
  EXPECT_EQ(d.pod_uid, "uid-web-1b");
  EXPECT_EQ(d.stage, Stage::kStopAccepting);
  EXPECT_EQ(d.peers.at("node-b").state, PeerState::State::kPending);
  // web-1's drain, released, is history: its endpoint left every service with the slice write.
  ASSERT_FALSE(m.finished().empty());
  EXPECT_EQ(m.finished().back().pod_uid, "uid-web-1");
  EXPECT_EQ(m.finished().back().stage, Stage::kReleased);
  // node-b confirms web-1b's removal: released, confirmed, by its own drain.
  m.peer_answered(ip("10.244.1.5"), "node-b", true, "", t0 + 5s);
  m.evaluate(in(t0 + 5s, s4));
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_NE(m.verdict(w)->reason.find("released demo/web-1b"), std::string::npos);
}

// The same across a merged watch: this agent never sees web-1b ready — its next snapshot
// already shows web-1b terminating at web-1's address (updates merged into one build, or a
// relist after a gap).
TEST_F(PodDrainTest, AnAddressReusedAcrossAMergedWatchIsANewPodsDrain) {
  m.on_snapshot(snap(1, {{"web", {{"10.244.1.5", "web-1"}, {"10.244.1.9", "web-2"}}}},
                     {{"web-1", "10.244.1.5"}, {"web-2", "10.244.1.9"}}),
                t0);
  auto s2 = snap(2, {{"web", {{"10.244.1.5", "web-1", false, true}, {"10.244.1.9", "web-2"}}}},
                 {{"web-1", "10.244.1.5", true}, {"web-2", "10.244.1.9"}});
  EXPECT_FALSE(release("web-1", s2, t0 + 10ms).empty());
  auto s5 = snap(5, {{"web", {{"10.244.1.5", "web-1b", false, true}, {"10.244.1.9", "web-2"}}}},
                 {{"web-1b", "10.244.1.5", true}, {"web-2", "10.244.1.9"}});
  uint64_t w = m.add_waiter({"demo", "web-1b"}, "uid-web-1b", t0 + 100ms);
  m.on_snapshot(s5, t0 + 100ms);
  for (auto t = t0 + 110ms; t < t0 + 5s; t += 100ms) {
    m.evaluate(in(t, s5));
    ASSERT_FALSE(m.verdict(w)) << m.verdict(w)->reason;
  }
  EXPECT_EQ(m.drain(ip("10.244.1.5")).stage, Stage::kStopAccepting);
  EXPECT_EQ(m.drain(ip("10.244.1.5")).pod_uid, "uid-web-1b");
}

// Two hostNetwork pods of two services on one node share its address. One terminates: its
// drain is removed once no consumer routes to the address in a service where the endpoint names
// it — the other pod's service still routing to the node's address is that pod's traffic, on
// its own port. Neither pod's prestop is answered by the other's drain.
TEST_F(PodDrainTest, HostNetworkPodsOfTwoServicesOnOneNodeDrainApart) {
  const std::string node_ip = "192.168.77.2";
  auto s1 = snap(1,
                 {{"metrics", {{node_ip, "exporter", true, false, true, 9100}, kOtherExporter}},
                  {"logs", {{node_ip, "shipper", true, false, true, 9200}, kOtherShipper}}},
                 {{"exporter", node_ip, false, true}, {"shipper", node_ip, false, true}});
  m.on_snapshot(s1, t0);
  auto s2 = snap(2,
                 {{"metrics", {{node_ip, "exporter", false, true, true, 9100}, kOtherExporter}},
                  {"logs", {{node_ip, "shipper", true, false, true, 9200}, kOtherShipper}}},
                 {{"exporter", node_ip, true, true}, {"shipper", node_ip, false, true}});
  uint64_t w = m.add_waiter({"demo", "exporter"}, "uid-exporter", t0 + 10ms);
  auto started = m.on_snapshot(s2, t0 + 10ms);
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].uid, "uid-exporter");
  EXPECT_TRUE(m.drains().at(started[0]).shared_address);
  // The proxy still holds s1 (the exporter routed): not removed, whatever node-b says.
  m.peer_answered(ip(node_ip), "node-b", true, "", t0 + 20ms);
  m.evaluate(in(t0 + 20ms, s1));
  EXPECT_FALSE(m.verdict(w));
  // The proxy applied s2: the logs service still routes to the address, in the shipper's name.
  m.evaluate(in(t0 + 30ms, s2));
  ASSERT_TRUE(m.verdict(w)) << drains_json(m, t0 + 30ms, std::chrono::system_clock::now());
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_NE(m.verdict(w)->reason.find("confirmed"), std::string::npos) << m.verdict(w)->reason;
  EXPECT_EQ(m.verdict(w)->reason.find("unconfirmed"), std::string::npos) << m.verdict(w)->reason;
  m.remove_waiter(w);
  // The shipper has no drain; when it terminates its prestop waits for its own.
  EXPECT_EQ(m.drains().count({ip(node_ip), "uid-shipper"}), 0u);
  auto s3 = snap(3,
                 {{"metrics", {kOtherExporter}},
                  {"logs", {{node_ip, "shipper", false, true, true, 9200}, kOtherShipper}}},
                 {{"shipper", node_ip, true, true}});
  uint64_t w2 = m.add_waiter({"demo", "shipper"}, "uid-shipper", t0 + 100ms);
  m.on_snapshot(s3, t0 + 100ms);
  m.evaluate(in(t0 + 110ms, s2));  // the proxy has not applied s3: the shipper is routed
  EXPECT_FALSE(m.verdict(w2));
  EXPECT_EQ(m.drains().at({ip(node_ip), "uid-shipper"}).stage, Stage::kStopAccepting);
}

// A hostNetwork DaemonSet's rollout on one node: the old pod terminates, is released, and the
// new pod comes at the same (node's) address in the same service and port. The new pod's own
// termination later is a drain of its own, not answered by the old one's release.
TEST_F(PodDrainTest, AHostNetworkDaemonSetRolloutDrainsEachPodApart) {
  const std::string node_ip = "192.168.77.2";
  m.on_snapshot(snap(1, {{"agent", {{node_ip, "ds-old", true, false, true, 9100}, kOtherDs}}},
                     {{"ds-old", node_ip, false, true}}),
                t0);
  auto s2 = snap(2, {{"agent", {{node_ip, "ds-old", false, true, true, 9100}, kOtherDs}}},
                 {{"ds-old", node_ip, true, true}});
  uint64_t w = m.add_waiter({"demo", "ds-old"}, "uid-ds-old", t0 + 10ms);
  m.on_snapshot(s2, t0 + 10ms);
  m.peer_answered(ip(node_ip), "node-b", true, "", t0 + 15ms);
  m.evaluate(in(t0 + 20ms, s2));
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  m.remove_waiter(w);
  // The new pod: not ready, then ready, at the node's address.
  auto s3 = snap(3, {{"agent", {{node_ip, "ds-new", false, false, true, 9100}, kOtherDs}}},
                 {{"ds-new", node_ip, false, true}});
  m.on_snapshot(s3, t0 + 100ms);
  auto s4 = snap(4, {{"agent", {{node_ip, "ds-new", true, false, true, 9100}, kOtherDs}}},
                 {{"ds-new", node_ip, false, true}});
  m.on_snapshot(s4, t0 + 200ms);
  m.evaluate(in(t0 + 210ms, s4));
  // The next rollout: ds-new terminates; node-b's agent is stopped now.
  auto s5 = snap(5, {{"agent", {{node_ip, "ds-new", false, true, true, 9100}, kOtherDs}}},
                 {{"ds-new", node_ip, true, true}});
  uint64_t w2 = m.add_waiter({"demo", "ds-new"}, "uid-ds-new", t0 + 300ms);
  m.on_snapshot(s5, t0 + 300ms);
  for (auto t = t0 + 310ms; t < t0 + 3s; t += 100ms) {
    m.evaluate(in(t, s5));
    ASSERT_FALSE(m.verdict(w2)) << m.verdict(w2)->reason;
  }
  EXPECT_EQ(m.drains().at({ip(node_ip), "uid-ds-new"}).stage, Stage::kStopAccepting);
}

// Bad input: an endpoint whose targetRef carries no UID. The drain falls back to the pod of
// this node at the address (the kernel's word on the caller), counts it, and drains as usual.
TEST_F(PodDrainTest, ATargetRefWithoutAUidFallsBackToThePodAtTheAddressAndIsCounted) {
  End e1{"10.244.1.5", "web-1"};
  e1.uid = false;
  m.on_snapshot(snap(1, {{"web", {e1, {"10.244.1.9", "web-2"}}}},
                     {{"web-1", "10.244.1.5"}, {"web-2", "10.244.1.9"}}),
                t0);
  End e2 = e1;
  e2.ready = false;
  e2.terminating = true;
  auto s2 = snap(2, {{"web", {e2, {"10.244.1.9", "web-2"}}}},
                 {{"web-1", "10.244.1.5", true}, {"web-2", "10.244.1.9"}});
  std::string why = release("web-1", s2, t0 + 10ms);
  EXPECT_NE(why.find("released demo/web-1"), std::string::npos) << why;
  EXPECT_GE(m.counters().no_pod_uid, 1u);
  EXPECT_EQ(m.drain(ip("10.244.1.5")).pod_uid, "uid-web-1");
}

// Bad input: two pods (neither hostNetwork) claim one address at once, in two services. Each
// drain is released unconfirmed, naming the other pod, and counted; other drains go on.
TEST_F(PodDrainTest, TwoPodsClaimingOneAddressAreNeverConfirmed) {
  auto s1 = snap(1,
                 {{"web", {{"10.244.1.5", "web-1"}, {"10.244.1.9", "web-2"}}},
                  {"api", {{"10.244.1.5", "api-1"}}}},
                 {{"web-1", "10.244.1.5"}, {"api-1", "10.244.1.5"}, {"web-2", "10.244.1.9"}});
  m.on_snapshot(s1, t0);
  auto s2 =
      snap(2,
           {{"web", {{"10.244.1.5", "web-1", false, true}, {"10.244.1.9", "web-2", false, true}}},
            {"api", {{"10.244.1.5", "api-1", false, true}}}},
           {{"web-1", "10.244.1.5", true},
            {"api-1", "10.244.1.5", true},
            {"web-2", "10.244.1.9", true}});
  uint64_t w1 = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0 + 10ms);
  uint64_t w2 = m.add_waiter({"demo", "web-2"}, "uid-web-2", t0 + 10ms);
  m.on_snapshot(s2, t0 + 10ms);
  m.peer_answered(ip("10.244.1.5"), "node-b", true, "", t0 + 15ms);
  m.peer_answered(ip("10.244.1.9"), "node-b", true, "", t0 + 15ms);
  // Without a ready endpoint web's terminating ones route by the fallback; a ready one is added.
  auto s3 = snap(3,
                 {{"web",
                   {{"10.244.1.5", "web-1", false, true},
                    {"10.244.1.9", "web-2", false, true},
                    {"10.244.1.20", "web-3"}}},
                  {"api", {{"10.244.1.5", "api-1", false, true}, {"10.244.1.21", "api-2"}}}},
                 {{"web-1", "10.244.1.5", true},
                  {"api-1", "10.244.1.5", true},
                  {"web-2", "10.244.1.9", true},
                  {"web-3", "10.244.1.20"},
                  {"api-2", "10.244.1.21"}});
  m.on_snapshot(s3, t0 + 20ms);
  m.peer_answered(ip("10.244.1.5"), "node-b", true, "", t0 + 25ms);
  m.peer_answered(ip("10.244.1.9"), "node-b", true, "", t0 + 25ms);
  m.evaluate(in(t0 + 30ms, s3));
  EXPECT_GE(m.counters().address_conflicts, 1u);
  ASSERT_TRUE(m.verdict(w1));
  EXPECT_NE(m.verdict(w1)->reason.find("unconfirmed"), std::string::npos) << m.verdict(w1)->reason;
  EXPECT_NE(m.verdict(w1)->reason.find("api-1"), std::string::npos) << m.verdict(w1)->reason;
  ASSERT_TRUE(m.verdict(w2));
  EXPECT_EQ(m.verdict(w2)->reason.find("unconfirmed"), std::string::npos) << m.verdict(w2)->reason;
}

// Issue 46's fifth case: a Service-only change (internalTrafficPolicy set to Local) makes the
// terminating endpoint the fallback on its own node — the only endpoint of the service there —
// and is undone, with no EndpointSlice event in between: the cluster watermark, which counts
// slice events, already stood at the drain's revision. A node that applied such a change may
// route to the endpoint by the fallback before its holdout arrives: the drain asks each peer
// instead of trusting the watermark.
TEST_F(PodDrainTest, AServiceOnlyChangeIsNotConfirmedByTheSliceWatermark) {
  const End web1{"10.244.1.5", "web-1"};
  End web1_terminating = web1;
  web1_terminating.ready = false;
  web1_terminating.terminating = true;
  End web2{"10.244.2.9", "web-2"};
  web2.node = "node-b";
  const std::vector<P> pods = {{"web-1", "10.244.1.5", true}};
  auto s1 = snap(1, {{"web", {web1, web2}}}, {{"web-1", "10.244.1.5"}});
  auto s2 = snap(2, {{"web", {web1_terminating, web2}}}, pods);
  // The same slice position: only the Service changed (Local, then Cluster again).
  auto s3 = snap(2, {{"web", {web1_terminating, web2}, true}}, pods);
  auto s4 = snap(2, {{"web", {web1_terminating, web2}}}, pods);
  std::const_pointer_cast<model::Snapshot>(s3)->generation = 3;
  std::const_pointer_cast<model::Snapshot>(s4)->generation = 4;
  ClusterFacts facts;
  facts.routing = facts.dns = 2;  // every node applied every slice event up to the removal
  facts.coverage_current = true;
  facts.members =
      std::make_shared<const std::set<std::string>>(std::set<std::string>{"node-a", "node-b"});
  auto with_facts = [&](TimePoint t, const model::SnapshotPtr& applied) {
    Machine::Inputs i = in(t, applied);
    i.cluster = &facts;
    return i;
  };
  m.on_snapshot(s1, t0);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0 + 10ms);
  m.on_snapshot(s2, t0 + 10ms);
  m.on_snapshot(s3, t0 + 20ms);  // node-a's only endpoint of a Local service: the fallback
  EXPECT_TRUE(m.drain(ip("10.244.1.5")).routed);
  auto started = m.on_snapshot(s4, t0 + 30ms);  // undone
  ASSERT_EQ(started.size(), 1u);
  EXPECT_TRUE(m.drain(ip("10.244.1.5")).ask_peers);
  for (auto t = t0 + 40ms; t < t0 + 3s; t += 100ms) {
    m.evaluate(with_facts(t, s4));
    ASSERT_FALSE(m.verdict(w)) << m.verdict(w)->reason;
  }
  EXPECT_EQ(m.drain(ip("10.244.1.5")).peers.at("node-b").state, PeerState::State::kPending);
  // node-b answers that its state no longer routes to it: confirmed.
  m.peer_answered(ip("10.244.1.5"), "node-b", true, "", t0 + 3s);
  m.evaluate(with_facts(t0 + 3s, s4));
  ASSERT_TRUE(m.verdict(w));
  EXPECT_NE(m.verdict(w)->reason.find("confirmed"), std::string::npos) << m.verdict(w)->reason;
  EXPECT_EQ(m.verdict(w)->reason.find("unconfirmed"), std::string::npos) << m.verdict(w)->reason;
}

// The simulation's seed 22606: a pod's prestop reached an agent whose watch was behind, so its
// view did not list the pod yet (a new pod at a reused address): it was released "has no
// endpoints: nothing to remove" while every consumer routed to it. A pod the view never showed
// is waited for (as one not yet terminating is), then refused.
TEST_F(PodDrainTest, APodTheViewHasNotShownYetIsNotReleasedAsHavingNoEndpoints) {
  auto s1 = snap(1, {{"web", {{"10.244.1.9", "web-2"}}}}, {{"web-2", "10.244.1.9"}});
  m.on_snapshot(s1, t0);
  uint64_t w = m.add_waiter({"demo", "web-7"}, "uid-web-7", t0);
  m.evaluate(in(t0 + 100ms, s1));
  EXPECT_FALSE(m.verdict(w)) << m.verdict(w)->reason;
  // It shows up, terminating: drained as any other.
  auto s2 = snap(2, {{"web", {{"10.244.1.7", "web-7", false, true}, {"10.244.1.9", "web-2"}}}},
                 {{"web-7", "10.244.1.7", true}, {"web-2", "10.244.1.9"}});
  m.on_snapshot(s2, t0 + 200ms);
  m.evaluate(in(t0 + 210ms, s2));
  EXPECT_FALSE(m.verdict(w));
  EXPECT_EQ(m.drain(ip("10.244.1.7")).stage, Stage::kStopAccepting);
  // One that never shows up is refused at the terminating wait, not released.
  uint64_t w2 = m.add_waiter({"demo", "ghost"}, "uid-ghost", t0 + 300ms);
  m.evaluate(in(t0 + 300ms + m.options().terminating_wait, s2));
  ASSERT_TRUE(m.verdict(w2));
  EXPECT_FALSE(m.verdict(w2)->release);
}

// The simulation's seed 13293: an agent restarted and saw a pod terminating before it was handed
// its members (a Node deleted meanwhile, held as a member from its state file): the drain must
// wait for a member handed on after it started too.
TEST_F(PodDrainTest, AMemberHandedOnAfterADrainStartedIsWaitedFor) {
  m.on_snapshot(snap(1, {{"web", {{"10.244.1.5", "web-1"}, {"10.244.1.9", "web-2"}}}},
                     {{"web-1", "10.244.1.5"}, {"web-2", "10.244.1.9"}}),
                t0);
  m.on_snapshot(snap(2, {{"web", {{"10.244.1.5", "web-1", false, true}, {"10.244.1.9", "web-2"}}}},
                     {{"web-1", "10.244.1.5", true}, {"web-2", "10.244.1.9"}}),
                t0 + 10ms);
  EXPECT_EQ(m.drain(ip("10.244.1.5")).peers.count("node-c"), 0u);
  m.set_members({{"node-a", ip("192.168.77.2")},
                 {"node-b", ip("192.168.77.3")},
                 {"node-c", ip("192.168.77.4")}});
  ASSERT_EQ(m.drain(ip("10.244.1.5")).peers.count("node-c"), 1u);
  EXPECT_EQ(m.drain(ip("10.244.1.5")).peers.at("node-c").state, PeerState::State::kPending);
}

}  // namespace
}  // namespace endpointd::drain
