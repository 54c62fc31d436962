// The drain-ordering tests on the namespace cluster: two node agents (proxy sink, drain
// coordinator, peers, prestop socket) fed from one manifest directory, pods' test servers,
// and a client sending new and keep-alive requests through the ClusterIP while pods are
// terminated the way the kubelet does it.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/netns/cluster.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct PodState {
  std::string node;
  std::string ip;
  int n = 0;  // uid suffix
  bool deleting = false;
  bool in_slice = true;
  bool in_api = true;
  std::string release_after = {};
  int grace = 8;
};

class DrainCluster {
 public:
  DrainCluster() : cluster_(netns::ClusterSpec::demo()) {
    dir_ = netns::scratch_dir() + "/drain-manifests";
    fs::create_directories(dir_);
    pods_["web-1"] = {"node-a", "10.244.1.10", 11};
    pods_["web-2"] = {"node-a", "10.244.1.11", 12};
    pods_["web-3"] = {"node-b", "10.244.2.10", 13};
    std::ofstream(dir_ + "/nodes.yaml") << nodes_yaml();
    write();
  }
  netns::Cluster& cluster() { return cluster_; }
  std::map<std::string, PodState>& pods() { return pods_; }
  std::string socket_of(const std::string& node) const {
    return netns::scratch_dir() + "/drain-" + node + ".sock";
  }
  std::string state_of(const std::string& node) const {
    return netns::scratch_dir() + "/drain-" + node + ".json";
  }

  void write() {
    std::string web = R"(apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo, uid: 5f1c0a4e-0000-4000-8000-000000000001}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc12
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
)";
    std::string pods = "apiVersion: v1\nkind: List\nitems:\n";
    for (const auto& [name, p] : pods_) {
      std::string uid = "7a0e0000-0000-4000-8000-0000000000" + std::to_string(p.n);
      if (p.in_slice) {
        web += "- addresses: [" + p.ip +
               "]\n  conditions: {ready: " + (p.deleting ? "false" : "true") +
               ", serving: true, terminating: " + (p.deleting ? "true" : "false") +
               "}\n  nodeName: " + p.node +
               "\n  targetRef: {kind: Pod, namespace: demo, name: " + name + ", uid: " + uid +
               "}\n";
      }
      if (p.in_api) {
        pods += "- apiVersion: v1\n  kind: Pod\n  metadata: {name: " + name +
                ", namespace: demo, uid: " + uid +
                (p.deleting ? ", deletionTimestamp: \"2030-01-01T00:00:00Z\"" : "") +
                (p.release_after.empty()
                     ? ""
                     : ", annotations: {endpointd.io/release-after: " + p.release_after + "}") +
                "}\n  spec: {nodeName: " + p.node +
                ", terminationGracePeriodSeconds: " + std::to_string(p.grace) +
                "}\n  status: {phase: Running, podIP: " + p.ip + ", podIPs: [{ip: " + p.ip +
                "}]}\n";
      }
    }
    if (web.back() == '\n' && web.find("- addresses") == std::string::npos) web += "  []\n";
    replace("web.yaml", web);
    replace("pods.yaml", pods);
  }

  void start_agent(const std::string& node, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {agent_path(),
                                     "--source-dir",
                                     dir_,
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
    agents_[node] = &cluster_.node(node).spawn(argv, "agent-" + node + ".log");
  }
  netns::Process& agent(const std::string& node) { return *agents_.at(node); }

  static std::string agent_path() { return ENDPOINTD_DRAIN_AGENT_PATH; }

 private:
  void replace(const std::string& name, const std::string& text) {
    std::string tmp = dir_ + "/." + name + ".tmp";
    std::ofstream(tmp) << text;
    fs::rename(tmp, dir_ + "/" + name);
  }
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
  netns::Cluster cluster_;
  std::string dir_;
  std::map<std::string, PodState> pods_;
  std::map<std::string, netns::Process*> agents_;
};

// One drain's timeline as the agent wrote it (wall-clock ms).
struct Timeline {
  int64_t stop_accepting = 0, removed = 0, drained = 0, released = 0, last_confirmation = 0;
  bool removal_forced = false;
  std::string raw;
};

std::optional<Timeline> read_timeline(const std::string& path, const std::string& ip) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string j = ss.str();
  auto at = j.find("\"address\":\"" + ip + "\"");
  if (at == std::string::npos) return std::nullopt;
  auto end = j.find("\"address\":", at + 10);
  std::string d = j.substr(at, end == std::string::npos ? std::string::npos : end - at);
  Timeline t;
  t.raw = d;
  auto field = [&](const std::string& k) -> int64_t {
    auto u = d.find("\"timeline_unix_ms\":{");
    if (u == std::string::npos) return 0;
    std::smatch m;
    std::string sub = d.substr(u, d.find('}', u) - u);
    if (std::regex_search(sub, m, std::regex("\"" + k + "\":(\\d+)"))) return std::stoll(m[1]);
    return 0;
  };
  t.stop_accepting = field("stop_accepting");
  t.removed = field("removed");
  t.drained = field("drained");
  t.released = field("released");
  t.last_confirmation = field("last_confirmation");
  t.removal_forced = d.find("\"removal_forced\":true") != std::string::npos;
  return t;
}

struct Termination {
  std::string pod;
  int prestop_exit = -1;
  std::string prestop_output;
  int64_t prestop_returned_ms = 0;
  int64_t exited_ms = 0;
};

// The kubelet's order: mark terminating in the API (the slice follows), preStop, SIGTERM only
// when preStop returned, the endpoint leaves when the process exited.
Termination terminate(DrainCluster& dc, const std::string& pod, netns::Server& server,
                      bool use_prestop) {
  Termination t;
  t.pod = pod;
  auto& ps = dc.pods().at(pod);
  ps.deleting = true;
  dc.write();
  if (use_prestop) {
    auto r = dc.cluster().pod(pod).exec({DrainCluster::agent_path(), "prestop", "--drain-socket",
                                         dc.socket_of(ps.node), "--timeout", "30s"});
    t.prestop_exit = r.exit_code;
    t.prestop_output = r.output;
  } else {
    t.prestop_exit = 0;
  }
  t.prestop_returned_ms = now_unix_ms();
  server.process->signal(SIGTERM);
  server.process->wait_exit(20s);
  t.exited_ms = now_unix_ms();
  ps.in_slice = false;
  ps.in_api = false;
  dc.write();
  return t;
}

bool wait_routed(netns::Cluster& c, int want_backends) {
  for (int i = 0; i < 100; ++i) {
    netns::LoadOptions lo;
    lo.target = "10.96.0.10:80";
    lo.count = 30;
    lo.interval_ms = 0;
    lo.timeout_ms = 300;
    netns::LoadClient probe(c.client(), lo);
    auto r = probe.wait(5s);
    if (r.failed == 0 && static_cast<int>(r.by_backend.size()) >= want_backends) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

class DrainOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!netns::running_as_root()) GTEST_SKIP() << "needs root for namespaces and nftables";
    netns::sweep_stale_namespaces();
  }
};

std::map<std::string, netns::Server> start_servers(DrainCluster& dc) {
  std::map<std::string, netns::Server> out;
  for (const char* p : {"web-1", "web-2", "web-3"}) {
    netns::ServerOptions so;
    so.name = p;
    so.grace_ms = 2000;
    out[p] = netns::start_server(dc.cluster().pod(p), so);
  }
  return out;
}

TEST_F(DrainOrderTest, RollingUpdateUnderLoadLosesNothingAndKeepsTheOrder) {
  DrainCluster dc;
  auto servers = start_servers(dc);
  dc.pods().at("web-1").release_after =
      "removed";  // keep-alive clients: the app closes them itself
  dc.write();
  dc.start_agent("node-a");
  dc.start_agent("node-b");
  ASSERT_TRUE(wait_routed(dc.cluster(), 3)) << dc.agent("node-a").log();

  netns::LoadOptions fresh;
  fresh.target = "10.96.0.10:80";
  fresh.concurrency = 4;
  fresh.duration_ms = 60000;
  fresh.interval_ms = 5;
  netns::LoadClient newconns(dc.cluster().client(), fresh);
  netns::LoadOptions kept = fresh;
  kept.keepalive = true;
  netns::LoadClient keepalive(dc.cluster().client(), kept);
  std::this_thread::sleep_for(500ms);

  std::vector<Termination> done;
  done.push_back(terminate(dc, "web-1", servers.at("web-1"), true));
  std::this_thread::sleep_for(300ms);
  done.push_back(terminate(dc, "web-3", servers.at("web-3"), true));
  std::this_thread::sleep_for(500ms);
  auto r1 = newconns.stop();
  auto r2 = keepalive.stop();
  dc.agent("node-a").stop();
  dc.agent("node-b").stop();

  std::string errs;
  for (const auto& [e, n] : r1.errors) errs += e + " x" + std::to_string(n) + "; ";
  for (const auto& [e, n] : r2.errors) errs += e + " x" + std::to_string(n) + "; ";
  EXPECT_EQ(r1.failed, 0) << errs;
  EXPECT_EQ(r2.failed, 0) << errs;
  std::cout << "new-connection requests: " << r1.ok << " ok, " << r1.failed
            << " failed; keep-alive: " << r2.ok << " ok, " << r2.failed << " failed\n";
  for (const auto& t : done) {
    const auto& ps = dc.pods().at(t.pod);
    EXPECT_EQ(t.prestop_exit, 0) << t.prestop_output;
    auto tl = read_timeline(dc.state_of(ps.node), ps.ip);
    ASSERT_TRUE(tl) << t.pod;
    EXPECT_FALSE(tl->removal_forced) << tl->raw;
    EXPECT_GT(tl->stop_accepting, 0);
    EXPECT_LE(tl->stop_accepting, tl->removed);
    if (ps.release_after != "removed") {
      EXPECT_LE(tl->removed, tl->drained) << tl->raw;
    }
    EXPECT_LE(std::max(tl->removed, tl->drained), t.prestop_returned_ms);
    EXPECT_LE(t.prestop_returned_ms, t.exited_ms);
    // A drain that ended at its deadline (keep-alive clients never close by themselves) is
    // released against that deadline; otherwise against the last confirmation.
    int64_t last = tl->raw.find("\"drain_forced\":true") != std::string::npos
                       ? tl->drained
                       : tl->last_confirmation;
    int64_t latency = t.prestop_returned_ms - last;
    std::cout << t.pod << ": stop-accepting→removed " << tl->removed - tl->stop_accepting
              << " ms, release " << latency << " ms after the last confirmation; " << tl->raw
              << "\n";
    EXPECT_LE(latency, 100) << tl->raw;
    // No connection accepted by the pod after its removal was confirmed on every node.
    for (const auto& ev : netns::read_server_events(servers.at(t.pod).events_path)) {
      if (ev.kind == "accept") {
        EXPECT_LE(ev.time_ns / 1000000, tl->removed) << t.pod << " accepted " << ev.peer;
      }
    }
  }
}

TEST_F(DrainOrderTest, APrestopThatReturnsAtOnceFailsRequests) {
  DrainCluster dc;
  auto servers = start_servers(dc);
  for (auto& [n, p] : dc.pods()) p.grace = 0;
  dc.start_agent("node-a");
  dc.start_agent("node-b");
  ASSERT_TRUE(wait_routed(dc.cluster(), 3));
  netns::LoadOptions fresh;
  fresh.target = "10.96.0.10:80";
  fresh.concurrency = 4;
  fresh.duration_ms = 60000;
  fresh.interval_ms = 2;
  netns::LoadClient newconns(dc.cluster().client(), fresh);
  std::this_thread::sleep_for(300ms);
  // The kubelet's SIGTERM races the endpoint's removal through the controller and every
  // node; with a preStop that returns at once it wins by the propagation delay (300 ms here).
  auto& ps = dc.pods().at("web-1");
  servers.at("web-1").process->signal(SIGTERM);
  std::this_thread::sleep_for(300ms);
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
  auto stranger =
      dc.cluster().node("node-a").exec({DrainCluster::agent_path(), "prestop", "--drain-socket",
                                        dc.socket_of("node-a"), "--timeout", "5s"});
  EXPECT_EQ(stranger.exit_code, 3) << stranger.output;
  EXPECT_NE(stranger.output.find("is not a pod on node node-a"), std::string::npos)
      << stranger.output;
  // A pod of another node is refused too.
  auto other =
      dc.cluster().pod("web-3").exec({DrainCluster::agent_path(), "prestop", "--drain-socket",
                                      dc.socket_of("node-a"), "--timeout", "5s"});
  EXPECT_EQ(other.exit_code, 3) << other.output;

  auto t0 = std::chrono::steady_clock::now();
  auto t = terminate(dc, "web-1", servers.at("web-1"), true);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(t.prestop_exit, 0) << t.prestop_output;
  EXPECT_LT(took, 5s);
  dc.agent("node-a").stop();
  std::ifstream f(dc.state_of("node-a"));
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("did not confirm"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("\"state\":\"failed\""), std::string::npos) << ss.str();
}

}  // namespace
}  // namespace endpointd::drain
