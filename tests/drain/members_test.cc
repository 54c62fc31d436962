// Who confirms a removal (drain/members.h): every Node at its InternalIP, or the nodes of the
// agents' own Service's endpoints whatever their conditions; and the peers a drain then asks.
#include "drain/members.h"

#include <set>

#include <gtest/gtest.h>

#include <algorithm>

#include "drain/machine.h"
#include "tests/drain/fixture.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using testing::Ep;
using testing::ip;
using testing::make_snapshot;

const model::ServiceKey kAgents{"kube-system", "endpointd"};

// `base` with the agents' Service added: one endpoint per (address, node, conditions).
model::SnapshotPtr with_agents(const model::SnapshotPtr& base, const std::vector<Ep>& eps) {
  auto s = std::make_shared<model::Snapshot>(*base);
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = kAgents;
  st->service.headless = true;
  for (const auto& e : eps) {
    model::MergedEndpoint m;
    m.address = ip(e.ip);
    m.conditions = {e.ready, e.serving, e.terminating};
    m.node_name = e.node;
    st->endpoints.push_back(m);
  }
  std::sort(st->endpoints.begin(), st->endpoints.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  std::vector<model::ServiceStatePtr> all = {st};
  for (const auto& svc : base->services) all.push_back(svc);
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->key() < b->key(); });
  s->services = model::ServiceList(all);
  return s;
}

TEST(MembersTest, FromTheNodeListEveryNodeAtItsFirstInternalIp) {
  auto base = make_snapshot(1, {});
  auto s = std::make_shared<model::Snapshot>(*base);
  auto bare = std::make_shared<model::Node>();
  bare->name = "node-c";  // no InternalIP: a member that cannot be reached
  bare->addresses = {{"Hostname", "node-c"}};
  s->nodes.push_back(bare);
  Members m = members_of(*s, std::nullopt);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m.at("node-a"), ip("192.168.77.2"));
  EXPECT_EQ(m.at("node-b"), ip("192.168.77.3"));
  EXPECT_FALSE(m.at("node-c").has_value());
}

TEST(MembersTest, FromTheAgentsServiceEveryEndpointsNodeWhateverItsConditions) {
  auto s = with_agents(make_snapshot(1, {}),
                       {
                           {"192.168.77.3", "node-b", true, true, false},
                           // Starting (not ready yet) and shutting down: still nodes with rules.
                           {"192.168.77.9", "node-c", false, false, false},
                           {"192.168.77.10", "node-d", false, true, true},
                           // Dual stack: the IPv4 address; two of one family: the lowest.
                           {"fd00::20", "node-e", true, true, false},
                           {"192.168.77.21", "node-e", true, true, false},
                           {"192.168.77.31", "node-f", true, true, false},
                           {"192.168.77.30", "node-f", true, true, false},
                           // No node: nobody to ask.
                           {"192.168.77.40", "", true, true, false},
                       });
  // The nodes this agent has seen in the Service: node-a never was.
  const std::set<std::string> seen = {"node-b", "node-c", "node-d", "node-e", "node-f"};
  Members m = members_of(*s, kAgents, &seen);
  ASSERT_EQ(m.size(), 5u);
  // node-a is in the Node list but never had an agent endpoint: not a member.
  EXPECT_FALSE(m.count("node-a"));
  EXPECT_EQ(m.at("node-b"), ip("192.168.77.3"));
  EXPECT_EQ(m.at("node-c"), ip("192.168.77.9"));
  EXPECT_EQ(m.at("node-d"), ip("192.168.77.10"));
  EXPECT_EQ(m.at("node-e"), ip("192.168.77.21"));
  EXPECT_EQ(m.at("node-f"), ip("192.168.77.30"));
  // A Service that is not there (yet) and no agent ever seen: no members.
  const std::set<std::string> none;
  EXPECT_TRUE(members_of(*s, model::ServiceKey{"kube-system", "other"}, &none).empty());
  // An agent that left the Service stays a member while its Node is listed (its kernel keeps
  // the rules it left), at its InternalIP.
  auto left = with_agents(make_snapshot(1, {}), {{"192.168.77.3", "node-b", true, true, false}});
  const std::set<std::string> had = {"node-a", "node-b"};
  Members m2 = members_of(*left, kAgents, &had);
  ASSERT_EQ(m2.size(), 2u);
  EXPECT_EQ(m2.at("node-a"), ip("192.168.77.2"));
}

// A new agent that never saw node-a in the Service (node-a's agent was out when it started)
// learns from the cluster's decision that excludes node-a that it ran one: a member again.
TEST(MembersTest, ANodeTheClustersDecisionExcludesRanAnAgent) {
  auto s = with_agents(make_snapshot(1, {}), {{"192.168.77.3", "node-b", true, true, false}});
  std::set<std::string> seen = {"node-b"};
  EXPECT_FALSE(members_of(*s, kAgents, &seen).count("node-a"));
  EXPECT_TRUE(learn_agents(seen, {"node-a"}));
  EXPECT_FALSE(learn_agents(seen, {"node-a"})) << "nothing new the second time";
  Members m = members_of(*s, kAgents, &seen);
  ASSERT_TRUE(m.count("node-a"));
  EXPECT_EQ(m.at("node-a"), ip("192.168.77.2"));
}

// A drain waits for every member the coordinator names (the Node list less the nodes that never
// ran an agent), at the address it names.
TEST(MembersTest, ADrainWaitsForTheMembersTheCoordinatorNames) {
  Options o;
  o.node_name = "node-a";
  o.members_service = kAgents;
  Machine m(o);
  m.set_members({{"node-a", ip("192.168.77.2")},
                 {"node-c", ip("192.168.77.4")},
                 {"node-d", ip("192.168.77.5")}});
  const Ep web1{"10.244.1.10", "node-a", true, true, false, "web-1"};
  const Ep web1_terminating{"10.244.1.10", "node-a", false, true, true, "web-1"};
  const std::vector<Ep> agents = {{"192.168.77.2", "node-a"}, {"192.168.77.4", "node-c"}};
  TimePoint t0(std::chrono::seconds(1000));
  m.on_snapshot(with_agents(make_snapshot(1, {web1}, {{"web-1", "10.244.1.10"}}), agents), t0);
  auto started = m.on_snapshot(
      with_agents(make_snapshot(2, {web1_terminating}, {{"web-1", "10.244.1.10", "node-a", true}}),
                  agents),
      t0 + 10ms);
  ASSERT_EQ(started.size(), 1u);
  const Drain& d = m.drain(ip("10.244.1.10"));
  // node-b is a Node that never ran an agent; node-a is this agent; node-d left the Service.
  ASSERT_EQ(d.peers.size(), 2u);
  EXPECT_EQ(d.peers.at("node-c").address, "192.168.77.4");
  EXPECT_EQ(d.peers.at("node-d").address, "192.168.77.5");
  EXPECT_EQ(d.peers.at("node-c").state, PeerState::State::kPending);
}

// A Node deleted while its machine keeps running (`kubectl delete node` on a live node, a cloud
// controller deleting a Node whose instance was briefly missing): its kernel still routes by
// the rules its agent left, so it stays a member — unknown — until its agent has been excluded
// for silence past the bound; one whose agent keeps reporting stays as long as it does.
TEST(DeletedNodesTest, ADeletedNodeIsHeldUntilItsAgentIsSilentPastTheBound) {
  using TP = DeletedNodes::TimePoint;
  TP t0(std::chrono::seconds(100));
  DeletedNodes d(30s);
  Members all = {{"node-a", ip("192.168.77.2")}, {"node-c", ip("192.168.77.4")}};
  Members without_c = {{"node-a", ip("192.168.77.2")}};
  d.observe(all, t0);
  EXPECT_FALSE(d.take_changed());
  d.observe(without_c, t0 + 1s);
  EXPECT_TRUE(d.take_changed());
  Members held = d.with_held(without_c);
  ASSERT_EQ(held.count("node-c"), 1u);
  EXPECT_EQ(held.at("node-c"), ip("192.168.77.4"));
  // Its agent still reports (not excluded): held, whatever the time.
  d.excluded({}, t0 + 10min);
  EXPECT_EQ(d.with_held(without_c).count("node-c"), 1u);
  EXPECT_FALSE(d.next_expiry());
  // Excluded for silence: held the bound from then, and it says when it may go.
  d.excluded({"node-c"}, t0 + 11min);
  ASSERT_TRUE(d.next_expiry());
  EXPECT_EQ(*d.next_expiry(), t0 + 11min + 30s);
  d.excluded({"node-c"}, t0 + 11min + 29s);
  EXPECT_EQ(d.held(), std::vector<std::string>{"node-c"});
  // Heard from again (included), then silent again: the bound starts over.
  d.excluded({}, t0 + 11min + 29s);
  d.excluded({"node-c"}, t0 + 12min);
  d.excluded({"node-c"}, t0 + 12min + 29s);
  EXPECT_EQ(d.held().size(), 1u);
  d.excluded({"node-c"}, t0 + 12min + 30s);
  EXPECT_TRUE(d.held().empty());
  EXPECT_TRUE(d.take_changed());
  EXPECT_EQ(d.with_held(without_c).count("node-c"), 0u);
}

// Bad input: a Node created again under the old name (a new UID, a kubelet re-registering): a
// member by the Node list again, not held twice; without a cluster watermark to say who is
// silent, a held node goes the bound after its deletion.
TEST(DeletedNodesTest, ANodeCreatedAgainIsAMemberByTheListAndUnobservedOnesExpire) {
  using TP = DeletedNodes::TimePoint;
  TP t0(std::chrono::seconds(100));
  DeletedNodes d(30s);
  Members all = {{"node-a", ip("192.168.77.2")}, {"node-c", ip("192.168.77.4")}};
  Members without_c = {{"node-a", ip("192.168.77.2")}};
  d.observe(all, t0);
  d.observe(without_c, t0 + 1s);
  Members again = {{"node-a", ip("192.168.77.2")}, {"node-c", ip("192.168.77.9")}};
  d.observe(again, t0 + 2s);
  EXPECT_TRUE(d.held().empty());
  EXPECT_EQ(d.with_held(again).at("node-c"), ip("192.168.77.9"));
  d.observe(without_c, t0 + 3s);
  d.expire_unobserved(t0 + 32s);
  EXPECT_EQ(d.held().size(), 1u);
  d.expire_unobserved(t0 + 33s);
  EXPECT_TRUE(d.held().empty());
}

// The machine waits for a held node like any member: a drain started after node-c's Node was
// deleted still has node-c among its peers.
TEST(DeletedNodesTest, ADrainWaitsForAHeldNode) {
  Options o;
  o.node_name = "node-a";
  Machine m(o);
  DeletedNodes d(30s);
  TimePoint t0(std::chrono::seconds(1000));
  d.observe({{"node-a", ip("192.168.77.2")}, {"node-c", ip("192.168.77.4")}}, t0);
  d.observe({{"node-a", ip("192.168.77.2")}}, t0 + 1ms);
  m.set_members(d.with_held({{"node-a", ip("192.168.77.2")}}));
  const Ep web1{"10.244.1.10", "node-a", true, true, false, "web-1"};
  const Ep web1_terminating{"10.244.1.10", "node-a", false, true, true, "web-1"};
  m.on_snapshot(make_snapshot(1, {web1}, {{"web-1", "10.244.1.10"}}), t0);
  m.on_snapshot(make_snapshot(2, {web1_terminating}, {{"web-1", "10.244.1.10", "node-a", true}}),
                t0 + 10ms);
  const Drain& dr = m.drain(ip("10.244.1.10"));
  ASSERT_EQ(dr.peers.count("node-c"), 1u);
  EXPECT_EQ(dr.peers.at("node-c").address, "192.168.77.4");
}

}  // namespace
}  // namespace endpointd::drain
