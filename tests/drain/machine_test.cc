// The drain state machine with an injected clock: stage order, confirmations, deadlines and
// degraded inputs, each with its counter.
#include "drain/machine.h"
#include "drain/local_marks.h"
#include "drain/machine_json.h"

#include <gtest/gtest.h>

#include "model/routing.h"
#include "tests/drain/fixture.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using testing::Ep;
using testing::ip;
using testing::make_snapshot;
using testing::PodDef;

const Ep kWeb1{"10.244.1.10", "node-a", true, true, false, "web-1"};
const Ep kWeb1Terminating{"10.244.1.10", "node-a", false, true, true, "web-1"};
const Ep kWeb3{"10.244.2.10", "node-b", true, true, false, "web-3"};

struct MachineTest : ::testing::Test {
  TimePoint t0 = TimePoint(std::chrono::seconds(1000));
  Options opts() {
    Options o;
    o.node_name = "node-a";
    // These tests walk every stage: release after stage 3 unless a test says otherwise.
    o.default_release_after = ReleaseAfter::kDrained;
    return o;
  }
  static pipeline::AckBoard::Entry entry(const std::string& c, model::SnapshotPtr s) {
    pipeline::AckBoard::Entry e;
    e.consumer = c;
    e.view = c == "dns"    ? model::RouteView::kDns
             : c == "feed" ? model::RouteView::kFeed
                           : model::RouteView::kDataplane;
    e.snapshot = std::move(s);
    return e;
  }
  static Machine::Inputs inputs(TimePoint now, std::vector<pipeline::AckBoard::Entry> consumers) {
    Machine::Inputs in;
    in.now = now;
    in.consumers = std::move(consumers);
    return in;
  }
};

// What each consumer's view of the routing rule says of a terminating endpoint (the rule
// itself has its table test in tests/model/routing_test.cc).
bool selectable(std::string_view consumer, const model::Snapshot& snap, const model::IpAddr& a) {
  auto view = consumer == "dns"    ? model::RouteView::kDns
              : consumer == "feed" ? model::RouteView::kFeed
                                   : model::RouteView::kDataplane;
  return model::routes_to(view, snap, a, {"node-a", {}});
}

TEST_F(MachineTest, SelectionFollowsEachConsumersRule) {
  auto both = make_snapshot(1, {kWeb1Terminating, kWeb3});
  EXPECT_FALSE(selectable("proxy", *both, ip("10.244.1.10")));
  EXPECT_TRUE(selectable("proxy", *both, ip("10.244.2.10")));
  // Terminating fallback: the only endpoint left is still chosen by the proxy and the feed.
  auto alone = make_snapshot(2, {kWeb1Terminating});
  EXPECT_TRUE(selectable("proxy", *alone, ip("10.244.1.10")));
  EXPECT_TRUE(selectable("feed", *alone, ip("10.244.1.10")));
  // ready=false without terminating (a failing probe) is not selectable, and not a drain.
  auto unready = make_snapshot(3, {{"10.244.1.10", "node-a", false, false, false, "web-1"}, kWeb3});
  EXPECT_FALSE(selectable("proxy", *unready, ip("10.244.1.10")));
  // DNS answers endpoints of headless services only, and drops terminating ones at once.
  auto headless = make_snapshot(4, {kWeb1, kWeb3}, {}, true);
  EXPECT_TRUE(selectable("dns", *headless, ip("10.244.1.10")));
  EXPECT_FALSE(selectable("proxy", *headless, ip("10.244.1.10")));
  EXPECT_FALSE(
      selectable("dns", *make_snapshot(5, {kWeb1Terminating, kWeb3}, {}, true), ip("10.244.1.10")));
  EXPECT_FALSE(selectable("dns", *both, ip("10.244.2.10")));
  auto unsynced = std::make_shared<model::Snapshot>();
  EXPECT_TRUE(selectable("proxy", *unsynced, ip("10.244.1.10")));
}

// What a peer asked directly answers (drain::local_removal, the AwaitRemoval server's answer):
// a feed subscriber that lapsed is a holdout; one whose last accepted state is known and does
// not route to the address leaves it removed, and one known only by a revision (remembered
// across the agent's restart without its state) may route to anything: not removed.
TEST_F(MachineTest, APeersAnswerCountsAHoldoutWhoseStateIsNotKnown) {
  auto out = make_snapshot(2, {kWeb3});
  auto feed = entry("feed", out);
  auto proxy = entry("proxy", out);
  const auto t = t0;
  EXPECT_TRUE(local_removal({proxy, feed}, ip("10.244.1.10"), "node-b", t).removed);
  feed.holdouts.push_back({"ingress-1", out, t, "disconnected", 0});
  EXPECT_TRUE(local_removal({proxy, feed}, ip("10.244.1.10"), "node-b", t).removed);
  feed.holdouts.push_back({"ingress-2", nullptr, t, "disconnected", 1});
  auto r = local_removal({proxy, feed}, ip("10.244.1.10"), "node-b", t);
  EXPECT_FALSE(r.removed);
  ASSERT_FALSE(r.consumers.empty());
  EXPECT_EQ(r.consumers.back().name, "feed/ingress-2");
}

// A peer asked about a removal at revision 5 whose feed's oldest accepted state is revision 2,
// where the address was another pod's, terminating: that state does not route to it, but a
// subscriber at a newer state may (the new pod at the reused address). Not removed until every
// consumer applied revision 5.
TEST_F(MachineTest, APeersConsumerThatHasNotAppliedTheRemovalIsNotRemoved) {
  auto at = [](uint64_t revision) {
    auto s = std::make_shared<model::Snapshot>(*make_snapshot(revision, {kWeb1Terminating, kWeb3}));
    s->slice_revision = revision;
    return model::SnapshotPtr(s);
  };
  auto old_state = at(2);
  auto removal = at(5);
  auto proxy = entry("proxy", removal);
  auto feed = entry("feed", old_state);
  EXPECT_TRUE(local_removal({proxy, feed}, ip("10.244.1.10"), "node-b", t0).removed)
      << "without the revision the old state's answer stands";
  auto r = local_removal({proxy, feed}, ip("10.244.1.10"), "node-b", t0, 5);
  EXPECT_FALSE(r.removed);
  feed.snapshot = removal;
  EXPECT_TRUE(local_removal({proxy, feed}, ip("10.244.1.10"), "node-b", t0, 5).removed);
}

TEST_F(MachineTest, StagesInOrderWithPeersAndConntrack) {
  Options o = opts();
  Machine m(o);
  auto s1 = make_snapshot(1, {kWeb1, kWeb3}, {{"web-1", "10.244.1.10"}});
  EXPECT_TRUE(m.on_snapshot(s1, t0).empty());
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m.evaluate(inputs(t0, {entry("proxy", s1)}));
  EXPECT_FALSE(m.verdict(w));

  auto s2 = make_snapshot(2, {kWeb1Terminating, kWeb3}, {{"web-1", "10.244.1.10", "node-a", true}});
  auto started = m.on_snapshot(s2, t0 + 10ms);
  ASSERT_EQ(started.size(), 1u);
  const Drain& d = m.drain(ip("10.244.1.10"));
  EXPECT_EQ(d.stage, Stage::kStopAccepting);
  ASSERT_EQ(d.peers.size(), 1u);
  EXPECT_EQ(d.peers.at("node-b").address, "192.168.77.3");
  // The proxy still has generation 1: not removed.
  m.evaluate(inputs(t0 + 20ms, {entry("proxy", s1), entry("dns", s2)}));
  EXPECT_EQ(d.stage, Stage::kStopAccepting);
  // The proxy applied 2, but the peer has not answered.
  m.evaluate(inputs(t0 + 30ms, {entry("proxy", s2), entry("dns", s2)}));
  EXPECT_EQ(d.stage, Stage::kStopAccepting);
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0 + 40ms);
  m.evaluate(inputs(t0 + 40ms, {entry("proxy", s2), entry("dns", s2)}));
  EXPECT_EQ(d.stage, Stage::kRemoved);
  EXPECT_EQ(m.need_flow_counts(), std::vector<model::IpAddr>{ip("10.244.1.10")});
  auto in = inputs(t0 + 50ms, {entry("proxy", s2), entry("dns", s2)});
  drain::FlowCount busy;
  busy.tcp_established = 2;
  in.flows.emplace(ip("10.244.1.10"), busy);
  m.evaluate(in);
  EXPECT_EQ(d.stage, Stage::kRemoved);
  EXPECT_FALSE(m.verdict(w));
  in.now = t0 + 70ms;
  in.flows.clear();
  in.flows.emplace(ip("10.244.1.10"), drain::FlowCount{});
  m.evaluate(in);
  EXPECT_EQ(d.stage, Stage::kReleased);
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_LE(*d.stop_accepting, *d.removed);
  EXPECT_LE(*d.removed, *d.drained);
  EXPECT_LE(*d.drained, *d.released);
  EXPECT_EQ(*d.released, t0 + 70ms);
  EXPECT_EQ(m.counters().removal_deadlines, 0u);
  EXPECT_EQ(m.counters().peers_unconfirmed, 0u);
  EXPECT_NE(
      drains_json(m, t0 + 70ms, std::chrono::system_clock::now()).find("\"stage\":\"released\""),
      std::string::npos);
  EXPECT_EQ(d.prestop_called, t0);  // when the prestop call arrived, for release latency
  EXPECT_NE(drains_json(m, t0 + 70ms, std::chrono::system_clock::now()).find("\"prestop_called\":"),
            std::string::npos);
  // The endpoint leaves the slices: the drain becomes history.
  m.remove_waiter(w);
  m.on_snapshot(make_snapshot(3, {kWeb3}, {}), t0 + 80ms);
  EXPECT_TRUE(m.drains().empty());
  EXPECT_EQ(m.finished().size(), 1u);
}

// `snap` at EndpointSlice position `rev`, its service's state first seen there and directly
// following the state at `follows` (0: states were merged or skipped on the way).
model::SnapshotPtr at_revision(model::SnapshotPtr snap, uint64_t rev, uint64_t follows) {
  auto s = std::make_shared<model::Snapshot>(*snap);
  s->slice_revision = rev;
  auto st = std::make_shared<model::ServiceState>(*s->find({"demo", "web"}));
  st->revision = rev;
  st->follows = follows;
  s->services = model::ServiceList({st});
  return s;
}

ClusterFacts facts_at(uint64_t routing) {
  ClusterFacts c;
  c.routing = c.dns = routing;
  c.coverage_current = true;
  c.members =
      std::make_shared<const std::set<std::string>>(std::set<std::string>{"node-a", "node-b"});
  return c;
}

// An agent whose view of the service jumped (paused, or its watch relisted) may have skipped a
// state that routed to the draining pod by the terminating fallback; node-b may still hold it,
// and facts made before node-b got there list no holdout. The peers are confirmed again by a
// watermark past the jump; an agent that saw each state in turn is not held.
TEST_F(MachineTest, AViewThatSkippedStatesOfTheServiceIsConfirmedPastThem) {
  const Ep kWeb4{"10.244.2.11", "node-b", true, true, false, "web-4"};
  for (bool skipped : {true, false}) {
    SCOPED_TRACE(skipped ? "skipped" : "every state seen");
    Machine m(opts());
    auto pods = std::vector<PodDef>{{"web-1", "10.244.1.10", "node-a", true}};
    auto s1 = at_revision(make_snapshot(1, {kWeb1, kWeb3}, {{"web-1", "10.244.1.10"}}), 101, 100);
    m.on_snapshot(s1, t0);
    uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
    auto s2 = at_revision(make_snapshot(2, {kWeb1Terminating, kWeb3}, pods), 102, 101);
    m.on_snapshot(s2, t0 + 10ms);
    const Drain& d = m.drain(ip("10.244.1.10"));
    ClusterFacts old = facts_at(102);
    auto in = inputs(t0 + 20ms, {entry("proxy", s2)});
    in.cluster = &old;
    drain::FlowCount busy;
    busy.tcp_established = 1;
    in.flows.emplace(ip("10.244.1.10"), busy);
    m.evaluate(in);
    ASSERT_EQ(d.stage, Stage::kRemoved);
    EXPECT_EQ(d.peers.at("node-b").state, PeerState::State::kConfirmed);

    // Revisions 103-105 (web-3 unready: web-1 routed by the fallback on every node that
    // applied them, then web-4 ready) reach this agent as one jump to 106.
    auto s3 = at_revision(make_snapshot(3, {kWeb1Terminating, kWeb3, kWeb4}, pods), 106,
                          skipped ? 105 : 102);
    m.on_snapshot(s3, t0 + 30ms);
    in = inputs(t0 + 40ms, {entry("proxy", s3)});
    in.cluster = &old;
    in.flows.emplace(ip("10.244.1.10"), drain::FlowCount{});
    m.evaluate(in);
    if (!skipped) {
      EXPECT_EQ(d.stage, Stage::kReleased);
      ASSERT_TRUE(m.verdict(w));
      EXPECT_EQ(d.outcome(), "confirmed");
      continue;
    }
    EXPECT_FALSE(m.verdict(w)) << "released on facts older than the states it skipped";
    EXPECT_EQ(d.confirm_at(), 106u);
    EXPECT_EQ(d.peers.at("node-b").state, PeerState::State::kPending);
    EXPECT_NE(d.peers.at("node-b").last_error.find("last change 106"), std::string::npos)
        << d.peers.at("node-b").last_error;
    ClusterFacts past = facts_at(106);
    in.now = t0 + 50ms;
    in.cluster = &past;
    m.evaluate(in);
    EXPECT_EQ(d.stage, Stage::kReleased);
    ASSERT_TRUE(m.verdict(w));
    EXPECT_EQ(d.outcome(), "confirmed");
  }
}

TEST_F(MachineTest, ReleaseAfterRemovedSkipsTheDrain) {
  Machine m(opts());
  auto s = make_snapshot(2, {kWeb1Terminating, kWeb3},
                         {{"web-1", "10.244.1.10", "node-a", true, 30, "removed"}});
  m.on_snapshot(s, t0);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  m.evaluate(inputs(t0 + 5ms, {entry("proxy", s)}));
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_FALSE(m.drain(ip("10.244.1.10")).drained);
}

// Issue 47: new connections that reach the pod after its removal was confirmed (observed on
// its node) make the release unconfirmed, naming who sent them.
TEST_F(MachineTest, LateTrafficMakesTheReleaseUnconfirmed) {
  Machine m(opts());
  auto s = make_snapshot(2, {kWeb1Terminating, kWeb3},
                         {{"web-1", "10.244.1.10", "node-a", true, 30, "removed"}});
  m.on_snapshot(s, t0);
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  auto in = inputs(t0 + 5ms, {entry("proxy", s)});
  m.evaluate(in);
  ASSERT_EQ(m.drain(ip("10.244.1.10")).stage, Stage::kRemoved);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0 + 20ms);
  in.now = t0 + 20ms;
  in.late[DrainKey{ip("10.244.1.10"), "uid-web-1"}] = {"outside the cluster (203.0.113.9): 3",
                                                       t0 + 15ms};
  m.evaluate(in);
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  const Drain& d = m.drain(ip("10.244.1.10"));
  ASSERT_EQ(d.unconfirmed.size(), 1u);
  EXPECT_EQ(d.unconfirmed[0].consumer, "late traffic");
  EXPECT_EQ(d.unconfirmed[0].reason,
            "new connections after the removal from outside the cluster (203.0.113.9): 3");
  EXPECT_NE(m.verdict(w)->reason.find("late traffic"), std::string::npos) << m.verdict(w)->reason;
  EXPECT_EQ(m.counters().released_unconfirmed, 1u);
}

// release-after silent: released once no new connection arrived for `quiet` after the removal
// and after the newest late one; a sender that never stops holds it to the budget's end.
TEST_F(MachineTest, ReleaseAfterSilentWaitsForTheLateSendersToStop) {
  Options o = opts();
  o.quiet = 500ms;
  Machine m(o);
  auto s = make_snapshot(2, {kWeb1Terminating, kWeb3},
                         {{"web-1", "10.244.1.10", "node-a", true, 30, "silent"}});
  m.on_snapshot(s, t0);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  auto in = inputs(t0 + 5ms, {entry("proxy", s)});
  m.evaluate(in);
  const Drain& d = m.drain(ip("10.244.1.10"));
  ASSERT_EQ(d.stage, Stage::kRemoved);
  EXPECT_EQ(m.next_deadline(), t0 + 505ms);
  // A late connection at 300 ms: the quiet time starts again from it.
  in.late[DrainKey{ip("10.244.1.10"), "uid-web-1"}] = {"node node-c (10.0.0.3): 1", t0 + 300ms};
  in.now = t0 + 400ms;
  m.evaluate(in);
  in.now = t0 + 600ms;
  m.evaluate(in);
  EXPECT_FALSE(m.verdict(w)) << "released 300 ms after a late connection";
  EXPECT_EQ(m.next_deadline(), t0 + 800ms);
  in.now = t0 + 800ms;
  m.evaluate(in);
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_FALSE(d.drain_forced);
  ASSERT_EQ(d.unconfirmed.size(), 1u);
  EXPECT_EQ(d.unconfirmed[0].consumer, "late traffic");

  // Another pod whose sender keeps sending: released at its budget's end, forced.
  Machine m2(o);
  m2.on_snapshot(s, t0);
  uint64_t w2 = m2.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m2.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  auto in2 = inputs(t0 + 5ms, {entry("proxy", s)});
  m2.evaluate(in2);
  TimePoint end = m2.drain(ip("10.244.1.10")).budget_end;
  for (TimePoint t = t0 + 100ms; t < end; t += 400ms) {
    in2.late[DrainKey{ip("10.244.1.10"), "uid-web-1"}] = {"node node-c (10.0.0.3): 9", t};
    in2.now = t;
    m2.evaluate(in2);
    ASSERT_FALSE(m2.verdict(w2)) << "released while connections still arrived";
  }
  in2.now = end;
  m2.evaluate(in2);
  ASSERT_TRUE(m2.verdict(w2));
  EXPECT_TRUE(m2.drain(ip("10.244.1.10")).drain_forced);
  EXPECT_EQ(m2.counters().drain_deadlines, 1u);
}

TEST_F(MachineTest, TerminatingFallbackIsBoundedByTheBudget) {
  Machine m(opts());
  // web-1 is the only endpoint: the proxy keeps it as a last resort, so removal never comes.
  auto s = make_snapshot(2, {kWeb1Terminating}, {{"web-1", "10.244.1.10", "node-a", true, 10}});
  m.on_snapshot(s, t0);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  m.evaluate(inputs(t0 + 1s, {entry("proxy", s)}));
  EXPECT_EQ(m.drain(ip("10.244.1.10")).stage, Stage::kStopAccepting);
  // Grace 10 s, margin max(2 s, 20 %) = 2 s: the budget ends at 8 s.
  ASSERT_TRUE(m.next_deadline());
  // The peer deadline does not count: the one peer answered already.
  EXPECT_EQ(*m.next_deadline(), t0 + 8s);
  auto in = inputs(t0 + 8s, {entry("proxy", s)});
  in.flows.emplace(ip("10.244.1.10"), drain::FlowCount{});
  m.evaluate(in);
  m.evaluate(in);
  EXPECT_EQ(m.counters().removal_deadlines, 1u);
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_NE(m.verdict(w)->reason.find("removal deadline"), std::string::npos);
  EXPECT_TRUE(m.drain(ip("10.244.1.10")).removal_forced);
}

// The budget is the API's: it ends a margin before the pod's deletionTimestamp, whichever
// agent sees it and whenever; a timestamp beyond the grace period from now (a skewed clock)
// or already past is clamped, counted and noted.
TEST_F(MachineTest, BudgetEndsAtTheDeletionTimestamp) {
  // The wall clock reads 2026-11-25T12:00:00Z.
  const auto wall = std::chrono::system_clock::from_time_t(1795608000);
  auto budget_of = [&](const std::string& deletion, uint64_t* clamped) {
    Options o = opts();
    o.wall_clock = [wall] { return wall; };
    Machine m(o);
    auto s = make_snapshot(2, {kWeb1Terminating, kWeb3},
                           {{"web-1", "10.244.1.10", "node-a", true, 10, {}, deletion}});
    m.on_snapshot(s, t0);
    *clamped = m.counters().deletion_clamped;
    const Drain& d = m.drain(ip("10.244.1.10"));
    return std::chrono::duration_cast<std::chrono::milliseconds>(d.budget_end - d.start);
  };
  uint64_t clamped = 0;
  // Deleted 4 s ago with a 10 s grace: the kubelet kills at 12:00:06; margin 2 s → 4 s left.
  EXPECT_EQ(budget_of("2026-11-25T12:00:06Z", &clamped), 4000ms);
  EXPECT_EQ(clamped, 0u);
  EXPECT_EQ(budget_of("2026-11-25T12:00:06.500Z", &clamped), 4500ms);
  EXPECT_EQ(budget_of("2026-11-25T13:00:06+01:00", &clamped), 4000ms);
  // No timestamp: the grace period from now, less the margin.
  EXPECT_EQ(budget_of("", &clamped), 8000ms);
  EXPECT_EQ(clamped, 0u);
  // A minute ahead: beyond the grace period from now; clamped to it and counted.
  EXPECT_EQ(budget_of("2026-11-25T12:01:00Z", &clamped), 8000ms);
  EXPECT_EQ(clamped, 1u);
  // Already past (a late start, or a clock ahead): the floor, counted.
  EXPECT_EQ(budget_of("2026-11-25T11:59:00Z", &clamped), 1000ms);
  EXPECT_EQ(clamped, 1u);
  // Unreadable: ignored, the grace period from now.
  EXPECT_EQ(budget_of("yesterday", &clamped), 8000ms);
  EXPECT_EQ(clamped, 0u);
}

TEST_F(MachineTest, PeerDeadlinePolicies) {
  for (PeerPolicy policy : {PeerPolicy::kProceed, PeerPolicy::kWait}) {
    Options o = opts();
    o.peer_policy = policy;
    o.peer_timeout = 500ms;
    Machine m(o);
    auto s = make_snapshot(2, {kWeb1Terminating, kWeb3},
                           {{"web-1", "10.244.1.10", "node-a", true, 30, "removed"}});
    m.on_snapshot(s, t0);
    m.evaluate(inputs(t0 + 600ms, {entry("proxy", s)}));
    const Drain& d = m.drain(ip("10.244.1.10"));
    if (policy == PeerPolicy::kProceed) {
      EXPECT_EQ(d.stage, Stage::kRemoved);
      EXPECT_EQ(m.counters().peers_unconfirmed, 1u);
      EXPECT_EQ(m.counters().removal_deadlines, 0u);
    } else {
      EXPECT_EQ(d.stage, Stage::kStopAccepting);
      m.evaluate(inputs(d.removal_deadline, {entry("proxy", s)}));
      EXPECT_EQ(d.stage, Stage::kRemoved);
      EXPECT_EQ(m.counters().peers_unconfirmed, 1u);
      EXPECT_EQ(m.counters().removal_deadlines, 1u);
    }
  }
}

// After an evaluation, the next deadline is ahead of it (or there is none): a deadline already
// passed would wake the drain loop again at once, for nothing, as long as the state lasts —
// a drained drain waiting for its prestop call, a waiter past its terminating wait while its
// drain goes on, a stop-accepting drain past its peer deadline while a local consumer lags.
TEST_F(MachineTest, NoDeadlineIsLeftBehindAnEvaluation) {
  Options o = opts();
  o.peer_policy = PeerPolicy::kProceed;
  o.peer_timeout = 500ms;
  o.terminating_wait = 1000ms;
  Machine m(o);
  auto pods = std::vector<PodDef>{{"web-1", "10.244.1.10", "node-a", true}};
  auto s1 = make_snapshot(1, {kWeb1, kWeb3}, {{"web-1", "10.244.1.10"}});
  auto s2 = make_snapshot(2, {kWeb1Terminating, kWeb3}, pods);
  m.on_snapshot(s1, t0);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m.on_snapshot(s2, t0 + 10ms);
  const Drain& d = m.drain(ip("10.244.1.10"));
  auto ahead = [&](TimePoint now) {
    auto next = m.next_deadline();
    EXPECT_TRUE(!next || *next > now) << "a deadline " << (now - *next).count() << " ns behind";
  };
  // Past the peer deadline, the local proxy still on generation 1.
  TimePoint now = t0 + 700ms;
  m.evaluate(inputs(now, {entry("proxy", s1)}));
  EXPECT_EQ(d.stage, Stage::kStopAccepting);
  ahead(now);
  // Past the waiter's terminating wait, the drain removed and waiting for its connections.
  now = t0 + 1500ms;
  auto in = inputs(now, {entry("proxy", s2)});
  drain::FlowCount busy;
  busy.tcp_established = 1;
  in.flows.emplace(ip("10.244.1.10"), busy);
  m.evaluate(in);
  EXPECT_EQ(d.stage, Stage::kRemoved);
  EXPECT_FALSE(m.verdict(w));
  ahead(now);
  // Drained, its waiter gone (the kubelet gave up on the hook): nothing left to wait for.
  m.remove_waiter(w);
  now = t0 + 1600ms;
  in = inputs(now, {entry("proxy", s2)});
  in.flows.emplace(ip("10.244.1.10"), drain::FlowCount{});
  m.evaluate(in);
  EXPECT_EQ(d.stage, Stage::kDrained);
  ahead(now);

  // Released after removal, nobody waiting (the pod's prestop call not made yet, or never: a
  // pod without a hook): removed, past its budget, and nothing to do until a call comes.
  Machine r(o);
  auto rpods = std::vector<PodDef>{{"web-1", "10.244.1.10", "node-a", true, 30, "removed"}};
  r.on_snapshot(s1, t0);
  r.on_snapshot(make_snapshot(2, {kWeb1Terminating, kWeb3}, rpods), t0 + 10ms);
  r.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0 + 20ms);
  auto s3 = make_snapshot(2, {kWeb1Terminating, kWeb3}, rpods);
  now = t0 + 60s;
  r.evaluate(inputs(now, {entry("proxy", s3)}));
  EXPECT_EQ(r.drain(ip("10.244.1.10")).stage, Stage::kRemoved);
  auto next = r.next_deadline();
  EXPECT_TRUE(!next || *next > now);
}

TEST_F(MachineTest, DnsWaitsForTheLastAnswersTtl) {
  Machine m(opts());
  auto s = make_snapshot(2, {kWeb1Terminating, kWeb3}, {{"web-1", "10.244.1.10", "node-a", true}});
  m.on_snapshot(s, t0);
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  auto in = inputs(t0 + 1s, {entry("proxy", s), entry("dns", s)});
  // What the DNS sink publishes on its board entry: its last answer carrying the address
  // expires at t0 + 5 s.
  auto answers = std::make_shared<pipeline::AnswerExpiry>();
  answers->until[ip("10.244.1.10")] = t0 + 5s;
  in.consumers[1].answers = answers;
  m.evaluate(in);
  EXPECT_EQ(m.drain(ip("10.244.1.10")).stage, Stage::kStopAccepting);
  EXPECT_TRUE(m.drain(ip("10.244.1.10")).consumers_confirmed.count("proxy"));
  in.now = t0 + 5s;
  m.evaluate(in);
  EXPECT_EQ(m.drain(ip("10.244.1.10")).stage, Stage::kRemoved);
}

TEST_F(MachineTest, ConntrackUnavailableIsCountedAndBounded) {
  Options o = opts();
  o.conntrack_unavailable_wait = 1s;
  Machine m(o);
  auto s = make_snapshot(2, {kWeb1Terminating, kWeb3}, {{"web-1", "10.244.1.10", "node-a", true}});
  m.on_snapshot(s, t0);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  auto in = inputs(t0 + 10ms, {entry("proxy", s)});
  m.evaluate(in);
  in.flows.emplace(ip("10.244.1.10"), Error{"netlink: operation not permitted"});
  m.evaluate(in);
  EXPECT_EQ(m.counters().conntrack_unavailable, 1u);
  EXPECT_FALSE(m.verdict(w));
  in.now = t0 + 1010ms;
  m.evaluate(in);
  ASSERT_TRUE(m.verdict(w));
  EXPECT_NE(m.verdict(w)->reason.find("conntrack unavailable"), std::string::npos);
}

TEST_F(MachineTest, PrestopBeforeTheApiShowsTerminating) {
  Options o = opts();
  o.terminating_wait = 2s;
  Machine m(o);
  auto s1 = make_snapshot(1, {kWeb1, kWeb3}, {{"web-1", "10.244.1.10"}});
  m.on_snapshot(s1, t0);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m.evaluate(inputs(t0 + 1s, {entry("proxy", s1)}));
  EXPECT_FALSE(m.verdict(w));
  // The pod becomes terminating but its endpoint does not (yet): waiting-terminating.
  auto s2 = make_snapshot(2, {kWeb1, kWeb3}, {{"web-1", "10.244.1.10", "node-a", true, 10}});
  m.on_snapshot(s2, t0 + 1500ms);
  m.evaluate(inputs(t0 + 1500ms, {entry("proxy", s2)}));
  EXPECT_FALSE(m.verdict(w));
  EXPECT_EQ(m.drain(ip("10.244.1.10")).stage, Stage::kWaitingTerminating);
  // It never does: at the end of the budget the caller is told why, with a non-zero exit.
  m.evaluate(inputs(t0 + 1500ms + 8s, {entry("proxy", s2)}));
  ASSERT_TRUE(m.verdict(w));
  EXPECT_FALSE(m.verdict(w)->release);
  EXPECT_EQ(m.counters().never_terminating, 1u);
  // A pod the API never shows terminating.
  uint64_t w2 = m.add_waiter({"demo", "web-9"}, "uid-web-9", t0);
  auto s3 = make_snapshot(3, {kWeb3}, {{"web-9", "10.244.1.99"}});
  m.on_snapshot(s3, t0);
  m.evaluate(inputs(t0 + 2s, {entry("proxy", s3)}));
  ASSERT_TRUE(m.verdict(w2));
  EXPECT_FALSE(m.verdict(w2)->release);
  EXPECT_EQ(m.counters().not_terminating_in_api, 1u);
}

TEST_F(MachineTest, PodWithoutEndpointsIsReleasedAtOnce) {
  Machine m(opts());
  auto s = make_snapshot(1, {kWeb3}, {{"batch-1", "10.244.1.50", "node-a", true}});
  m.on_snapshot(s, t0);
  uint64_t w = m.add_waiter({"demo", "batch-1"}, "uid-batch-1", t0);
  m.evaluate(inputs(t0, {entry("proxy", s)}));
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_EQ(m.counters().no_endpoints, 1u);
}

TEST_F(MachineTest, RemoteEndpointsAreNotDrainedHere) {
  Machine m(opts());
  auto s = make_snapshot(2, {kWeb1, {"10.244.2.10", "node-b", false, true, true, "web-3"}});
  EXPECT_TRUE(m.on_snapshot(s, t0).empty());
  EXPECT_TRUE(m.drains().empty());
}

// An endpoint without a nodeName is this node's when one of this node's pods has its address:
// its drain starts when that pod appears, though the service itself did not change (the
// machine follows each snapshot's difference, pods included).
TEST_F(MachineTest, EndpointWithoutNodeNameIsLocalOnceThisNodesPodHasItsAddress) {
  Machine m(opts());
  auto s1 = make_snapshot(1, {{"10.244.1.10", "", false, true, true, "web-1"}, kWeb3});
  EXPECT_TRUE(m.on_snapshot(s1, t0).empty());
  EXPECT_TRUE(m.drains().empty());
  auto s2 = std::make_shared<model::Snapshot>(*s1);  // the same service objects
  s2->generation = 2;
  s2->pods = make_snapshot(2, {}, {PodDef{"web-1", "10.244.1.10", "node-a", true, 30}})->pods;
  auto started = m.on_snapshot(s2, t0 + 1ms);
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].ip, ip("10.244.1.10"));
  // A later snapshot that changes nothing starts nothing again.
  auto s3 = std::make_shared<model::Snapshot>(*s2);
  s3->generation = 3;
  EXPECT_TRUE(m.on_snapshot(s3, t0 + 2ms).empty());
  EXPECT_EQ(m.drains().size(), 1u);
}

// The default releases after removal; a drain action runs only once the pod is removed
// everywhere, and the release then waits for conntrack to empty.
TEST_F(MachineTest, DrainActionRunsAfterRemovalAndTheReleaseWaitsForTheDrain) {
  Options o;
  o.node_name = "node-a";  // the shipped default: release after removal
  Machine m(o);
  PodDef web1{"web-1", "10.244.1.10", "node-a", true, 30};
  web1.drain_action = "exec:nginx -s quit";
  // The prestop arrives while the slice still shows the endpoint ready: nothing is due.
  auto s1 = make_snapshot(1, {kWeb1, kWeb3}, {web1});
  m.on_snapshot(s1, t0);
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  TimePoint deadline{};
  m.evaluate(inputs(t0 + 1ms, {entry("proxy", s1)}));
  EXPECT_FALSE(m.take_due_action(w, t0 + 1ms, &deadline));
  auto s2 = make_snapshot(2, {kWeb1Terminating, kWeb3}, {web1});
  m.on_snapshot(s2, t0 + 10ms);
  m.evaluate(inputs(t0 + 10ms, {entry("proxy", s1)}));  // not yet applied: not removed
  EXPECT_FALSE(m.take_due_action(w, t0 + 10ms, &deadline));
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0 + 20ms);
  m.evaluate(inputs(t0 + 20ms, {entry("proxy", s2)}));
  ASSERT_EQ(m.drain(ip("10.244.1.10")).stage, Stage::kRemoved);
  EXPECT_FALSE(m.verdict(w)) << "released before its drain action ran";
  auto due = m.take_due_action(w, t0 + 20ms, &deadline);
  ASSERT_TRUE(due);
  EXPECT_EQ(*due, "exec:nginx -s quit");
  EXPECT_EQ(deadline, m.drain(ip("10.244.1.10")).budget_end);
  EXPECT_FALSE(m.take_due_action(w, t0 + 20ms, &deadline)) << "due twice";
  m.action_finished(w, Result<std::string>(std::string("`nginx -s quit` exited 0")), t0 + 30ms);
  // The application now closes its connections: the release waits for conntrack.
  auto in = inputs(t0 + 40ms, {entry("proxy", s2)});
  in.flows.insert_or_assign(ip("10.244.1.10"), Result<FlowCount>(FlowCount{3, 0}));
  m.evaluate(in);
  EXPECT_FALSE(m.verdict(w));
  in = inputs(t0 + 900ms, {entry("proxy", s2)});
  in.flows.insert_or_assign(ip("10.244.1.10"), Result<FlowCount>(FlowCount{0, 0}));
  m.evaluate(in);
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_NE(m.verdict(w)->reason.find("nginx -s quit"), std::string::npos) << m.verdict(w)->reason;
  const Drain& d = m.drains().count({ip("10.244.1.10"), "uid-web-1"}) ? m.drain(ip("10.244.1.10"))
                                                                      : m.finished().back();
  EXPECT_FALSE(d.drain_forced);
  ASSERT_TRUE(d.action_started && d.removed && d.drained);
  EXPECT_LE(*d.removed, *d.action_started);
  EXPECT_LE(*d.action_done, *d.drained);
}

// A drain action that fails releases the pod after removal (SIGTERM is then its drain), with
// the error in the verdict; one that does not parse is no action, counted and named.
TEST_F(MachineTest, FailedOrInvalidDrainActionReleasesAfterRemovalAndSaysWhy) {
  Options o;
  o.node_name = "node-a";
  Machine m(o);
  PodDef web1{"web-1", "10.244.1.10", "node-a", true, 30};
  web1.drain_action = "signal:QUIT";
  auto s = make_snapshot(2, {kWeb1Terminating, kWeb3}, {web1});
  m.on_snapshot(s, t0);
  // The client's flag wins over the annotation.
  uint64_t w = m.add_waiter({"demo", "web-1"}, "uid-web-1", t0, "exec:/no/such/binary");
  m.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  m.evaluate(inputs(t0 + 5ms, {entry("proxy", s)}));
  TimePoint deadline{};
  auto due = m.take_due_action(w, t0 + 5ms, &deadline);
  ASSERT_TRUE(due);
  EXPECT_EQ(*due, "exec:/no/such/binary");
  m.action_finished(w, Result<std::string>(Error{"cannot run `/no/such/binary`: No such file"}),
                    t0 + 6ms);
  auto in = inputs(t0 + 7ms, {entry("proxy", s)});
  in.flows.insert_or_assign(ip("10.244.1.10"), Result<FlowCount>(FlowCount{3, 0}));
  m.evaluate(in);
  ASSERT_TRUE(m.verdict(w));
  EXPECT_TRUE(m.verdict(w)->release);
  EXPECT_NE(m.verdict(w)->reason.find("drain action failed: cannot run `/no/such/binary`"),
            std::string::npos)
      << m.verdict(w)->reason;
  EXPECT_EQ(m.counters().action_failures, 1u);

  Machine m2(o);
  PodDef bad{"web-1", "10.244.1.10", "node-a", true, 30};
  bad.drain_action = "signal:BOGUS";
  auto s2 = make_snapshot(2, {kWeb1Terminating, kWeb3}, {bad});
  m2.on_snapshot(s2, t0);
  uint64_t w2 = m2.add_waiter({"demo", "web-1"}, "uid-web-1", t0);
  m2.peer_answered(ip("10.244.1.10"), "node-b", true, "", t0);
  m2.evaluate(inputs(t0 + 5ms, {entry("proxy", s2)}));
  EXPECT_FALSE(m2.take_due_action(w2, t0 + 5ms, &deadline));
  ASSERT_TRUE(m2.verdict(w2));
  EXPECT_TRUE(m2.verdict(w2)->release);
  EXPECT_EQ(m2.counters().bad_actions, 1u);
  const Drain& d = m2.drains().count({ip("10.244.1.10"), "uid-web-1"}) ? m2.drain(ip("10.244.1.10"))
                                                                       : m2.finished().back();
  ASSERT_FALSE(d.notes.empty());
  EXPECT_NE(d.notes.back().find("annotation endpointd.io/drain-action: drain action "
                                "\"signal:BOGUS\": unknown signal \"BOGUS\""),
            std::string::npos)
      << d.notes.back();
}

}  // namespace
}  // namespace endpointd::drain
