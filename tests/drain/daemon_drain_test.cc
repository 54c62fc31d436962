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
#include <iostream>
#include <map>
#include <optional>
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

const std::string kAdmin = "http://127.0.0.1:10256";

struct PodState {
  std::string node, ip, uid;
  bool pod_deleting = false;  // deletionTimestamp in the API
  bool deleting = false;      // the endpoint terminating in the slice
  bool in_slice = true, in_api = true;
  std::string release_after = {};
  int grace = 8;
};

// The manifest directory: a copy of examples/cluster whose web.yaml and pods.yaml the test
// rewrites (atomically, by rename) as the API would change.
class DaemonCluster {
 public:
  DaemonCluster() : cluster_(netns::ClusterSpec::demo()) {
    dir_ = netns::scratch_dir() + "/daemon-drain-manifests";
    fs::remove_all(dir_);
    fs::copy(std::string(ENDPOINTD_SOURCE_ROOT) + "/examples/cluster", dir_,
             fs::copy_options::recursive);
    pods_["web-1"] = {"node-a", "10.244.1.10", "7a0e0000-0000-4000-8000-000000000011"};
    pods_["web-2"] = {"node-a", "10.244.1.11", "7a0e0000-0000-4000-8000-000000000012"};
    pods_["web-3"] = {"node-b", "10.244.2.10", "7a0e0000-0000-4000-8000-000000000013"};
    write();
  }
  ~DaemonCluster() {
    for (auto& [n, p] : daemons_) p->stop();
  }
  netns::Cluster& cluster() { return cluster_; }
  std::map<std::string, PodState>& pods() { return pods_; }
  std::string socket_of(const std::string& node) const {
    return netns::scratch_dir() + "/drain-" + node + ".sock";
  }

  void write() {
    std::string web = R"(apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo, uid: 5f1c0a4e-0000-4000-8000-000000000001}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  selector: {app: web}
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
    bool any = false;
    for (const auto& [name, p] : pods_) {
      if (p.in_slice) {
        any = true;
        web += "- addresses: [" + p.ip +
               "]\n  conditions: {ready: " + (p.deleting ? "false" : "true") +
               ", serving: true, terminating: " + (p.deleting ? "true" : "false") +
               "}\n  nodeName: " + p.node +
               "\n  targetRef: {kind: Pod, namespace: demo, name: " + name + ", uid: " + p.uid +
               "}\n";
      }
      if (p.in_api) {
        pods += "- apiVersion: v1\n  kind: Pod\n  metadata: {name: " + name +
                ", namespace: demo, uid: " + p.uid + ", labels: {app: web}" +
                (p.pod_deleting ? ", deletionTimestamp: \"2030-01-01T00:00:00Z\"" : "") +
                (p.release_after.empty()
                     ? ""
                     : ", annotations: {endpointd.io/release-after: " + p.release_after + "}") +
                "}\n  spec: {nodeName: " + p.node +
                ", terminationGracePeriodSeconds: " + std::to_string(p.grace) +
                "}\n  status: {phase: Running, podIP: " + p.ip + ", podIPs: [{ip: " + p.ip +
                "}]}\n";
      }
    }
    if (!any) web += "  []\n";
    replace("web.yaml", web);
    replace("pods.yaml", pods);
  }

  // The daemon exactly as scripts/demo starts it (no DNS here).
  void start_daemon(const std::string& node) {
    std::vector<std::string> argv = {bin(),
                                     "run",
                                     "--source-dir",
                                     dir_,
                                     "--dataplane",
                                     "nftables",
                                     "--node-name",
                                     node,
                                     "--cluster-cidr",
                                     "10.244.0.0/16",
                                     "--admin-listen",
                                     "127.0.0.1:10256",
                                     "--drain-socket",
                                     socket_of(node),
                                     "--drain-peer-timeout-ms",
                                     "3000"};
    daemons_[node] = &cluster_.node(node).spawn(argv, "endpointd-" + node + ".log");
  }
  netns::Process& daemon(const std::string& node) { return *daemons_.at(node); }
  bool wait_ready(const std::string& node) {
    for (int i = 0; i < 200; ++i) {
      if (cluster_.node(node).exec({"curl", "-fs", "--max-time", "1", kAdmin + "/readyz"}).ok())
        return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  std::string debug_state(const std::string& node) {
    return cluster_.node(node)
        .exec({"curl", "-fs", "--max-time", "2", kAdmin + "/debug/state"})
        .output;
  }

  static std::string bin() { return ENDPOINTD_BIN_PATH; }

 private:
  void replace(const std::string& name, const std::string& text) {
    std::string tmp = dir_ + "/." + name + ".tmp";
    std::ofstream(tmp) << text;
    fs::rename(tmp, dir_ + "/" + name);
  }
  netns::Cluster cluster_;
  std::string dir_;
  std::map<std::string, PodState> pods_;
  std::map<std::string, netns::Process*> daemons_;
};

// One drain's timeline from /debug/state (wall-clock ms).
struct Timeline {
  int64_t stop_accepting = 0, removed = 0, drained = 0, released = 0, last_confirmation = 0;
  bool removal_forced = false, drain_forced = false;
  std::string raw;
};

std::optional<Timeline> read_timeline(const std::string& state, const std::string& ip) {
  auto drains = state.find("\"drains\"");
  if (drains == std::string::npos) return std::nullopt;
  std::smatch m;
  std::string rest = state.substr(drains);
  if (!std::regex_search(rest, m,
                         std::regex("\"address\":\\s*\"" +
                                    std::regex_replace(ip, std::regex("\\."), "\\.") + "\"")))
    return std::nullopt;
  std::string d = rest.substr(m.position(0));
  auto end = d.find("\"address\":", 10);
  if (end != std::string::npos) d = d.substr(0, end);
  Timeline t;
  t.raw = d;
  auto u = d.find("\"timeline_unix_ms\":");
  std::string sub = u == std::string::npos ? "" : d.substr(u, d.find('}', u) - u);
  auto field = [&](const std::string& k) -> int64_t {
    std::smatch fm;
    if (std::regex_search(sub, fm, std::regex("\"" + k + "\":\\s*(\\d+)")))
      return std::stoll(fm[1]);
    return 0;
  };
  t.stop_accepting = field("stop_accepting");
  t.removed = field("removed");
  t.drained = field("drained");
  t.released = field("released");
  t.last_confirmation = field("last_confirmation");
  t.removal_forced = std::regex_search(d, std::regex("\"removal_forced\":\\s*true"));
  t.drain_forced = std::regex_search(d, std::regex("\"drain_forced\":\\s*true"));
  return t;
}

struct Termination {
  std::string pod;
  int prestop_exit = -1;
  std::string prestop_output;
  int64_t marked_ms = 0, prestop_returned_ms = 0, exited_ms = 0;
};

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
  auto r = dc.cluster().pod(pod).exec({DaemonCluster::bin(), "prestop", "--drain-socket",
                                       dc.socket_of(ps.node), "--timeout", "25s"});
  t.prestop_returned_ms = now_unix_ms();
  slice.join();
  t.prestop_exit = r.exit_code;
  t.prestop_output = r.output;
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

class DaemonDrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!netns::running_as_root()) GTEST_SKIP() << "needs root for namespaces and nftables";
    netns::sweep_stale_namespaces();
  }
};

TEST_F(DaemonDrainTest, RollingUpdateThroughEndpointdRunLosesNothingAndKeepsTheOrder) {
  DaemonCluster dc;
  std::map<std::string, netns::Server> servers;
  for (const char* p : {"web-1", "web-2", "web-3"}) {
    netns::ServerOptions so;
    so.name = p;
    so.grace_ms = 2000;
    servers[p] = netns::start_server(dc.cluster().pod(p), so);
  }
  // web-1 releases after removal (the app closes its keep-alive connections after SIGTERM);
  // web-3 takes the default, after the drain (its keep-alive connections never close by
  // themselves, so the drain ends at its deadline inside the 8 s grace period).
  dc.pods().at("web-1").release_after = "removed";
  dc.write();
  dc.start_daemon("node-a");
  dc.start_daemon("node-b");
  ASSERT_TRUE(dc.wait_ready("node-a")) << dc.daemon("node-a").log();
  ASSERT_TRUE(dc.wait_ready("node-b")) << dc.daemon("node-b").log();
  ASSERT_TRUE(wait_routed(dc.cluster(), 3)) << dc.daemon("node-a").log();

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
  done.push_back(terminate(dc, "web-1", servers.at("web-1")));
  std::this_thread::sleep_for(300ms);
  done.push_back(terminate(dc, "web-3", servers.at("web-3")));
  std::this_thread::sleep_for(500ms);
  auto r1 = newconns.stop();
  auto r2 = keepalive.stop();
  std::map<std::string, std::string> state = {{"node-a", dc.debug_state("node-a")},
                                              {"node-b", dc.debug_state("node-b")}};

  std::string errs;
  for (const auto& [e, n] : r1.errors) errs += e + " x" + std::to_string(n) + "; ";
  for (const auto& [e, n] : r2.errors) errs += e + " x" + std::to_string(n) + "; ";
  EXPECT_EQ(r1.failed, 0) << errs;
  EXPECT_EQ(r2.failed, 0) << errs;
  EXPECT_GT(r1.ok, 100);
  EXPECT_GT(r2.ok, 100);
  std::cout << "new-connection requests: " << r1.ok << " ok, " << r1.failed
            << " failed; keep-alive: " << r2.ok << " ok, " << r2.failed << " failed\n";
  for (const auto& t : done) {
    const auto& ps = dc.pods().at(t.pod);
    EXPECT_EQ(t.prestop_exit, 0) << t.prestop_output;
    auto tl = read_timeline(state.at(ps.node), ps.ip);
    ASSERT_TRUE(tl) << t.pod << " has no drain in " << ps.node
                    << "'s /debug/state: " << state.at(ps.node);
    EXPECT_FALSE(tl->removal_forced) << tl->raw;
    EXPECT_GT(tl->stop_accepting, 0) << tl->raw;
    EXPECT_GT(tl->removed, 0) << tl->raw;
    EXPECT_GT(tl->released, 0) << tl->raw;
    EXPECT_LE(t.marked_ms - 100, tl->stop_accepting) << tl->raw;
    EXPECT_LE(tl->stop_accepting, tl->removed) << tl->raw;
    if (ps.release_after != "removed") {
      EXPECT_GT(tl->drained, 0) << tl->raw;
      EXPECT_LE(tl->removed, tl->drained) << tl->raw;
      EXPECT_LE(tl->drained, tl->released) << tl->raw;
    } else {
      EXPECT_LE(tl->removed, tl->released) << tl->raw;
    }
    // The agent's release stamp and the prestop's return, both before SIGTERM.
    EXPECT_LE(tl->released, t.prestop_returned_ms) << tl->raw;
    EXPECT_LE(t.prestop_returned_ms, t.exited_ms);
    // Released against the last confirmation it waited for (the drain deadline when the
    // keep-alive connections held the drain open until it).
    int64_t last = tl->drain_forced ? tl->drained : tl->last_confirmation;
    int64_t latency = t.prestop_returned_ms - last;
    std::cout << t.pod << " (" << ps.node << ", release after "
              << (ps.release_after.empty() ? "drained" : "removed") << "): termination→release "
              << t.prestop_returned_ms - t.marked_ms << " ms; stop-accepting→removed "
              << tl->removed - tl->stop_accepting << " ms; prestop returned " << latency
              << " ms after the last confirmation; " << tl->raw << "\n";
    EXPECT_GE(latency, 0) << tl->raw;
    EXPECT_LE(latency, 100) << tl->raw;
    int accepts = 0;
    for (const auto& ev : netns::read_server_events(servers.at(t.pod).events_path)) {
      if (ev.kind != "accept") continue;
      ++accepts;
      EXPECT_LE(ev.time_ns / 1000000, tl->removed)
          << t.pod << " accepted " << ev.peer << " after its removal";
    }
    EXPECT_GT(accepts, 0) << t.pod << " never served";
  }
  dc.daemon("node-a").stop();
  dc.daemon("node-b").stop();
}

}  // namespace
}  // namespace endpointd::drain
