// The drain-ordering tests on the namespace cluster: two node agents (proxy sink, drain
// coordinator, peers, prestop socket) fed from one manifest directory, pods' test servers,
// and a client sending new and keep-alive requests through the ClusterIP while pods are
// terminated the way the kubelet does it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/drain/scenario.h"
#include "tests/netns/cluster.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace fs = std::filesystem;

// The scenario with endpointd-drain-agent on both nodes; each agent writes its drains to a
// state file.
class DrainCluster : public Scenario {
 public:
  DrainCluster() : Scenario("drain-manifests", false) {
    fs::create_directories(manifest_dir());
    std::ofstream(manifest_dir() + "/nodes.yaml") << nodes_yaml();
    write();
  }
  std::string state_of(const std::string& node) const {
    return netns::scratch_dir() + "/drain-" + node + ".json";
  }

  void start_agent(const std::string& node, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {agent_path(),
                                     "--source-dir",
                                     manifest_dir(),
                                     "--node-name",
                                     node,
                                     "--cluster-cidr",
                                     "10.244.0.0/16",
                                     "--drain-socket",
                                     socket_of(node),
                                     "--state-out",
                                     state_of(node),
                                     "--peer-timeout-ms",
                                     "3000"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    agents_[node] = &cluster().node(node).spawn(argv, "agent-" + node + ".log");
  }
  netns::Process& agent(const std::string& node) { return *agents_.at(node); }

  static std::string agent_path() { return ENDPOINTD_DRAIN_AGENT_PATH; }

 private:
  static std::string nodes_yaml() {
    return R"(apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: node-a}
  spec: {podCIDR: 10.244.1.0/24}
  status: {addresses: [{type: InternalIP, address: 192.168.77.2}]}
- apiVersion: v1
  kind: Node
  metadata: {name: node-b}
  spec: {podCIDR: 10.244.2.0/24}
  status: {addresses: [{type: InternalIP, address: 192.168.77.3}]}
)";
  }
  std::map<std::string, netns::Process*> agents_;
};

// The kubelet's order: mark terminating in the API and the slice at once, preStop, SIGTERM
// only when preStop returned, the endpoint leaves when the process exited.
Termination terminate(DrainCluster& dc, const std::string& pod, netns::Server& server,
                      bool use_prestop) {
  Termination t;
  t.pod = pod;
  auto& ps = dc.pods().at(pod);
  ps.pod_deleting = true;
  ps.deleting = true;
  dc.write();
  if (use_prestop) {
    auto r = dc.cluster().pod(pod).exec(
        prestop_command(DrainCluster::agent_path(), dc.socket_of(ps.node), {"--timeout", "30s"}));
    t.prestop_exit = r.exit_code;
    t.prestop_output = r.output;
  } else {
    t.prestop_exit = 0;
  }
  t.prestop_returned_ms = now_unix_ms();
  kill_and_remove(dc, server, t);
  return t;
}

class DrainOrderTest : public RootNetnsTest {};

TEST_F(DrainOrderTest, RollingUpdateUnderLoadLosesNothingAndKeepsTheOrder) {
  DrainCluster dc;
  auto servers = start_servers(dc);
  dc.pods().at("web-1").release_after =
      "removed";  // keep-alive clients: the app closes them itself
  dc.pods().at("web-3").release_after = "drained";  // its keep-alive clients hold it to the end
  dc.write();
  dc.start_agent("node-a");
  dc.start_agent("node-b");
  ASSERT_TRUE(wait_routed(dc.cluster(), 3)) << dc.agent("node-a").log();

  auto u = run_rolling_update(
      dc, [&](const std::string& pod) { return terminate(dc, pod, servers.at(pod), true); });
  dc.agent("node-a").stop();
  dc.agent("node-b").stop();

  expect_no_failed_requests(u);
  for (const auto& t : u.done) {
    const auto& ps = dc.pods().at(t.pod);
    EXPECT_EQ(t.prestop_exit, 0) << t.prestop_output;
    auto tl = find_timeline(read_file(dc.state_of(ps.node)), ps.ip);
    ASSERT_TRUE(tl) << t.pod;
    expect_drain_order(t, ps, *tl);
    EXPECT_LE(std::max(tl->removed, tl->drained), t.prestop_returned_ms);
    // Released against the last confirmation, or the drain deadline.
    int64_t latency = release_latency_ms(t, *tl);
    std::cout << t.pod << ": stop-accepting→removed " << tl->removed - tl->stop_accepting
              << " ms, release " << latency << " ms after the last confirmation; " << tl->raw
              << "\n";
    // Not at a poll or a deadline (seconds); how fast is bench/results/drain.md's.
    EXPECT_LE(latency, 1000) << tl->raw;
    expect_no_accept_after_removal(t.pod, servers.at(t.pod), *tl);
  }
}

TEST_F(DrainOrderTest, APrestopThatReturnsAtOnceFailsRequests) {
  DrainCluster dc;
  auto servers = start_servers(dc);
  for (auto& [n, p] : dc.pods()) p.grace = 0;
  dc.start_agent("node-a");
  dc.start_agent("node-b");
  ASSERT_TRUE(wait_routed(dc.cluster(), 3));
  netns::LoadClient newconns(dc.cluster().client(), cluster_ip_load(2));
  std::this_thread::sleep_for(300ms);
  // The kubelet's SIGTERM races the endpoint's removal through the controller and every
  // node; with a preStop that returns at once it wins by the propagation delay (300 ms here).
  auto& ps = dc.pods().at("web-1");
  servers.at("web-1").process->signal(SIGTERM);
  std::this_thread::sleep_for(300ms);
  ps.pod_deleting = true;
  ps.deleting = true;
  dc.write();
  servers.at("web-1").process->wait_exit(5s);
  ps.in_slice = false;
  dc.write();
  std::this_thread::sleep_for(300ms);
  auto r = newconns.stop();
  std::cout << "without a prestop wait: " << r.failed << " failed of " << r.ok + r.failed
            << " requests\n";
  EXPECT_GT(r.failed, 0) << "the measure must be able to fail";
}

TEST_F(DrainOrderTest, PeerDownIsCountedByPolicyAndStrangersAreRefused) {
  DrainCluster dc;
  auto servers = start_servers(dc);
  dc.pods().at("web-1").release_after = "removed";
  dc.write();
  dc.start_agent("node-a", {"--peer-timeout-ms", "800"});  // node-b's agent never starts
  // A caller in the node's own namespace is not a pod.
  for (int i = 0; i < 50 && !fs::exists(dc.socket_of("node-a")); ++i)
    std::this_thread::sleep_for(50ms);
  auto stranger = dc.cluster().node("node-a").exec(
      prestop_command(DrainCluster::agent_path(), dc.socket_of("node-a"), {"--timeout", "5s"}));
  EXPECT_EQ(stranger.exit_code, 3) << stranger.output;
  EXPECT_NE(stranger.output.find("is not a pod on node node-a"), std::string::npos)
      << stranger.output;
  // A pod of another node is refused too.
  auto other = dc.cluster().pod("web-3").exec(
      prestop_command(DrainCluster::agent_path(), dc.socket_of("node-a"), {"--timeout", "5s"}));
  EXPECT_EQ(other.exit_code, 3) << other.output;

  auto t0 = std::chrono::steady_clock::now();
  auto t = terminate(dc, "web-1", servers.at("web-1"), true);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(t.prestop_exit, 0) << t.prestop_output;
  EXPECT_LT(took, 5s);
  dc.agent("node-a").stop();
  std::string state = read_file(dc.state_of("node-a"));
  EXPECT_NE(state.find("did not confirm"), std::string::npos) << state;
  EXPECT_NE(state.find("\"state\":\"failed\""), std::string::npos) << state;
}

}  // namespace
}  // namespace endpointd::drain
