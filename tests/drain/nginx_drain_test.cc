// The drain with a real application and real load tools: every pod runs nginx (Debian
// nginx-light) serving a small body, `endpointd run` on both nodes, and a rolling update of six
// pods (three per node, one new pod ready before each old one goes, as a Deployment with
// maxSurge 1 does) under wrk (HTTP/1.1 keep-alive) or h2load (HTTP/2, long-lived connections)
// through the ClusterIP. The kubelet's order: the API marks the pod deleted, the preStop runs
// `endpointd prestop` in the pod, SIGTERM only when it returned, the endpoint leaves the slice
// when nginx exited. The drain action is nginx's graceful stop (`nginx -s quit`): from the pod's
// annotation under wrk, from the prestop's --drain-action flag under h2load. Failed requests
// are the load tools' own counts (non-2xx, socket errors, timeouts).
//
// How nginx drains without losing a request of a client that does not retry (wrk, h2load):
// nginx's graceful stop (`nginx -s quit`) closes idle HTTP/1.1 keep-alive connections at once,
// racing the client's next request on them, and its HTTP/2 GOAWAY races streams the client sent
// before it arrived; both are counted in bench/results/drain.md. What loses nothing is nginx
// ending each connection itself after a response — "Connection: close" or GOAWAY once the
// connection reached `keepalive_time` — with the release waiting for conntrack to empty
// (endpointd.io/release-after: drained). Behind HAProxy the graceful stop is enough: HAProxy
// stopped sending to the pod when the adapter set its server to drain, and keeps its clients'
// connections.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/drain/daemon_cluster.h"
#include "tests/drain/scenario.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace fs = std::filesystem;

// node-a and node-b as in the demo, each with three old pods and three new ones.
netns::ClusterSpec rollout_spec() {
  netns::ClusterSpec s = netns::ClusterSpec::demo();
  for (auto& n : s.nodes) {
    std::string net = n.name == "node-a" ? "10.244.1." : "10.244.2.";
    std::string tag = n.name == "node-a" ? "a" : "b";
    n.pods.clear();
    for (int i = 1; i <= 3; ++i) {
      n.pods.push_back({"old-" + tag + std::to_string(i), net + std::to_string(9 + i)});
      n.pods.push_back({"new-" + tag + std::to_string(i), net + std::to_string(19 + i)});
    }
  }
  return s;
}

// The order of the rolling update: old pods alternate between the nodes.
const std::vector<std::pair<std::string, std::string>> kSteps = {
    {"old-a1", "new-a1"}, {"old-b1", "new-b1"}, {"old-a2", "new-a2"},
    {"old-b2", "new-b2"}, {"old-a3", "new-a3"}, {"old-b3", "new-b3"}};

class NginxCluster : public DaemonCluster {
 public:
  // keepalive_time_ms: nginx's limit on a keep-alive connection's life (0: none).
  explicit NginxCluster(bool http2, int keepalive_time_ms = 0)
      : DaemonCluster("nginx-drain-manifests", rollout_spec()),
        http2_(http2),
        keepalive_time_ms_(keepalive_time_ms) {
    pods().clear();
    int n = 0;
    for (const auto& node : cluster().spec().nodes)
      for (const auto& p : node.pods) {
        char uid[64];
        std::snprintf(uid, sizeof uid, "7a0e0000-0000-4000-8000-0000000001%02d", ++n);
        PodState ps{node.name, p.ip, uid};
        bool fresh = p.name.rfind("new-", 0) == 0;
        ps.in_slice = ps.in_api = !fresh;
        pods()[p.name] = ps;
      }
    write();
  }

  std::string conf_of(const std::string& pod) const {
    return netns::scratch_dir() + "/nginx-" + pod + "/nginx.conf";
  }
  std::string quit_action(const std::string& pod) const {
    return "exec:nginx -c " + conf_of(pod) + " -s quit";
  }

  // nginx in the pod's namespace, in the foreground (the pod's main process).
  netns::Process& start_nginx(const std::string& pod) {
    std::string dir = netns::scratch_dir() + "/nginx-" + pod;
    fs::create_directories(dir);
    // keepalive_requests: nginx's default (1000) would end wrk's busy connections by itself
    // within a fraction of a second and hide the drain; a slower client keeps them for minutes.
    std::ofstream(conf_of(pod)) << "worker_processes 1;\n"
                                << "pid " << dir << "/nginx.pid;\n"
                                << "error_log " << dir << "/error.log notice;\n"
                                << "events { worker_connections 1024; }\n"
                                << "http {\n"
                                << "  access_log off;\n"
                                << "  client_body_temp_path " << dir << "/body;\n"
                                << "  proxy_temp_path " << dir << "/proxy;\n"
                                << "  keepalive_requests 1000000;\n"
                                << (keepalive_time_ms_ > 0
                                        ? "  keepalive_time " + std::to_string(keepalive_time_ms_) +
                                              "ms;\n"
                                        : std::string())
                                << "  server {\n"
                                << "    listen 8080" << (http2_ && !ingress_ ? " http2" : "")
                                << ";\n"
                                << "    location / { return 200 \"" << pod << "\\n\"; }\n"
                                << "  }\n"
                                << "}\n";
    auto& p = cluster().pod(pod).spawn({"nginx", "-c", conf_of(pod), "-g", "daemon off;"},
                                       "nginx-" + pod + ".log");
    nginx_[pod] = &p;
    return p;
  }
  bool wait_listening(const std::string& pod) {
    int rc = 1;
    cluster().pod(pod).sh(
        "for i in $(seq 100); do ss -ltn | grep -q ':8080 ' && exit 0; sleep 0.05; done; exit 1",
        &rc);
    return rc == 0;
  }
  netns::Process& nginx(const std::string& pod) { return *nginx_.at(pod); }
  // Behind HAProxy the pods speak HTTP/1.1 whatever the clients speak.
  void set_ingress() { ingress_ = true; }
  bool http2() const { return http2_; }

 private:
  bool http2_;
  int keepalive_time_ms_;
  bool ingress_ = false;
  std::map<std::string, netns::Process*> nginx_;
};

struct LoadReport {
  int64_t ok = 0, failed = 0;
  std::string summary;  // the tool's lines that count
  std::string raw;
};

int64_t number_after(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex(pattern))) return std::stoll(m[1]);
  return 0;
}

// wrk prints "Socket errors: connect A, read B, write C, timeout D" and "Non-2xx or 3xx
// responses: N" only when they are not zero.
LoadReport read_wrk(const std::string& out) {
  LoadReport r;
  r.raw = out;
  int64_t total = number_after(out, R"((\d+) requests in)");
  int64_t sock = number_after(out, R"(connect (\d+))") + number_after(out, R"(read (\d+))") +
                 number_after(out, R"(write (\d+))") + number_after(out, R"(timeout (\d+))");
  int64_t non2xx = number_after(out, R"(Non-2xx or 3xx responses: (\d+))");
  r.failed = sock + non2xx;
  r.ok = total - non2xx;
  std::smatch m;
  r.summary = std::to_string(total) + " requests, " + std::to_string(non2xx) + " non-2xx";
  if (std::regex_search(out, m, std::regex(R"(Socket errors:[^\n]*)"))) r.summary += "; " + m.str();
  return r;
}

// h2load, once per round: "requests: T total, S started, D done, OK succeeded, F failed, E
// errored, X timeout" and "status codes: a 2xx, b 3xx, c 4xx, d 5xx"; summed over the rounds.
LoadReport read_h2load(const std::string& out) {
  LoadReport r;
  r.raw = out;
  auto sum = [&](const std::string& pattern) {
    int64_t total = 0;
    std::regex re(pattern);
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
         ++it)
      total += std::stoll((*it)[1]);
    return total;
  };
  int64_t rounds = 0;
  for (size_t at = out.find("requests: "); at != std::string::npos;
       at = out.find("requests: ", at + 1))
    ++rounds;
  r.ok = sum(R"((\d+) succeeded)");
  int64_t failed = sum(R"((\d+) failed)"), errored = sum(R"((\d+) errored)"),
          timeout = sum(R"((\d+) timeout)"), c4 = sum(R"((\d+) 4xx)"), c5 = sum(R"((\d+) 5xx)");
  r.failed = failed + errored + timeout + c4 + c5;
  r.summary = std::to_string(rounds) + " h2load rounds: " + std::to_string(r.ok) + " succeeded, " +
              std::to_string(failed) + " failed, " + std::to_string(errored) + " errored, " +
              std::to_string(timeout) + " timeout, " + std::to_string(c4 + c5) + " 4xx/5xx";
  return r;
}

struct Rollout {
  std::vector<Termination> done;
  std::map<std::string, Timeline> timelines;
  LoadReport load;
  int64_t duration_ms = 0;
};

// How the old pods end.
enum class Mode {
  kQuitFlag,             // the prestop's --drain-action runs `nginx -s quit`
  kDrained,              // endpointd.io/release-after: drained (nginx closes by keepalive_time)
  kSigtermAfterRemoval,  // release after removal, no drain action: nginx's fast stop
  kNoPrestop,            // no preStop hook: SIGTERM at once
  kSleep,                // preStop = sleep 15, the usual fixed wait
  kOldDefault,           // release after the drain, no drain action: waits out the deadline
};

const char* name_of(Mode m) {
  switch (m) {
    case Mode::kQuitFlag:
      return "drain action (nginx -s quit)";
    case Mode::kDrained:
      return "release after drain (connections end by themselves)";
    case Mode::kSigtermAfterRemoval:
      return "release after removal (default without an action)";
    case Mode::kNoPrestop:
      return "no preStop";
    case Mode::kSleep:
      return "sleep 15";
    case Mode::kOldDefault:
      return "release after drain (old default), no action";
  }
  return "?";
}

Rollout finish(NginxCluster& nc, Rollout& r, const std::string& out);

// HAProxy 2.6 in the client's namespace as the ingress (frontend 127.0.0.1:8000, HTTP/2 for
// h2load; HTTP/1.1 to the pods), its backend's servers driven by endpointd-haproxy from node-a's
// feed: the feed's acknowledgement, so the drain's removal, waits for HAProxy to apply.
struct Ingress {
  netns::Process* haproxy = nullptr;
  netns::Process* adapter = nullptr;
  std::string dir;
};

Ingress start_ingress(NginxCluster& nc, bool http2) {
  Ingress in;
  in.dir = netns::scratch_dir() + "/haproxy";
  fs::create_directories(in.dir);
  std::ofstream(in.dir + "/haproxy.cfg")
      << "global\n"
      << "  stats socket " << in.dir << "/admin.sock mode 600 level admin\n"
      << "defaults\n"
      << "  mode http\n"
      << "  timeout connect 2s\n  timeout client 30s\n  timeout server 30s\n"
      << "  retries 3\n  option redispatch\n"
      << "  retry-on conn-failure empty-response response-timeout\n"
      << "frontend fe\n"
      << "  bind 127.0.0.1:8000" << (http2 ? " proto h2" : "") << "\n"
      << "  default_backend be_web\n"
      << "backend be_web\n"
      << "  balance roundrobin\n";
  auto& client = nc.cluster().client();
  in.haproxy = &client.spawn({"haproxy", "-db", "-f", in.dir + "/haproxy.cfg"}, "haproxy.log");
  for (int i = 0; i < 100 && !fs::exists(in.dir + "/admin.sock"); ++i)
    std::this_thread::sleep_for(50ms);
  in.adapter = &client.spawn({ENDPOINTD_HAPROXY_PATH, "--feed", "192.168.77.2:18000",
                              "--haproxy-socket", in.dir + "/admin.sock", "--backend",
                              "demo/web:80=be_web", "--client-name", "haproxy-ingress"},
                             "endpointd-haproxy.log");
  return in;
}

// The rolling update under the load tool (through HAProxy with `ingress`).
// `connections`: wrk's keep-alive connections (HTTP/1.1 runs only).
Rollout roll(NginxCluster& nc, Mode mode, int load_seconds, bool ingress = false,
             int connections = 8) {
  if (ingress) nc.set_ingress();
  for (const auto& [name, ps] : nc.pods()) {
    nc.start_nginx(name);
    EXPECT_TRUE(nc.wait_listening(name)) << name << " nginx did not listen";
  }
  for (const auto& [old_pod, fresh] : kSteps) {
    if (mode == Mode::kDrained || mode == Mode::kOldDefault)
      nc.pods().at(old_pod).release_after = "drained";
    if (mode == Mode::kSleep) nc.pods().at(old_pod).grace = 20;
  }
  nc.write();
  if (ingress) nc.set_extra_args("node-a", {"--feed-listen", "192.168.77.2:18000"});
  EXPECT_TRUE(nc.start_both());
  std::this_thread::sleep_for(500ms);

  std::string url = "http://10.96.0.10:80/";
  Ingress in;
  if (ingress) {
    in = start_ingress(nc, nc.http2());
    url = "http://127.0.0.1:8000/";
    int rc = 1;
    nc.cluster().client().sh("for i in $(seq 200); do curl -fs " +
                                 std::string(nc.http2() ? "--http2-prior-knowledge " : "") +
                                 "-o /dev/null --max-time 1 " + url +
                                 " && exit 0; sleep 0.05; done; exit 1",
                             &rc);
    EXPECT_EQ(rc, 0) << "HAProxy never served: " << in.adapter->log() << in.haproxy->log();
  }
  // h2load does not reconnect a client whose connection got a GOAWAY: it runs in 2 s rounds
  // for the whole time, each round connecting anew (the reports are summed).
  std::string h2 = "end=$(($(date +%s)+" + std::to_string(load_seconds) +
                   ")); while [ $(date +%s) -lt $end ]; do h2load -c 8 -m 4 -t 1 --rps 100 -D 2 " +
                   url + "; done";
  std::vector<std::string> load = nc.http2()
                                      ? std::vector<std::string>{"sh", "-c", h2}
                                      : std::vector<std::string>{"wrk",
                                                                 "-t",
                                                                 "1",
                                                                 "-c",
                                                                 std::to_string(connections),
                                                                 "-d",
                                                                 std::to_string(load_seconds) + "s",
                                                                 "--timeout",
                                                                 "3s",
                                                                 url};
  auto& tool = nc.cluster().client().spawn(load, nc.http2() ? "h2load.log" : "wrk.log");
  std::this_thread::sleep_for(1s);

  Rollout r;
  int64_t t0 = now_unix_ms();
  for (const auto& [old_pod, fresh] : kSteps) {
    // The new pod is ready first.
    auto& np = nc.pods().at(fresh);
    np.in_api = np.in_slice = true;
    nc.write();
    std::this_thread::sleep_for(400ms);
    // Then the old one terminates, the kubelet's way.
    auto& ps = nc.pods().at(old_pod);
    Termination t;
    t.pod = old_pod;
    ps.pod_deleting = true;
    nc.write();
    t.marked_ms = now_unix_ms();
    std::thread slice([&] {
      std::this_thread::sleep_for(300ms);
      ps.deleting = true;
      nc.write();
    });
    std::vector<std::string> prestop =
        prestop_command(DaemonCluster::bin(), nc.socket_of(ps.node), {"--timeout", "25s"});
    if (mode == Mode::kQuitFlag) {
      prestop.push_back("--drain-action");
      prestop.push_back(nc.quit_action(old_pod));
    }
    if (mode == Mode::kSleep) prestop = {"sleep", "15"};
    if (mode != Mode::kNoPrestop) {
      auto res = nc.cluster().pod(old_pod).exec(prestop);
      t.prestop_exit = res.exit_code;
      t.prestop_output = res.output;
    } else {
      t.prestop_exit = 0;
      // Without a preStop the kubelet signals the container as the pod is marked deleted,
      // while the endpoint is still being removed everywhere: that race is what loses
      // requests (waiting for the slice first made the loss depend on luck).
      nc.nginx(old_pod).signal(SIGTERM);
    }
    t.prestop_returned_ms = now_unix_ms();
    slice.join();
    if (mode != Mode::kNoPrestop) nc.nginx(old_pod).signal(SIGTERM);
    nc.nginx(old_pod).wait_exit(20s);
    t.exited_ms = now_unix_ms();
    ps.in_slice = ps.in_api = false;
    nc.write();
    r.done.push_back(t);
  }
  r.duration_ms = now_unix_ms() - t0;
  tool.wait_exit(std::chrono::seconds(load_seconds + 20));
  return finish(nc, r, tool.log());
}

Rollout finish(NginxCluster& nc, Rollout& r, const std::string& out) {
  r.load = nc.http2() ? read_h2load(out) : read_wrk(out);
  for (const char* node : {"node-a", "node-b"}) {
    std::string state = nc.debug_state(node);
    auto drains = state.find("\"drains\"");
    for (const auto& [old_pod, fresh] : kSteps) {
      const auto& ps = nc.pods().at(old_pod);
      if (ps.node != node || drains == std::string::npos) continue;
      if (auto tl = find_timeline(state.substr(drains), ps.ip)) r.timelines[old_pod] = *tl;
    }
  }
  nc.daemon("node-a").stop();
  nc.daemon("node-b").stop();
  return r;
}

int64_t median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Every drain in order, with its drain action between removal and the drain, none at a
// deadline, and termination → release within 1 s plus nginx's own drain time (median).
void expect_clean_rollout(NginxCluster& nc, const Rollout& r, int load_seconds, Mode mode) {
  EXPECT_LT(r.duration_ms + 1000, load_seconds * 1000) << "the rollout outlasted the load";
  EXPECT_EQ(r.load.failed, 0) << r.load.raw;
  EXPECT_GT(r.load.ok, 100) << r.load.raw;
  ASSERT_EQ(r.done.size(), kSteps.size());
  std::vector<int64_t> release, app_drain;
  for (const auto& t : r.done) {
    const auto& ps = nc.pods().at(t.pod);
    EXPECT_EQ(t.prestop_exit, 0) << t.pod << ": " << t.prestop_output;
    auto it = r.timelines.find(t.pod);
    ASSERT_NE(it, r.timelines.end()) << t.pod << " has no drain in " << ps.node << "'s state";
    const Timeline& tl = it->second;
    expect_drain_order(t, ps, tl);
    if (mode == Mode::kQuitFlag) {
      EXPECT_GT(tl.drain_action, 0) << tl.raw;
      EXPECT_LE(tl.removed, tl.drain_action) << tl.raw;
      EXPECT_LE(tl.drain_action, tl.drained) << tl.raw;
      EXPECT_NE(t.prestop_output.find("drain action exec:nginx"), std::string::npos)
          << t.prestop_output;
    }
    EXPECT_GT(tl.drained, 0) << tl.raw;
    EXPECT_FALSE(tl.drain_forced) << "waited out the deadline: " << tl.raw;
    EXPECT_LE(tl.released, t.prestop_returned_ms) << tl.raw;
    release.push_back(t.prestop_returned_ms - t.marked_ms);
    // nginx's own drain time: from the drain action, or from removal when it closes its
    // connections by itself (keepalive_time).
    int64_t from = mode == Mode::kQuitFlag ? tl.drain_action : tl.removed;
    app_drain.push_back(tl.drained - from);
    std::cout << t.pod << " (" << ps.node << "): termination→release "
              << t.prestop_returned_ms - t.marked_ms << " ms; stop-accepting→removed "
              << tl.removed - tl.stop_accepting << " ms; nginx drained in " << app_drain.back()
              << " ms\n";
  }
  std::cout << (nc.http2() ? "h2load: " : "wrk: ") << r.load.summary << "; " << r.load.failed
            << " failed; rollout " << r.duration_ms << " ms; median termination→release "
            << median(release) << " ms, median nginx drain " << median(app_drain) << " ms\n";
  // Released once nginx drained, not at a deadline (the drain budget is 30 s). The slack is
  // wide: under a loaded test machine (the suite's other namespace tests beside it) a median of
  // 1.5 s against 0.27 s of nginx drain was seen; the speed is bench/results/drain.md's.
  EXPECT_LE(median(release), 3000 + median(app_drain));
}

class NginxDrainTest : public RootNetnsTest {
 protected:
  void SetUp() override {
    RootNetnsTest::SetUp();
    if (IsSkipped()) return;
    for (const char* tool : {"nginx", "wrk", "h2load"})
      if (std::system((std::string("command -v ") + tool + " >/dev/null").c_str()) != 0)
        GTEST_FAIL() << tool << " is not installed (scripts/setup installs it)";
  }
};

// Connections end by themselves and the release waits for conntrack to empty; no drain
// action. HTTP/1.1: nginx answers "Connection: close" once a connection is 1 s old
// (keepalive_time). HTTP/2: h2load's 2 s rounds end every connection before nginx's 3 s
// keepalive_time would. A GOAWAY nginx sends at keepalive_time races streams h2load already
// sent, which h2load does not retry: with 1 s, a round lost a stream on each of its 8
// connections at once now and then (errors in multiples of 8, after the rollout as often as
// during it) — a client's retry policy, not the drain.
void keepalive_time_rollout(bool http2) {
  NginxCluster nc(http2, http2 ? 3000 : 1000);
  ASSERT_EQ(nc.pki_error(), "");
  const int load_seconds = 16;
  auto r = roll(nc, Mode::kDrained, load_seconds);
  expect_clean_rollout(nc, r, load_seconds, Mode::kDrained);
}

// HTTP/1.1 keep-alive: nginx answers "Connection: close" and closes.
TEST_F(NginxDrainTest, RollingUpdateUnderWrkLosesNothingAndReleasesAfterNginxDrained) {
  keepalive_time_rollout(false);
}

// HTTP/2: each connection ends with its client's round, before nginx's keepalive_time. (The
// drain action `nginx -s quit` is faster but its GOAWAY races streams a client sent before it
// arrived, which h2load does not retry: bench/results/drain.md counts them.)
TEST_F(NginxDrainTest, RollingUpdateUnderH2loadLosesNothingAndReleasesAfterNginxDrained) {
  keepalive_time_rollout(true);
}

// Through HAProxy fed by endpointd-haproxy: the drain action is nginx's graceful stop, and
// HAProxy, which stopped sending to the pod once the adapter set its server to drain (and
// acknowledged only then), keeps its clients' connections whatever the pods do.
TEST_F(NginxDrainTest, RollingUpdateThroughHaproxyUnderWrkAndH2loadLosesNothing) {
  for (bool h2 : {false, true}) {
    NginxCluster nc(h2);
    ASSERT_EQ(nc.pki_error(), "");
    const int load_seconds = 16;
    auto r = roll(nc, Mode::kQuitFlag, load_seconds, true);
    expect_clean_rollout(nc, r, load_seconds, Mode::kQuitFlag);
    // node-a's removals waited for the feed, whose only subscriber is the adapter: HAProxy had
    // applied each removal before its pod was told to drain.
    for (const auto& [pod, tl] : r.timelines) {
      if (nc.pods().at(pod).node == "node-a") {
        EXPECT_NE(tl.raw.find("\"feed\":"), std::string::npos) << tl.raw;
      }
    }
  }
}

// The adapter's acknowledgement gates the drain: with HAProxy stopped (SIGSTOP: its runtime
// socket accepts nothing) the pod's removal is not confirmed — node-a's /debug/state shows the
// drain in stop-accepting with the proxy confirmed and the feed not — and the prestop is held;
// HAProxy continued, the adapter applies and acknowledges, and the prestop returns. (At the end
// of the budget the removal deadline policy would release it instead: MachineTest covers that.)
TEST_F(NginxDrainTest, HaproxyThatDoesNotAnswerHoldsTheReleaseUntilItDoes) {
  NginxCluster nc(false);
  ASSERT_EQ(nc.pki_error(), "");
  nc.set_ingress();
  for (const auto& [name, ps] : nc.pods()) {
    nc.start_nginx(name);
    ASSERT_TRUE(nc.wait_listening(name)) << name;
  }
  auto& old_pod = nc.pods().at("old-a1");
  old_pod.grace = 20;
  nc.write();
  nc.set_extra_args("node-a", {"--feed-listen", "192.168.77.2:18000"});
  ASSERT_TRUE(nc.start_both());
  Ingress in = start_ingress(nc, false);
  int rc = 1;
  nc.cluster().client().sh(
      "for i in $(seq 200); do curl -fs -o /dev/null --max-time 1 http://127.0.0.1:8000/ && exit "
      "0; sleep 0.05; done; exit 1",
      &rc);
  ASSERT_EQ(rc, 0) << in.adapter->log();

  in.haproxy->signal(SIGSTOP);
  old_pod.pod_deleting = true;
  old_pod.deleting = true;
  old_pod.drain_action = nc.quit_action("old-a1");
  nc.write();
  int64_t marked = now_unix_ms();
  auto prestop = std::async(std::launch::async, [&] {
    return nc.cluster().pod("old-a1").exec(
        prestop_command(DaemonCluster::bin(), nc.socket_of("node-a"), {"--timeout", "30s"}));
  });
  std::this_thread::sleep_for(3s);
  std::string held = nc.debug_state("node-a");
  auto drains = held.find("\"drains\"");
  ASSERT_NE(drains, std::string::npos) << held;
  auto tl = find_timeline(held.substr(drains), old_pod.ip);
  bool still_waiting = prestop.wait_for(0s) != std::future_status::ready;
  int64_t resumed = now_unix_ms();
  in.haproxy->signal(SIGCONT);
  auto r = prestop.get();
  int64_t returned = now_unix_ms();
  ASSERT_TRUE(tl) << held;
  EXPECT_TRUE(still_waiting) << "released while HAProxy could not have applied the removal: "
                             << r.output;
  EXPECT_NE(tl->raw.find("\"stage\":\"stop-accepting\""), std::string::npos) << tl->raw;
  EXPECT_NE(tl->raw.find("\"proxy\":"), std::string::npos) << tl->raw;
  EXPECT_EQ(tl->raw.find("\"feed\":"), std::string::npos) << tl->raw;
  EXPECT_EQ(tl->removed, 0) << tl->raw;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::string after = nc.debug_state("node-a");
  auto done = find_timeline(after.substr(after.find("\"drains\"")), old_pod.ip);
  ASSERT_TRUE(done) << after;
  EXPECT_NE(done->raw.find("\"feed\":"), std::string::npos) << done->raw;
  EXPECT_GE(done->removed, resumed) << done->raw;
  EXPECT_FALSE(done->removal_forced) << done->raw;
  std::cout << "held " << resumed - marked << " ms while HAProxy was stopped; released "
            << returned - resumed << " ms after it was continued\n";
  nc.nginx("old-a1").signal(SIGTERM);
  nc.daemon("node-a").stop();
  nc.daemon("node-b").stop();
}

// The measure can fail: without a preStop, and with nginx sent SIGTERM (its fast stop) as soon
// as the removal was confirmed, the same rollout loses requests, and the test says how many.
// nginx without keepalive_time here: with it (1 s) nginx itself moves every keep-alive client
// to a new connection within a second, and whether one is still on the old pod when SIGTERM
// comes was luck (a clean-clone run once saw 0 lost); a client that stays, as most do, is
// what SIGTERM after removal cuts.
TEST_F(NginxDrainTest, WithoutAPrestopOrWithSigtermAfterRemovalWrkSeesFailures) {
  for (Mode mode : {Mode::kNoPrestop, Mode::kSigtermAfterRemoval}) {
    NginxCluster nc(false);
    ASSERT_EQ(nc.pki_error(), "");
    // 32 connections, not 8: a pod's connections are cut only if one is busy when nginx stops,
    // and with one or two per pod a whole rollout once lost nothing (all idle at each stop, each
    // reconnect landing on a live pod).
    auto r = roll(nc, mode, 14, false, 32);
    std::cout << (mode == Mode::kNoPrestop ? "no preStop" : "SIGTERM after removal") << ": wrk "
              << r.load.summary << "; " << r.load.failed << " failed\n";
    EXPECT_GT(r.load.failed, 0) << r.load.raw;
    EXPECT_GT(r.load.ok, 100) << r.load.raw;
  }
}

// bench/drain/nginx: every mode under wrk and h2load, one JSON line each ("BENCH {...}"), for
// bench/results/drain.md. Runs only with ENDPOINTD_DRAIN_BENCH=1.
TEST_F(NginxDrainTest, Bench) {
  const char* which = std::getenv("ENDPOINTD_DRAIN_BENCH");
  if (!which) GTEST_SKIP() << "ENDPOINTD_DRAIN_BENCH=direct|ingress|all runs it";
  std::vector<std::pair<Mode, bool>> runs;  // (mode, through HAProxy)
  if (std::string(which) != "ingress")
    for (Mode m : {Mode::kQuitFlag, Mode::kDrained, Mode::kSigtermAfterRemoval, Mode::kOldDefault,
                   Mode::kSleep, Mode::kNoPrestop})
      runs.emplace_back(m, false);
  if (std::string(which) != "direct")
    for (Mode m : {Mode::kQuitFlag, Mode::kSigtermAfterRemoval, Mode::kNoPrestop})
      runs.emplace_back(m, true);
  for (bool h2 : {false, true}) {
    for (auto [mode, ingress] : runs) {
      NginxCluster nc(h2, mode == Mode::kDrained ? 1000 : 0);
      ASSERT_EQ(nc.pki_error(), "");
      int per_pod = mode == Mode::kSleep ? 16 : mode == Mode::kOldDefault ? 8 : 2;
      int load_seconds = 6 + 6 * per_pod;
      auto r = roll(nc, mode, load_seconds, ingress);
      std::string release, forced = "0";
      int deadline_hits = 0;
      for (const auto& t : r.done) {
        release +=
            (release.empty() ? "" : ",") + std::to_string(t.prestop_returned_ms - t.marked_ms);
        if (auto it = r.timelines.find(t.pod); it != r.timelines.end() && it->second.drain_forced)
          ++deadline_hits;
      }
      std::cout << "BENCH {\"tool\":\"" << (h2 ? "h2load" : "wrk") << "\",\"path\":\""
                << (ingress ? "HAProxy" : "ClusterIP") << "\",\"mode\":\"" << name_of(mode)
                << "\",\"release_ms\":[" << release << "],\"failed\":" << r.load.failed
                << ",\"ok\":" << r.load.ok << ",\"deadline_hits\":" << deadline_hits
                << ",\"rollout_ms\":" << r.duration_ms << ",\"load_s\":" << load_seconds
                << ",\"summary\":\"" << r.load.summary << "\"}" << std::endl;
    }
  }
}

}  // namespace
}  // namespace endpointd::drain
