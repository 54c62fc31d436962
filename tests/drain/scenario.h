// What the drain-ordering tests on the namespace cluster share, whether the node agents are
// endpointd-drain-agent (drain_order_test) or `endpointd run` (daemon_drain_test): the manifest
// directory the agents read, the pods' test servers, the kubelet's steps after a preStop, the
// rolling update under load through the ClusterIP, and the checks on each drain's timeline.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/netns/cluster.h"

namespace endpointd::drain::testing {

// How a pod runs `endpointd prestop BIN SOCKET ARGS...`: with the socket's directory mounted
// read-only, as the chart mounts it, so the client's check that the socket is the agent's
// (verify_drain_socket) runs as in a cluster. The bind mount is made in the mount namespace
// `ip netns exec` gives each command, and goes with it.
inline std::vector<std::string> prestop_command(const std::string& bin, const std::string& socket,
                                                const std::vector<std::string>& args) {
  std::string dir = std::filesystem::path(socket).parent_path().string();
  std::vector<std::string> argv = {"sh",
                                   "-c",
                                   "mount --bind -o ro \"$0\" \"$0\" && exec \"$@\"",
                                   dir,
                                   bin,
                                   "prestop",
                                   "--drain-socket",
                                   socket};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

inline int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A wall-clock time in ms as the API writes a timestamp (RFC 3339, UTC, whole seconds).
inline std::string rfc3339(int64_t unix_ms) {
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One pod of the "web" service as the API and its EndpointSlice show it.
struct PodState {
  std::string node, ip, uid;
  bool pod_deleting = false;  // deletionTimestamp in the API
  bool deleting = false;      // the endpoint terminating in the slice
  bool in_slice = true, in_api = true;
  std::string release_after = {};  // the endpointd.io/release-after annotation, empty: none
  int grace = 8;
  // The deletionTimestamp the API shows once pod_deleting (RFC 3339); empty: one far in the
  // future, which the agent clamps to the grace period from when it saw the deletion.
  std::string deletion_timestamp = {};
  std::string drain_action = {};  // the endpointd.io/drain-action annotation, empty: none
};

// The demo cluster's namespaces plus the manifest directory the agents read: service web
// (ClusterIP 10.96.0.10) with web-1, web-2 on node-a and web-3 on node-b. The test changes
// pods() and calls write(), which replaces web.yaml and pods.yaml atomically (by rename) as
// the API would change.
class Scenario {
 public:
  // app_selector: the Service selects app=web and the pods carry that label, as in
  // examples/cluster.
  Scenario(const std::string& manifest_dir_name, bool app_selector,
           netns::ClusterSpec spec = netns::ClusterSpec::demo())
      : cluster_(std::move(spec)),
        dir_(netns::scratch_dir() + "/" + manifest_dir_name),
        app_selector_(app_selector) {
    pods_["web-1"] = {"node-a", "10.244.1.10", "7a0e0000-0000-4000-8000-000000000011"};
    pods_["web-2"] = {"node-a", "10.244.1.11", "7a0e0000-0000-4000-8000-000000000012"};
    pods_["web-3"] = {"node-b", "10.244.2.10", "7a0e0000-0000-4000-8000-000000000013"};
  }
  netns::Cluster& cluster() { return cluster_; }
  std::map<std::string, PodState>& pods() { return pods_; }
  const std::string& manifest_dir() const { return dir_; }
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
)";
    if (app_selector_) web += "  selector: {app: web}\n";
    web += R"(  ports: [{name: http, protocol: TCP, port: 80, targetPort: http}]
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
                ", namespace: demo, uid: " + p.uid + (app_selector_ ? ", labels: {app: web}" : "") +
                (p.pod_deleting ? ", deletionTimestamp: \"" +
                                      (p.deletion_timestamp.empty() ? "2030-01-01T00:00:00Z"
                                                                    : p.deletion_timestamp) +
                                      "\""
                                : "") +
                annotations(p) + "}\n  spec: {nodeName: " + p.node +
                ", terminationGracePeriodSeconds: " + std::to_string(p.grace) +
                "}\n  status: {phase: Running, podIP: " + p.ip + ", podIPs: [{ip: " + p.ip +
                "}]}\n";
      }
    }
    if (!any) web += "  []\n";
    replace("web.yaml", web);
    replace("pods.yaml", pods);
  }

 private:
  static std::string annotations(const PodState& p) {
    std::string a;
    if (!p.release_after.empty()) a += "endpointd.io/release-after: " + p.release_after;
    if (!p.drain_action.empty())
      a += std::string(a.empty() ? "" : ", ") + "endpointd.io/drain-action: \"" + p.drain_action +
           "\"";
    return a.empty() ? "" : ", annotations: {" + a + "}";
  }
  void replace(const std::string& name, const std::string& text) {
    std::string tmp = dir_ + "/." + name + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, dir_ + "/" + name);
  }
  netns::Cluster cluster_;
  std::string dir_;
  bool app_selector_;
  std::map<std::string, PodState> pods_;
};

// Skips without root; removes namespaces left by test processes that died.
class RootNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!netns::running_as_root()) GTEST_SKIP() << "needs root for namespaces and nftables";
    netns::sweep_stale_namespaces();
  }
};

// The pods' test servers, each draining for 2 s after SIGTERM.
inline std::map<std::string, netns::Server> start_servers(Scenario& s) {
  std::map<std::string, netns::Server> out;
  for (const char* p : {"web-1", "web-2", "web-3"}) {
    netns::ServerOptions so;
    so.name = p;
    so.grace_ms = 2000;
    out[p] = netns::start_server(s.cluster().pod(p), so);
  }
  return out;
}

// Waits until 30 requests in a row through the ClusterIP succeed and reach at least
// want_backends pods.
inline bool wait_routed(netns::Cluster& c, int want_backends) {
  for (int i = 0; i < 100; ++i) {
    netns::LoadOptions lo;
    lo.target = "10.96.0.10:80";
    lo.count = 30;
    lo.interval_ms = 0;
    lo.timeout_ms = 300;
    netns::LoadClient probe(c.client(), lo);
    auto r = probe.wait(std::chrono::seconds(5));
    if (r.failed == 0 && static_cast<int>(r.by_backend.size()) >= want_backends) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Four clients sending new-connection requests through the ClusterIP for up to a minute.
inline netns::LoadOptions cluster_ip_load(int interval_ms) {
  netns::LoadOptions lo;
  lo.target = "10.96.0.10:80";
  lo.concurrency = 4;
  lo.duration_ms = 60000;
  lo.interval_ms = interval_ms;
  return lo;
}

// One pod's termination as the test drove it (wall-clock ms).
struct Termination {
  std::string pod;
  int prestop_exit = -1;
  std::string prestop_output;
  int64_t marked_ms = 0, prestop_returned_ms = 0, exited_ms = 0;
};

// The kubelet's steps once the preStop returned: SIGTERM, and when the process exited the
// endpoint leaves the slice and the pod the API.
inline void kill_and_remove(Scenario& s, netns::Server& server, Termination& t) {
  server.process->signal(SIGTERM);
  server.process->wait_exit(std::chrono::seconds(20));
  t.exited_ms = now_unix_ms();
  auto& ps = s.pods().at(t.pod);
  ps.in_slice = false;
  ps.in_api = false;
  s.write();
}

struct RollingUpdate {
  netns::LoadResult fresh;  // new-connection requests
  netns::LoadResult kept;   // keep-alive requests
  std::vector<Termination> done;
};

// New-connection and keep-alive clients through the ClusterIP while `terminate` ends web-1
// (node-a) and then web-3 (node-b); the clients stop shortly after.
inline RollingUpdate run_rolling_update(
    Scenario& s, const std::function<Termination(const std::string& pod)>& terminate) {
  netns::LoadOptions fresh = cluster_ip_load(5);
  netns::LoadClient newconns(s.cluster().client(), fresh);
  netns::LoadOptions kept = fresh;
  kept.keepalive = true;
  netns::LoadClient keepalive(s.cluster().client(), kept);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  RollingUpdate u;
  u.done.push_back(terminate("web-1"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  u.done.push_back(terminate("web-3"));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  u.fresh = newconns.stop();
  u.kept = keepalive.stop();
  return u;
}

inline void expect_no_failed_requests(const RollingUpdate& u) {
  std::string errs;
  for (const auto& [e, n] : u.fresh.errors) errs += e + " x" + std::to_string(n) + "; ";
  for (const auto& [e, n] : u.kept.errors) errs += e + " x" + std::to_string(n) + "; ";
  for (const auto* r : {&u.fresh, &u.kept})
    for (const auto& rec : r->records)
      if (!rec.ok)
        errs += "[" + rec.what + " at unix ms " + std::to_string(rec.time_ns / 1000000) +
                ", worker " + std::to_string(rec.worker) + "] ";
  EXPECT_EQ(u.fresh.failed, 0) << errs;
  EXPECT_EQ(u.kept.failed, 0) << errs;
  std::cout << "new-connection requests: " << u.fresh.ok << " ok, " << u.fresh.failed
            << " failed; keep-alive: " << u.kept.ok << " ok, " << u.kept.failed << " failed\n";
}

// One drain's timeline as its agent reported it (wall-clock ms).
struct Timeline {
  int64_t stop_accepting = 0, removed = 0, drained = 0, released = 0, last_confirmation = 0;
  int64_t prestop_called = 0;  // when the prestop call reached the agent (0: none)
  int64_t drain_action = 0, drain_action_done = 0;  // when the drain action ran (0: none)
  bool removal_forced = false, drain_forced = false;
  std::string raw;  // the drain's JSON
};

// The drain of `ip` in a JSON list of drains (the coordinator's drains_json, or what follows
// "drains" in /debug/state).
inline std::optional<Timeline> find_timeline(const std::string& drains, const std::string& ip) {
  std::smatch m;
  if (!std::regex_search(drains, m,
                         std::regex("\"address\":\\s*\"" +
                                    std::regex_replace(ip, std::regex("\\."), "\\.") + "\"")))
    return std::nullopt;
  std::string d = drains.substr(m.position(0));
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
  t.prestop_called = field("prestop_called");
  t.drain_action = field("drain_action");
  t.drain_action_done = field("drain_action_done");
  t.removal_forced = std::regex_search(d, std::regex("\"removal_forced\":\\s*true"));
  t.drain_forced = std::regex_search(d, std::regex("\"drain_forced\":\\s*true"));
  return t;
}

// The order every drain keeps: stop accepting, removed everywhere, the drain action if it has
// one, drained (unless the pod releases after removal), and the process exits only after the
// preStop returned.
inline void expect_drain_order(const Termination& t, const PodState& ps, const Timeline& tl) {
  EXPECT_FALSE(tl.removal_forced) << tl.raw;
  EXPECT_GT(tl.stop_accepting, 0) << tl.raw;
  EXPECT_LE(tl.stop_accepting, tl.removed) << tl.raw;
  if (tl.drain_action > 0) {
    EXPECT_LE(tl.removed, tl.drain_action) << tl.raw;
  }
  if (ps.release_after == "drained" || !ps.drain_action.empty() ||
      tl.raw.find("\"release_after\":\"drained\"") != std::string::npos) {
    EXPECT_LE(tl.removed, tl.drained) << tl.raw;
  }
  EXPECT_LE(t.prestop_returned_ms, t.exited_ms);
}

// How long after the last confirmation it waited for the preStop returned. A drain that ended
// at its deadline (keep-alive clients never close by themselves) counts from that deadline.
// How long after the moment it could be released the prestop returned: the later of the last
// confirmation (or the drain deadline) and the prestop call reaching the agent. The prestop is
// started after the pod is marked terminating; on a loaded machine its process can take longer
// to start than the removal takes to confirm, and that start-up is not the agent's latency.
inline int64_t release_latency_ms(const Termination& t, const Timeline& tl) {
  int64_t last = tl.drain_forced ? tl.drained : tl.last_confirmation;
  return t.prestop_returned_ms - std::max(last, tl.prestop_called);
}

// No connection accepted by the pod after its removal was confirmed on every node. Returns
// how many connections it accepted.
inline int expect_no_accept_after_removal(const std::string& pod, const netns::Server& server,
                                          const Timeline& tl) {
  int accepts = 0;
  for (const auto& ev : netns::read_server_events(server.events_path)) {
    if (ev.kind != "accept") continue;
    ++accepts;
    EXPECT_LE(ev.time_ns / 1000000, tl.removed)
        << pod << " accepted " << ev.peer << " after its removal";
  }
  return accepts;
}

}  // namespace endpointd::drain::testing
