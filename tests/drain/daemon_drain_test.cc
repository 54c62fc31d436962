// The drain-ordering scenario with the real daemon: `endpointd run --source-dir <copy of
// examples/cluster> --dataplane nftables --drain-socket …` in both node namespaces (what
// scripts/demo runs), pods' test servers, and a client sending new and keep-alive requests
// through the ClusterIP while a rolling update terminates web-1 (node-a) and web-3 (node-b) the
// way the kubelet does it: the API marks the pod deleted and its endpoint terminating, the
// preStop runs `endpointd prestop` inside the pod's namespace, SIGTERM follows only when it
// returned, and the endpoint leaves the slice when the process exited. The timelines come from
// each daemon's own /debug/state.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/drain/daemon_cluster.h"
#include "tests/drain/scenario.h"
#include "tests/netns/cluster.h"
#include "tests/support/test_certs.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace fs = std::filesystem;

// The kubelet's order: the API marks the pod deleted, and its endpoint turns terminating in
// the slice 300 ms later (the endpoint controller and its watch are not instant; without the
// delay the removal would be confirmed before the prestop client even started, and there would
// be nothing for it to wait for); preStop = `endpointd prestop` in the pod's namespace as soon
// as the pod is marked; SIGTERM only once it returned; the endpoint leaves the slice when the
// process exited.
Termination terminate(DaemonCluster& dc, const std::string& pod, netns::Server& server) {
  Termination t;
  t.pod = pod;
  auto& ps = dc.pods().at(pod);
  ps.pod_deleting = true;
  dc.write();
  t.marked_ms = now_unix_ms();
  std::thread slice([&] {
    std::this_thread::sleep_for(300ms);
    ps.deleting = true;
    dc.write();
  });
  auto r = dc.cluster().pod(pod).exec(
      prestop_command(DaemonCluster::bin(), dc.socket_of(ps.node), {"--timeout", "25s"}));
  t.prestop_returned_ms = now_unix_ms();
  slice.join();
  t.prestop_exit = r.exit_code;
  t.prestop_output = r.output;
  kill_and_remove(dc, server, t);
  return t;
}

class DaemonDrainTest : public RootNetnsTest {};

// The kubelet's order, not waited for: the pod marked deleted, its preStop (`endpointd prestop`
// in its namespace) started, its endpoint terminating in the slice 300 ms later. Returns the
// prestop's run.
std::future<netns::CommandResult> begin_termination(DaemonCluster& dc, const std::string& pod,
                                                    Termination& t,
                                                    const std::string& timeout = "25s") {
  auto& ps = dc.pods().at(pod);
  t.pod = pod;
  ps.pod_deleting = true;
  dc.write();
  t.marked_ms = now_unix_ms();
  auto prestop = std::async(std::launch::async, [&dc, pod, node = ps.node, timeout] {
    return dc.cluster().pod(pod).exec(
        prestop_command(DaemonCluster::bin(), dc.socket_of(node), {"--timeout", timeout}));
  });
  std::this_thread::sleep_for(300ms);
  ps.deleting = true;
  dc.write();
  return prestop;
}

// The agents' Service naming `nodes` (kube-system/endpointd-peers, one endpoint per agent).
void write_agents(DaemonCluster& dc,
                  const std::vector<std::pair<std::string, std::string>>& nodes) {
  std::string eps;
  for (const auto& [node, ip] : nodes)
    eps += "  - {addresses: [" + ip + "], nodeName: " + node + ", conditions: {ready: true}}\n";
  std::string text = R"(apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: endpointd-peers, namespace: kube-system}
  spec: {clusterIP: None, ports: [{name: drain-peer, port: 9465}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: endpointd-peers-1
    namespace: kube-system
    labels: {kubernetes.io/service-name: endpointd-peers}
  addressType: IPv4
  ports: [{name: drain-peer, port: 9465}]
  endpoints:
)" + eps;
  // Atomically, as the API would change it.
  std::string tmp = dc.manifest_dir() + "/.agents.yaml.tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, dc.manifest_dir() + "/agents.yaml");
}

TEST_F(DaemonDrainTest, RollingUpdateThroughEndpointdRunLosesNothingAndKeepsTheOrder) {
  DaemonCluster dc;
  auto servers = start_servers(dc);
  // web-1 takes the default: released after removal (the app closes its keep-alive connections
  // after SIGTERM). web-3 has a drain action, SIGTERM to its server through a pidfile: once it
  // is removed everywhere the prestop client sends it, the server closes its keep-alive
  // connections, and the release follows when conntrack shows none left.
  std::string pidfile = netns::scratch_dir() + "/web-3.pid";
  std::ofstream(pidfile) << servers.at("web-3").process->pid() << "\n";
  dc.pods().at("web-3").drain_action = "signal:TERM:" + pidfile;
  dc.write();
  ASSERT_EQ(dc.pki_error(), "");
  ASSERT_TRUE(dc.start_both());
  ASSERT_TRUE(wait_routed(dc.cluster(), 3)) << dc.daemon("node-a").log();

  auto u = run_rolling_update(
      dc, [&](const std::string& pod) { return terminate(dc, pod, servers.at(pod)); });
  std::map<std::string, std::string> state = {{"node-a", dc.debug_state("node-a")},
                                              {"node-b", dc.debug_state("node-b")}};

  expect_no_failed_requests(u);
  EXPECT_GT(u.fresh.ok, 100);
  EXPECT_GT(u.kept.ok, 100);
  for (const auto& t : u.done) {
    const auto& ps = dc.pods().at(t.pod);
    EXPECT_EQ(t.prestop_exit, 0) << t.prestop_output;
    auto tl = read_timeline(state.at(ps.node), ps.ip);
    ASSERT_TRUE(tl) << t.pod << " has no drain in " << ps.node
                    << "'s /debug/state: " << state.at(ps.node);
    expect_drain_order(t, ps, *tl);
    EXPECT_GT(tl->removed, 0) << tl->raw;
    EXPECT_GT(tl->released, 0) << tl->raw;
    EXPECT_LE(t.marked_ms - 100, tl->stop_accepting) << tl->raw;
    if (!ps.drain_action.empty()) {
      // removed → the drain action → drained (conntrack empty, not the deadline) → released.
      EXPECT_GT(tl->drain_action, 0) << tl->raw;
      EXPECT_LE(tl->removed, tl->drain_action) << tl->raw;
      EXPECT_LE(tl->drain_action, tl->drain_action_done) << tl->raw;
      EXPECT_LE(tl->drain_action, tl->drained) << tl->raw;
      EXPECT_FALSE(tl->drain_forced) << tl->raw;
      EXPECT_LE(tl->drained, tl->released) << tl->raw;
      EXPECT_NE(t.prestop_output.find("drain action signal:TERM"), std::string::npos)
          << t.prestop_output;
    } else {
      EXPECT_EQ(tl->drain_action, 0) << tl->raw;
      EXPECT_LE(tl->removed, tl->released) << tl->raw;
    }
    // The agent's release stamp and the prestop's return, both before SIGTERM.
    EXPECT_LE(tl->released, t.prestop_returned_ms) << tl->raw;
    // Released against the last confirmation it waited for (the drain deadline when the
    // keep-alive connections held the drain open until it).
    int64_t latency = release_latency_ms(t, *tl);
    std::cout << t.pod << " (" << ps.node << ", "
              << (ps.drain_action.empty() ? "release after removal" : "drain action")
              << "): termination→release " << t.prestop_returned_ms - t.marked_ms
              << " ms; stop-accepting→removed " << tl->removed - tl->stop_accepting
              << " ms; prestop returned " << latency << " ms after the last confirmation; "
              << tl->raw << "\n";
    EXPECT_GE(latency, 0) << tl->raw;
    // Released when the last confirmation came, not at a poll or a deadline (those are
    // seconds). How fast is bench/results/drain.md's; a loaded test machine took up to 0.8 s.
    EXPECT_LE(latency, 1000) << tl->raw;
    // Only ClusterIP clients (well-behaved): the agent watched new connections to the pod and
    // none came after its removal.
    EXPECT_NE(tl->raw.find("\"after_removal\":{\"total\":0,"), std::string::npos) << tl->raw;
    int accepts = expect_no_accept_after_removal(t.pod, servers.at(t.pod), *tl);
    EXPECT_GT(accepts, 0) << t.pod << " never served";
  }
  dc.daemon("node-a").stop();
  dc.daemon("node-b").stop();
}

// The chart's default membership (--drain-members-service): the agents' own Service names
// node-a and node-b; a third Node, node-z, has no agent. Drains ask only the Service's nodes, so
// none waits for node-z's peer deadline (3 s here), as it would with every Node as a member.
TEST_F(DaemonDrainTest, MembersFromTheAgentsServiceAskOnlyNodesWithAnAgent) {
  DaemonCluster dc;
  auto servers = start_servers(dc);
  write_agents(dc, {{"node-a", "192.168.77.2"}, {"node-b", "192.168.77.3"}});
  // A Node no agent runs on: not a member with the agents' Service.
  std::ofstream(dc.manifest_dir() + "/node-z.yaml") << R"(apiVersion: v1
kind: Node
metadata: {name: node-z}
status: {addresses: [{type: InternalIP, address: 192.168.77.250}]}
)";
  for (const char* n : {"node-a", "node-b"})
    dc.set_extra_args(n, {"--drain-members-service", "kube-system/endpointd-peers"});
  ASSERT_EQ(dc.pki_error(), "");
  ASSERT_TRUE(dc.start_both());
  ASSERT_TRUE(wait_routed(dc.cluster(), 3)) << dc.daemon("node-a").log();

  auto u = run_rolling_update(
      dc, [&](const std::string& pod) { return terminate(dc, pod, servers.at(pod)); });
  std::map<std::string, std::string> state = {{"node-a", dc.debug_state("node-a")},
                                              {"node-b", dc.debug_state("node-b")}};
  expect_no_failed_requests(u);
  ASSERT_FALSE(u.done.empty());
  for (const auto& [node, st] : state)
    EXPECT_NE(st.find(R"("agents_at":"service kube-system/endpointd-peers")"), std::string::npos)
        << node << ": " << st;
  for (const auto& t : u.done) {
    const auto& ps = dc.pods().at(t.pod);
    EXPECT_EQ(t.prestop_exit, 0) << t.prestop_output;
    auto tl = read_timeline(state.at(ps.node), ps.ip);
    ASSERT_TRUE(tl) << t.pod << " has no drain in " << ps.node << "'s /debug/state";
    expect_drain_order(t, ps, *tl);
    // The other agent was asked and confirmed; node-z was not asked at all.
    std::string other = ps.node == "node-a" ? "node-b" : "node-a";
    EXPECT_NE(tl->raw.find("\"" + other + "\""), std::string::npos) << tl->raw;
    EXPECT_EQ(tl->raw.find("node-z"), std::string::npos) << tl->raw;
    EXPECT_FALSE(tl->removal_forced) << tl->raw;
    EXPECT_LT(tl->removed - tl->stop_accepting, 2000) << tl->raw;
  }
  dc.daemon("node-a").stop();
  dc.daemon("node-b").stop();
}

// kill -9 of the agent on the pod's node while the drain waits for the pod's connections: the
// prestop client keeps retrying the socket, the restarted agent takes the drain up again from
// the API's state (the endpoint already terminating, the budget from the deletionTimestamp),
// releases it before the kubelet's deadline, and is a working peer for the next drain.
// Issue 32: node-b's agent leaves the agents' Service and stops (a DaemonSet rollout, a crash
// loop), its rules left in place, so node-b's kernel still routes by them. Under `wait` a drain
// on node-a is not released before node-b's agent is back and confirms; then it is released,
// confirmed. (Before, node-b stopped being a member 3 s after it left the Service and the
// drain was "confirmed by all peers".)
TEST_F(DaemonDrainTest, ANodeWhoseAgentStoppedIsWaitedForUnderWait) {
  DaemonCluster dc;
  auto servers = start_servers(dc);
  write_agents(dc, {{"node-a", "192.168.77.2"}, {"node-b", "192.168.77.3"}});
  for (const char* n : {"node-a", "node-b"})
    dc.set_extra_args(n, {"--drain-members-service", "kube-system/endpointd-peers",
                          "--drain-peer-policy", "wait"});
  ASSERT_EQ(dc.pki_error(), "");
  ASSERT_TRUE(dc.start_both());
  ASSERT_TRUE(wait_routed(dc.cluster(), 3)) << dc.daemon("node-a").log();

  // node-b's agent leaves the Service and stops; its table stays.
  write_agents(dc, {{"node-a", "192.168.77.2"}});
  dc.daemon("node-b").signal(SIGTERM);
  ASSERT_TRUE(dc.daemon("node-b").wait_exit(10s));
  ASSERT_TRUE(dc.cluster().node("node-b").exec({"nft", "list", "table", "ip", "endpointd"}).ok())
      << "the stopped agent's rules should stay in place";
  std::this_thread::sleep_for(4s);  // past the liveness deadline and the old 3 s grace

  auto& web1 = dc.pods().at("web-1");
  web1.grace = 30;  // budget 24 s: room for node-b's agent to come back
  Termination t;
  auto prestop = begin_termination(dc, "web-1", t, "40s");

  // Past the peer timeout (3 s): still waiting for node-b.
  EXPECT_EQ(prestop.wait_for(6s), std::future_status::timeout)
      << "released while node-b's kernel may route to web-1";
  auto before = read_timeline(dc.debug_state("node-a"), web1.ip);
  ASSERT_TRUE(before) << dc.debug_state("node-a");
  EXPECT_EQ(before->removed, 0) << before->raw;
  EXPECT_NE(before->raw.find("node-b"), std::string::npos) << before->raw;

  // node-b's agent comes back (and into the Service): it confirms, and web-1 is released.
  int64_t restarted_ms = now_unix_ms();
  dc.start_daemon("node-b", "-restarted");
  write_agents(dc, {{"node-a", "192.168.77.2"}, {"node-b", "192.168.77.3"}});
  ASSERT_TRUE(dc.wait_ready("node-b")) << dc.daemon("node-b").log();
  auto r = prestop.get();
  t.prestop_returned_ms = now_unix_ms();
  t.prestop_exit = r.exit_code;
  t.prestop_output = r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("confirmed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("unconfirmed"), std::string::npos) << r.output;
  auto tl = read_timeline(dc.debug_state("node-a"), web1.ip);
  ASSERT_TRUE(tl);
  EXPECT_GE(tl->removed, restarted_ms) << tl->raw;
  EXPECT_NE(tl->raw.find("\"outcome\":\"confirmed\""), std::string::npos) << tl->raw;
  kill_and_remove(dc, servers.at("web-1"), t);
}

// web-2 annotated release-after silent (grace 20 s), node-a's quiet time 500 ms; both agents
// started and routing to the three pods.
::testing::AssertionResult start_with_silent_web2(DaemonCluster& dc) {
  dc.pods().at("web-2").release_after = "silent";
  dc.pods().at("web-2").grace = 20;
  dc.write();
  dc.set_extra_args("node-a", {"--drain-quiet-ms", "500"});
  if (!dc.pki_error().empty()) return ::testing::AssertionFailure() << dc.pki_error();
  if (auto started = dc.start_both(); !started) return started;
  if (!wait_routed(dc.cluster(), 3))
    return ::testing::AssertionFailure() << "not routed: " << dc.daemon("node-a").log();
  return ::testing::AssertionSuccess();
}

// Observed removal (issue 47): a stale router — db-0's namespace on node-b opening a new
// connection every 20 ms straight to a pod's address, as an ingress controller with its own
// EndpointSlice watch or a load balancer with IP targets does — keeps sending after the removal.
// web-1 (the default: released after removal) is released unconfirmed, "late traffic", naming
// the router's address; web-2 (release-after silent) is held until the router stopped plus the
// quiet time, and every request the router sent meanwhile was served.
TEST_F(DaemonDrainTest, AStaleRouterIsNamedAndSilentWaitsForIt) {
  DaemonCluster dc;
  auto servers = start_servers(dc);
  ASSERT_TRUE(start_with_silent_web2(dc));
  auto router_to = [&](const std::string& ip) {
    netns::LoadOptions lo;
    lo.target = ip + ":8080";
    lo.interval_ms = 20;
    lo.duration_ms = 30000;
    lo.timeout_ms = 1000;
    return std::make_unique<netns::LoadClient>(dc.cluster().pod("db-0"), lo);
  };

  // The default policy: web-1 is removed, the router's connections after that are named, and
  // the prestop that comes then is answered "unconfirmed: … late traffic".
  auto& web1 = dc.pods().at("web-1");
  auto router = router_to(web1.ip);
  Termination t1;
  t1.pod = "web-1";
  web1.pod_deleting = true;
  dc.write();
  t1.marked_ms = now_unix_ms();
  std::this_thread::sleep_for(300ms);
  web1.deleting = true;
  dc.write();
  std::string state;
  for (int i = 0; i < 100; ++i) {
    state = dc.debug_state("node-a");
    auto tl = read_timeline(state, web1.ip);
    if (tl && tl->raw.find("\"consumer\":\"late traffic\"") != std::string::npos) break;
    std::this_thread::sleep_for(100ms);
  }
  auto tl1 = read_timeline(state, web1.ip);
  ASSERT_TRUE(tl1) << state;
  ASSERT_NE(tl1->raw.find("\"consumer\":\"late traffic\""), std::string::npos)
      << tl1->raw << "\n"
      << dc.daemon("node-a").log();
  auto r1 = dc.cluster().pod("web-1").exec(
      prestop_command(DaemonCluster::bin(), dc.socket_of("node-a"), {"--timeout", "25s"}));
  t1.prestop_returned_ms = now_unix_ms();
  router->stop();
  t1.prestop_exit = r1.exit_code;
  t1.prestop_output = r1.output;
  EXPECT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r1.output.find("unconfirmed: node-a/late traffic: new connections after the removal "
                           "from a pod of node node-b (10.244.2.20): "),
            std::string::npos)
      << r1.output;
  kill_and_remove(dc, servers.at("web-1"), t1);

  // Silent: web-2's prestop waits while the router sends, and returns the quiet time (500 ms)
  // after it stopped.
  auto& web2 = dc.pods().at("web-2");
  router = router_to(web2.ip);
  std::this_thread::sleep_for(300ms);
  Termination t2;
  auto prestop = begin_termination(dc, "web-2", t2);
  EXPECT_EQ(prestop.wait_for(3s), std::future_status::timeout)
      << "released while the router still sent";
  int64_t stopped_ms = now_unix_ms();
  auto sent = router->stop();
  auto r2 = prestop.get();
  t2.prestop_returned_ms = now_unix_ms();
  t2.prestop_exit = r2.exit_code;
  t2.prestop_output = r2.output;
  EXPECT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_NE(r2.output.find("late traffic"), std::string::npos) << r2.output;
  // Not before the quiet time after the router's last connection; soon after it (the late
  // connections are read every 100 ms).
  EXPECT_GE(t2.prestop_returned_ms, stopped_ms + 400) << r2.output;
  EXPECT_LE(t2.prestop_returned_ms, stopped_ms + 2500) << r2.output;
  auto tl2 = read_timeline(dc.debug_state("node-a"), web2.ip);
  ASSERT_TRUE(tl2);
  EXPECT_FALSE(tl2->drain_forced) << tl2->raw;
  EXPECT_NE(tl2->raw.find("\"release_after\":\"silent\""), std::string::npos) << tl2->raw;
  // The pod served while it was held: nothing the router sent failed.
  EXPECT_GT(sent.ok, 100);
  EXPECT_EQ(sent.failed, 0) << (sent.errors.empty() ? "" : sent.errors.begin()->first);
  std::cout << "silent: prestop returned " << t2.prestop_returned_ms - stopped_ms
            << " ms after the router stopped; router " << sent.ok << " ok, " << sent.failed
            << " failed\n";
  kill_and_remove(dc, servers.at("web-2"), t2);
  dc.daemon("node-a").stop();
  dc.daemon("node-b").stop();
}

// HAProxy as a stand-in load balancer with its own static server list (web-2 and web-3, as a
// cloud load balancer's IP targets) in the client's namespace, and a deregistration delay: web-2
// is disabled in it 2 s after web-2 terminates. web-2 (release-after silent) is released only
// after that plus the quiet time, unconfirmed naming the balancer's address, and not one
// request through HAProxy failed: the pod served while it was held.
TEST_F(DaemonDrainTest, ALoadBalancerWithADeregistrationDelayIsWaitedForUnderSilent) {
  DaemonCluster dc;
  auto servers = start_servers(dc);
  ASSERT_TRUE(start_with_silent_web2(dc));

  std::string dir = netns::scratch_dir() + "/stale-lb";
  fs::create_directories(dir);
  std::ofstream(dir + "/haproxy.cfg")
      << "global\n"
      << "  stats socket " << dir << "/admin.sock mode 600 level admin\n"
      << "defaults\n"
      << "  mode tcp\n"
      << "  timeout connect 2s\n"
      << "  timeout client 30s\n"
      << "  timeout server 30s\n"
      << "frontend fe\n"
      << "  bind 127.0.0.1:9000\n"
      << "  default_backend be\n"
      << "backend be\n"
      << "  balance roundrobin\n"
      << "  server web2 10.244.1.11:8080\n"
      << "  server web3 10.244.2.10:8080\n";
  auto& client = dc.cluster().client();
  auto& haproxy = client.spawn({"haproxy", "-db", "-f", dir + "/haproxy.cfg"}, "stale-lb.log");
  for (int i = 0; i < 100 && !fs::exists(dir + "/admin.sock"); ++i)
    std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(fs::exists(dir + "/admin.sock")) << haproxy.log();
  netns::LoadOptions lo;
  lo.target = "127.0.0.1:9000";
  lo.interval_ms = 10;
  lo.concurrency = 2;
  lo.duration_ms = 30000;
  lo.timeout_ms = 2000;
  netns::LoadClient through_lb(client, lo);
  std::this_thread::sleep_for(500ms);

  Termination t;
  auto prestop = begin_termination(dc, "web-2", t);
  // The deregistration delay: the balancer keeps web-2 for 2 s after its termination.
  EXPECT_EQ(prestop.wait_for(1700ms), std::future_status::timeout)
      << "released while the balancer still sent";
  int rc = 1;
  int64_t deregistering_ms = now_unix_ms();  // the balancer sends to web-2 until after this
  std::string said = client.sh(
      "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); "
      "s.connect('" +
          dir +
          "/admin.sock'); s.sendall(b'disable server be/web2\\n'); "
          "print(s.recv(200))\"",
      &rc);
  int64_t deregistered_ms = now_unix_ms();
  ASSERT_EQ(rc, 0) << said;
  auto r = prestop.get();
  t.prestop_returned_ms = now_unix_ms();
  t.prestop_exit = r.exit_code;
  t.prestop_output = r.output;
  std::this_thread::sleep_for(500ms);
  auto sent = through_lb.stop();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("late traffic"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(192.168.77.100)"), std::string::npos) << r.output;
  // Not before the quiet time (500 ms) after its last connection to web-2 (every ~10 ms until
  // the command took effect); soon after (read every 100 ms).
  EXPECT_GE(t.prestop_returned_ms, deregistering_ms + 450) << r.output;
  EXPECT_LE(t.prestop_returned_ms, deregistered_ms + 2500) << r.output;
  EXPECT_GT(sent.ok, 200);
  EXPECT_EQ(sent.failed, 0) << (sent.errors.empty() ? "" : sent.errors.begin()->first);
  EXPECT_GT(sent.by_backend["web-2"], 0) << "the balancer never sent to web-2";
  std::cout << "stale balancer: prestop returned " << t.prestop_returned_ms - deregistered_ms
            << " ms after web-2 was deregistered; " << sent.ok << " requests ok, " << sent.failed
            << " failed\n";
  kill_and_remove(dc, servers.at("web-2"), t);
  haproxy.signal(SIGTERM);
  dc.daemon("node-a").stop();
  dc.daemon("node-b").stop();
}

TEST_F(DaemonDrainTest, AgentKilledMidDrainFinishesTheDrainAfterRestart) {
  DaemonCluster dc;
  auto servers = start_servers(dc);
  ASSERT_EQ(dc.pki_error(), "");
  ASSERT_TRUE(dc.start_both());
  ASSERT_TRUE(wait_routed(dc.cluster(), 3)) << dc.daemon("node-a").log();

  auto& web1 = dc.pods().at("web-1");
  web1.release_after = "drained";  // so that the kill lands in stage 3
  dc.write();
  Timeline before_kill;
  int64_t killed_ms = 0, restarted_ms = 0, kubelet_deadline_ms = 0;
  int direct_ok = 0;
  auto kill_midway = [&](const std::string& pod) {
    if (pod != "web-1") return terminate(dc, pod, servers.at(pod));
    Termination t;
    t.pod = pod;
    // A keep-alive connection straight to the pod, so the drain surely waits in stage 3 (the
    // clients through the ClusterIP may hold none to web-1).
    netns::LoadOptions held;
    held.target = web1.ip + ":8080";
    held.keepalive = true;
    held.duration_ms = 60000;
    held.interval_ms = 50;
    netns::LoadClient direct(dc.cluster().client(), held);
    std::this_thread::sleep_for(200ms);
    t.marked_ms = now_unix_ms();
    // The API's deletionTimestamp: the deletion's time plus the grace period, which is when the
    // kubelet sends SIGKILL whatever the preStop is doing.
    kubelet_deadline_ms = t.marked_ms / 1000 * 1000 + web1.grace * 1000;
    web1.deletion_timestamp = rfc3339(kubelet_deadline_ms);
    web1.pod_deleting = true;
    dc.write();
    auto prestop = std::async(std::launch::async, [&] {
      return dc.cluster().pod(pod).exec(
          prestop_command(DaemonCluster::bin(), dc.socket_of("node-a"), {"--timeout", "25s"}));
    });
    std::this_thread::sleep_for(300ms);
    web1.deleting = true;
    dc.write();
    // Kill once removal is confirmed and the drain waits for the keep-alive connections.
    for (int i = 0; i < 100; ++i) {
      auto tl = read_timeline(dc.debug_state("node-a"), web1.ip);
      if (tl && tl->removed > 0 && tl->prestop_called > 0 && tl->drained == 0) {
        before_kill = *tl;
        break;
      }
      std::this_thread::sleep_for(50ms);
    }
    killed_ms = now_unix_ms();
    dc.daemon("node-a").signal(SIGKILL);
    dc.daemon("node-a").wait_exit(5s);
    std::this_thread::sleep_for(500ms);
    restarted_ms = now_unix_ms();
    dc.start_daemon("node-a", "-restarted");
    EXPECT_TRUE(dc.wait_ready("node-a")) << dc.daemon("node-a").log();
    auto r = prestop.get();
    t.prestop_returned_ms = now_unix_ms();
    t.prestop_exit = r.exit_code;
    t.prestop_output = r.output;
    direct_ok = direct.stop().ok;
    kill_and_remove(dc, servers.at(pod), t);
    return t;
  };
  auto u = run_rolling_update(dc, kill_midway);
  std::map<std::string, std::string> state = {{"node-a", dc.debug_state("node-a")},
                                              {"node-b", dc.debug_state("node-b")}};

  expect_no_failed_requests(u);
  EXPECT_GT(u.fresh.ok, 100);
  EXPECT_GT(u.kept.ok, 100);
  ASSERT_GT(before_kill.removed, 0) << "the drain never reached stage 3 before the kill";
  EXPECT_GT(direct_ok, 0) << "the keep-alive connection to web-1 never served";
  ASSERT_EQ(u.done.size(), 2u);

  const Termination& t1 = u.done[0];
  EXPECT_EQ(t1.prestop_exit, 0) << t1.prestop_output;
  auto tl = read_timeline(state.at("node-a"), web1.ip);
  ASSERT_TRUE(tl) << "the restarted agent has no drain of web-1: " << state.at("node-a");
  expect_drain_order(t1, web1, *tl);
  // The restarted agent's drain, not the killed one's.
  EXPECT_GE(tl->stop_accepting, restarted_ms) << tl->raw;
  EXPECT_GT(tl->drained, 0) << tl->raw;
  EXPECT_LE(tl->drained, tl->released) << tl->raw;
  EXPECT_LE(tl->released, t1.prestop_returned_ms) << tl->raw;
  // Its budget came from the API's deletionTimestamp, not a fresh grace period from the restart.
  EXPECT_NE(tl->raw.find("\"budget_from_api\":true"), std::string::npos) << tl->raw;
  EXPECT_LE(t1.prestop_returned_ms, kubelet_deadline_ms) << tl->raw;
  // Nothing reached the pod after the first agent confirmed its removal.
  int accepts = expect_no_accept_after_removal("web-1", servers.at("web-1"), before_kill);
  EXPECT_GT(accepts, 0);
  std::cout << "web-1: killed " << killed_ms - t1.marked_ms << " ms after termination, restarted "
            << restarted_ms - t1.marked_ms << " ms after; released "
            << t1.prestop_returned_ms - t1.marked_ms << " ms after termination ("
            << kubelet_deadline_ms - t1.prestop_returned_ms
            << " ms before the kubelet's deadline); " << tl->raw << "\n";

  // The restarted agent confirms the next drain as a peer.
  const Termination& t3 = u.done[1];
  const auto& web3 = dc.pods().at("web-3");
  EXPECT_EQ(t3.prestop_exit, 0) << t3.prestop_output;
  auto tl3 = read_timeline(state.at("node-b"), web3.ip);
  ASSERT_TRUE(tl3) << state.at("node-b");
  expect_drain_order(t3, web3, *tl3);
  EXPECT_GT(tl3->removed, 0) << tl3->raw;
  EXPECT_FALSE(tl3->removal_forced) << tl3->raw;
  EXPECT_NE(tl3->raw.find("{\"node\":\"node-a\",\"state\":\"confirmed\""), std::string::npos)
      << "the restarted node-a did not confirm web-3's removal: " << tl3->raw;
  dc.daemon("node-a").stop();
  dc.daemon("node-b").stop();
}

}  // namespace
}  // namespace endpointd::drain
