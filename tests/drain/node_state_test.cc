// What a node keeps for drains across its agent's restarts (drain/node_state.h): the file's
// text, its bounds and bad input, and the restart it exists for — an agent restarted while
// another node's agent is out of the agents' Service still waits for that node.
#include "drain/node_state.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "drain/coordinator.h"
#include "tests/drain/fixture.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using testing::Ep;
using testing::ip;
using testing::make_snapshot;

struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("endpointd-node-state-" + std::to_string(::getpid()) + "-" +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& n) const { return (path / n).string(); }
};

WallClock::time_point at_ms(int64_t ms) {
  return WallClock::time_point(std::chrono::milliseconds(ms));
}

TEST(NodeState, RoundTripsItsText) {
  NodeState s;
  s.agents = {"node-a", "node-c"};
  s.members = {{"node-a", "192.168.77.2"}, {"node-x", ""}};
  s.dns_ttls = {{30, at_ms(1'700'000'000'000)}, {5, WallClock::time_point::max()}};
  std::string text = encode_node_state(s);
  EXPECT_EQ(text,
            "endpointd-drain-state 1\nagent node-a\nagent node-c\n"
            "member node-a 192.168.77.2\nmember node-x -\n"
            "dns-ttl 30 1700000000000\ndns-ttl 5 running\n");
  auto back = decode_node_state(text);
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(*back, s);
}

TEST(NodeState, BadInputNamesTheLine) {
  auto e = decode_node_state("endpointd-drain-state 1\nagent node-a\ndns-ttl x running\n");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("line 3"), std::string::npos) << e.error();
  EXPECT_FALSE(decode_node_state("something else\n").ok());
  EXPECT_FALSE(decode_node_state("").ok());
  EXPECT_FALSE(decode_node_state("endpointd-drain-state 1\nagent bad name\n").ok());
  EXPECT_FALSE(decode_node_state(std::string(kNodeStateMaxBytes + 1, 'a')).ok());
}

// A TTL lowered across a restart: the new process holds the one the last process served, one
// TTL from its start; expired holds are dropped.
TEST(NodeState, ATtlLoweredAcrossARestartIsHeldOneOldTtl) {
  NodeState s;
  s.dns_ttls = {{30, WallClock::time_point::max()}, {60, at_ms(1000)}};
  auto held = inherited_ttls(s, at_ms(5000));
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].ttl_s, 30u);
  EXPECT_EQ(held[0].until, at_ms(35000));

  TempDir dir;
  {
    NodeStateFile f(dir.file("state"), at_ms(0));
    ASSERT_TRUE(f.set_dns_ttl(30, at_ms(0)).ok());
  }
  // The next process (a helm upgrade set the TTL to 5) starts 2 s later.
  NodeStateFile g(dir.file("state"), at_ms(2000));
  EXPECT_TRUE(g.load_error().empty()) << g.load_error();
  ASSERT_EQ(g.loaded().dns_ttls.size(), 1u);
  EXPECT_EQ(g.loaded().dns_ttls[0].ttl_s, 30u);
  EXPECT_EQ(g.loaded().dns_ttls[0].until, at_ms(32000));
  ASSERT_TRUE(g.set_dns_ttl(5, at_ms(2000)).ok());
  // And a third process, 10 s later: the 30 s answers of the first are still held.
  NodeStateFile h(dir.file("state"), at_ms(12000));
  ASSERT_EQ(h.loaded().dns_ttls.size(), 2u);
  uint32_t longest = 0;
  for (const auto& t : h.loaded().dns_ttls) longest = std::max(longest, t.ttl_s);
  EXPECT_EQ(longest, 30u);
  // 40 s later only the running one's remains.
  NodeStateFile i(dir.file("state"), at_ms(52000));
  ASSERT_EQ(i.loaded().dns_ttls.size(), 1u);
  EXPECT_EQ(i.loaded().dns_ttls[0].ttl_s, 5u);
}

TEST(NodeState, AnUnreadableFileStartsEmptyAndSaysWhy) {
  TempDir dir;
  std::ofstream(dir.file("state")) << "not a state file\n";
  NodeStateFile f(dir.file("state"));
  EXPECT_NE(f.load_error().find("not an endpointd drain state file"), std::string::npos)
      << f.load_error();
  EXPECT_TRUE(f.loaded().agents.empty());
  // A missing file is no error: a node's first start.
  NodeStateFile g(dir.file("missing"));
  EXPECT_TRUE(g.load_error().empty());
  // A file that cannot be written: an error naming it, counted.
  NodeStateFile h((dir.path / "no-such-dir" / "state").string());
  EXPECT_FALSE(h.add_agents({"node-a"}).ok());
  EXPECT_EQ(h.write_errors(), 1u);
}

const model::ServiceKey kAgents{"kube-system", "endpointd"};

// `base` with node-c among the Nodes and the agents' Service over `agents` (node → address).
model::SnapshotPtr cluster(const model::SnapshotPtr& base,
                           const std::vector<std::pair<std::string, std::string>>& agents) {
  auto s = std::make_shared<model::Snapshot>(*base);
  auto c = std::make_shared<model::Node>();
  c->name = "node-c";
  c->addresses = {{"InternalIP", "192.168.77.4"}};
  s->nodes.push_back(c);
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = kAgents;
  st->service.headless = true;
  for (const auto& [node, address] : agents) {
    model::MergedEndpoint m;
    m.address = ip(address);
    m.conditions = {true, true, false};
    m.node_name = node;
    st->endpoints.push_back(m);
  }
  std::vector<model::ServiceStatePtr> all = {st};
  for (const auto& svc : base->services) all.push_back(svc);
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->key() < b->key(); });
  s->services = model::ServiceList(all);
  return s;
}

// Runs one agent process over `first` then (if set) `then`, with the node's state file in
// `dir`; returns its drains' JSON once the drain thread has taken the last snapshot.
std::string run_agent(const TempDir& dir, const std::optional<model::ServiceKey>& members_service,
                      const model::SnapshotPtr& first, const model::SnapshotPtr& then) {
  NodeStateFile state(dir.file("drain-state"));
  pipeline::AckBoard board;
  CoordinatorOptions o;
  o.machine.node_name = "node-a";
  o.machine.members_service = members_service;
  o.machine.peer_policy = PeerPolicy::kWait;
  o.peer_listen = "";
  o.peer_insecure = true;
  o.node_state = &state;
  Coordinator c(&board, nullptr, o);
  EXPECT_TRUE(c.start().ok());
  c.on_snapshot(first);
  if (then) {
    c.wait_snapshot([&](const model::Snapshot& s) { return s.generation >= first->generation; },
                    Clock::now() + 5s);
    c.on_snapshot(then);
  }
  const model::SnapshotPtr& last = then ? then : first;
  c.wait_snapshot([&](const model::Snapshot& s) { return s.generation >= last->generation; },
                  Clock::now() + 5s);
  // The drain thread takes a snapshot after it is published: what it did shows in the state
  // file (a first process) or the drains (a second), bounded.
  std::string json;
  for (int i = 0; i < 500; ++i) {
    json = c.drains_json();
    std::string text;
    if (std::ifstream f(dir.file("drain-state")); f)
      text.assign(std::istreambuf_iterator<char>(f), {});
    if (then ? json.find("10.244.1.10") != std::string::npos
             : text.find("member node-c") != std::string::npos)
      break;
    std::this_thread::sleep_for(10ms);
  }
  c.stop();
  return json;
}

// A Node deleted while its machine may still run, and this node's agent restarting after: the
// new process never listed node-c, but the last one waited for it, so it is held as deleted
// (unknown until its agent is silent past the bound) and a drain waits for it.
TEST(NodeState, ARestartAfterANodeWasDeletedStillWaitsForIt) {
  TempDir dir;
  const Ep web1{"10.244.1.10", "node-a", true, true, false, "web-1"};
  const Ep web1_terminating{"10.244.1.10", "node-a", false, true, true, "web-1"};
  auto with_c = [](model::SnapshotPtr base) {
    auto s = std::make_shared<model::Snapshot>(*base);
    auto c = std::make_shared<model::Node>();
    c->name = "node-c";
    c->addresses = {{"InternalIP", "192.168.77.4"}};
    s->nodes.push_back(c);
    return model::SnapshotPtr(s);
  };
  run_agent(dir, std::nullopt, with_c(make_snapshot(1, {web1}, {{"web-1", "10.244.1.10"}})),
            nullptr);
  // node-c's Node is deleted; node-a's agent restarts; web-1 terminates.
  std::string json =
      run_agent(dir, std::nullopt, make_snapshot(2, {web1}, {{"web-1", "10.244.1.10"}}),
                make_snapshot(3, {web1_terminating}, {{"web-1", "10.244.1.10", "node-a", true}}));
  EXPECT_NE(json.find("\"node-c\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"node-b\""), std::string::npos) << json;
  EXPECT_NE(json.find("stop-accepting"), std::string::npos) << json;
}

// The second failure: node-c's agent leaves the agents' Service (a rollout, a crash
// loop) and node-a's agent restarts meanwhile. The new process never saw node-c in the Service;
// without what the node kept it would not wait for node-c (whose kernel still routes by the
// rules its agent left) and released a pod "confirmed" in 0.07 s.
TEST(NodeState, ARestartWhileAnotherNodesAgentIsOutStillWaitsForIt) {
  TempDir dir;
  const Ep web1{"10.244.1.10", "node-a", true, true, false, "web-1"};
  const Ep web1_terminating{"10.244.1.10", "node-a", false, true, true, "web-1"};
  // The first process sees both agents.
  run_agent(dir, kAgents,
            cluster(make_snapshot(1, {web1}, {{"web-1", "10.244.1.10"}}),
                    {{"node-a", "192.168.77.2"}, {"node-c", "192.168.77.4"}}),
            nullptr);
  // The restarted one: node-c's agent is out of the Service; web-1 terminates.
  std::string json = run_agent(
      dir, kAgents,
      cluster(make_snapshot(2, {web1}, {{"web-1", "10.244.1.10"}}), {{"node-a", "192.168.77.2"}}),
      cluster(make_snapshot(3, {web1_terminating}, {{"web-1", "10.244.1.10", "node-a", true}}),
              {{"node-a", "192.168.77.2"}}));
  EXPECT_NE(json.find("10.244.1.10"), std::string::npos) << json;
  EXPECT_NE(json.find("\"node-c\""), std::string::npos) << json;
  EXPECT_NE(json.find("stop-accepting"), std::string::npos) << json;
  // node-b never ran an agent: not waited for.
  EXPECT_EQ(json.find("\"node-b\""), std::string::npos) << json;
}

}  // namespace
}  // namespace endpointd::drain
