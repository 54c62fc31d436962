// Events on pods and the cluster programming latency, end to end: `endpointd run` on two nodes
// (network namespaces, nftables, peers over mutual TLS) against the fake API server (in the
// client namespace, 192.168.77.100), and a Deployment's rolling updates of service web as the
// kubelet and the EndpointSlice controller drive them: a new pod turns ready, an old one is
// marked deleted, its endpoint turns terminating, its preStop (`endpointd prestop` in the pod's
// namespace) returns once the agent releases it, and it leaves the slice and the API.
//
// What an operator sees is read as an operator reads it: `kubectl get events --field-selector
// involvedObject.name=web-2` against the fake API server (which lists its events.k8s.io Events
// as core/v1 Events). Without kubectl (scripts/setup links it into /opt/endpointd-tools/bin),
// the test sends the request kubectl sends and says so.
#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/drain/scenario.h"
#include "tests/fakeapi/fake_api.h"
#include "tests/netns/cluster.h"
#include "tests/support/test_certs.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using testing::prestop_command;
namespace fs = std::filesystem;

const std::string kAdmin = "http://127.0.0.1:10249";

// node-a runs web-1, web-2 and web-4 (the rollouts' new pods), node-b web-3.
netns::ClusterSpec spec() {
  netns::ClusterSpec s;
  s.nodes.push_back(
      {"node-a",
       "192.168.77.2",
       "10.244.1.0/24",
       "10.244.1.1",
       {{"web-1", "10.244.1.10"}, {"web-2", "10.244.1.11"}, {"web-4", "10.244.1.12"}}});
  s.nodes.push_back(
      {"node-b", "192.168.77.3", "10.244.2.0/24", "10.244.2.1", {{"web-3", "10.244.2.10"}}});
  return s;
}

// RFC 3339 with microseconds, UTC: how the EndpointSlice controller writes a trigger time.
std::string micro_time(std::chrono::system_clock::time_point t) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  time_t secs = static_cast<time_t>(us / 1000000);
  tm parts{};
  gmtime_r(&secs, &parts);
  char b[48];
  size_t n = std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%S", &parts);
  std::snprintf(b + n, sizeof b - n, ".%06lldZ", static_cast<long long>(us % 1000000));
  return b;
}

struct Pod {
  std::string node, ip, uid;
  bool ready = false;        // the endpoint's ready condition (a new pod starts not ready)
  bool deleting = false;     // deletionTimestamp in the API
  bool terminating = false;  // the endpoint terminating in the slice
};

class DaemonEventsTest : public testing::RootNetnsTest {
 protected:
  void SetUp() override {
    testing::RootNetnsTest::SetUp();
    if (IsSkipped()) return;
    cluster_ = std::make_unique<netns::Cluster>(spec());
    // The fake API server listens in the client namespace, which both nodes reach.
    fakeapi::Options o;
    o.host = cluster_->spec().client_ip;
    api_ = cluster_->client().run([&] { return std::make_unique<fakeapi::FakeApiServer>(o); });
    ASSERT_TRUE(api_->ok()) << api_->error();
    kubeconfig_ = api_->write_kubeconfig();
    ASSERT_FALSE(kubeconfig_.empty());
    pki_ = netns::scratch_dir() + "/daemon-events-pki";
    fs::remove_all(pki_);
    fs::create_directories(pki_);
    ASSERT_EQ(endpointd::testing::make_node_certs(pki_, {"node-a", "node-b"}), "");
    for (const auto& n : cluster_->spec().nodes)
      api_->apply(R"({"apiVersion":"v1","kind":"Node","metadata":{"name":")" + n.name +
                  R"("},"status":{"addresses":[{"type":"InternalIP","address":")" + n.ip +
                  R"("}]}})");
    api_->apply(
        R"({"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"demo","uid":"5f1c0a4e-0000-4000-8000-000000000001"},"spec":{"type":"ClusterIP","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10"],"selector":{"app":"web"},"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}]}})");
    pods_["web-1"] = {"node-a", "10.244.1.10", "7a0e0000-0000-4000-8000-000000000011", true};
    pods_["web-3"] = {"node-b", "10.244.2.10", "7a0e0000-0000-4000-8000-000000000013", true};
    write();
  }
  void TearDown() override {
    // The agents and pods go with their namespaces (the cluster), the API server first.
    api_.reset();
    cluster_.reset();
    if (!kubeconfig_.empty()) unlink(kubeconfig_.c_str());
  }

  std::string socket_of(const std::string& node) const {
    return netns::scratch_dir() + "/events-drain-" + node + ".sock";
  }

  // The pods and the slice in the API as pods_ says; the slice carries the trigger time of this
  // write, as the EndpointSlice controller stamps the change it makes.
  void write() {
    std::string eps;
    for (const auto& [name, p] : pods_) {
      api_->apply(
          R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":")" + name +
          R"(","namespace":"demo","uid":")" + p.uid + R"(","labels":{"app":"web"})" +
          (p.deleting
               ? R"(,"deletionTimestamp":"2030-01-01T00:00:00Z","deletionGracePeriodSeconds":20)"
               : "") +
          R"(},"spec":{"nodeName":")" + p.node +
          R"(","terminationGracePeriodSeconds":20},"status":{"phase":"Running","podIP":")" + p.ip +
          R"(","podIPs":[{"ip":")" + p.ip + R"("}]}})");
      bool ready = p.ready && !p.terminating;
      eps += std::string(eps.empty() ? "" : ",") + R"({"addresses":[")" + p.ip +
             R"("],"nodeName":")" + p.node + R"(","conditions":{"ready":)" +
             (ready ? "true" : "false") + R"(,"serving":)" + (p.ready ? "true" : "false") +
             R"(,"terminating":)" + (p.terminating ? "true" : "false") +
             R"(},"targetRef":{"kind":"Pod","namespace":"demo","name":")" + name + R"(","uid":")" +
             p.uid + R"("}})";
    }
    api_->apply(
        R"({"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-abc12","namespace":"demo","labels":{"kubernetes.io/service-name":"web"},"annotations":{"endpoints.kubernetes.io/last-change-trigger-time":")" +
        micro_time(std::chrono::system_clock::now()) +
        R"("}},"addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],"endpoints":[)" +
        eps + "]}");
  }
  // The pod leaves the slice and the API (its process exited).
  void remove(const std::string& pod) {
    pods_.erase(pod);
    api_->remove("pods", "demo", pod);
    write();
  }

  void start_daemon(const std::string& node) {
    std::vector<std::string> argv = {ENDPOINTD_BIN_PATH,
                                     "run",
                                     "--kubeconfig",
                                     kubeconfig_,
                                     "--dataplane",
                                     "nftables",
                                     "--node-name",
                                     node,
                                     "--cluster-cidr",
                                     "10.244.0.0/16",
                                     "--admin-listen",
                                     "127.0.0.1:10249",
                                     "--drain-socket",
                                     socket_of(node),
                                     "--drain-peer-timeout-ms",
                                     "3000",
                                     "--drain-peer-ca",
                                     pki_ + "/ca.crt",
                                     "--drain-peer-cert",
                                     pki_ + "/" + node + ".crt",
                                     "--drain-peer-key",
                                     pki_ + "/" + node + ".key",
                                     "--log-level",
                                     "debug"};
    daemons_[node] = &cluster_->node(node).spawn(argv, "endpointd-events-" + node + ".log");
  }
  std::string admin(const std::string& node, const std::string& path) {
    return cluster_->node(node).exec({"curl", "-fs", "--max-time", "2", kAdmin + path}).output;
  }
  // Polls what only HTTP can show, until `done` or the deadline.
  static bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (done()) return true;
      std::this_thread::sleep_for(50ms);
    }
    return done();
  }
  // The node's cluster watermark (0: none yet).
  uint64_t cluster_watermark(const std::string& node) {
    std::string s = admin(node, "/debug/state?section=drainCluster");
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    uint64_t w = 0;
    if (p.parse(s).get(doc) != simdjson::SUCCESS ||
        doc["drainCluster"]["cluster_watermark"].get(w) != simdjson::SUCCESS)
      return 0;
    return w;
  }
  // endpointd_cluster_programming_duration_seconds_count on the node (-1: not scraped).
  int64_t programmed(const std::string& node) {
    std::string m = admin(node, "/metrics");
    const std::string key = "endpointd_cluster_programming_duration_seconds_count ";
    auto at = m.find("\n" + key);
    if (at == std::string::npos) return -1;
    return std::stoll(m.substr(at + 1 + key.size()));
  }
  // The node's /metrics lines that start with one of `prefixes`.
  std::string metric_lines(const std::string& node, const std::vector<std::string>& prefixes) {
    std::istringstream m(admin(node, "/metrics"));
    std::string line, out;
    while (std::getline(m, line))
      for (const auto& p : prefixes)
        if (line.rfind(p, 0) == 0) out += line + "\n";
    return out;
  }
  // Whether the API holds an event of `reason` on `pod` (whose note has `note_part`).
  bool has_event(const std::string& pod, const std::string& reason,
                 const std::string& note_part = "") {
    for (const auto& e : api_->events("demo"))
      if (e.find(R"("reason":")" + reason + "\"") != std::string::npos &&
          e.find(R"("regarding":{"apiVersion":"v1","kind":"Pod","namespace":"demo","name":")" +
                 pod + "\"") != std::string::npos &&
          e.find(note_part) != std::string::npos)
        return true;
    return false;
  }
  std::string all_events() {
    std::string out;
    for (const auto& e : api_->events()) out += e + "\n";
    return out;
  }

  // A new pod of the rollout: created not ready, then ready (its own slice change).
  void start_pod(const std::string& name, const std::string& node, const std::string& ip,
                 const std::string& uid) {
    pods_[name] = {node, ip, uid, false};
    write();
    pods_[name].ready = true;
    write();
  }
  // The kubelet's termination: the pod marked deleted, its endpoint terminating, the preStop
  // (`endpointd prestop` in the pod's namespace) until the agent releases it; then the pod
  // leaves the slice and the API. Returns the preStop's exit code and output.
  netns::CommandResult terminate(const std::string& pod) {
    pods_[pod].deleting = true;
    write();
    auto prestop = std::async(std::launch::async, [&, node = pods_[pod].node] {
      return cluster_->pod(pod).exec(
          prestop_command(ENDPOINTD_BIN_PATH, socket_of(node), {"--timeout", "25s"}));
    });
    pods_[pod].terminating = true;
    write();
    auto r = prestop.get();
    remove(pod);
    return r;
  }

  // `kubectl get events -n demo --field-selector involvedObject.name=POD` in the client
  // namespace; without kubectl, the request kubectl sends (a Table of core/v1 Events), printed
  // as kubectl prints its columns. The reasons, in the order listed, and the whole text.
  std::pair<std::vector<std::string>, std::string> kubectl_events(const std::string& pod) {
    std::string kubectl = kubectl_path();
    std::string url = api_->url() +
                      "/api/v1/namespaces/demo/events?fieldSelector=" + "involvedObject.name%3D" +
                      pod + "&limit=500";
    std::string text;
    std::vector<std::string> reasons;
    if (!kubectl.empty()) {
      std::string cache = netns::scratch_dir() + "/kubectl-cache";
      auto r = cluster_->client().exec({kubectl, "--kubeconfig", kubeconfig_, "--cache-dir", cache,
                                        "get", "events", "-n", "demo", "--field-selector",
                                        "involvedObject.name=" + pod});
      text = r.output;
      EXPECT_EQ(r.exit_code, 0) << text;
      // LAST SEEN  TYPE  REASON  OBJECT  MESSAGE
      std::istringstream lines(text);
      std::string line;
      std::getline(lines, line);
      EXPECT_NE(line.find("REASON"), std::string::npos) << text;
      while (std::getline(lines, line)) {
        std::istringstream words(line);
        std::string last, type, reason;
        words >> last >> type >> reason;
        if (!reason.empty()) reasons.push_back(reason);
      }
      return {reasons, text};
    }
    std::cout << "kubectl not found (scripts/setup links it into "
                 "/opt/endpointd-tools/bin): sending kubectl's request with curl\n";
    auto r = cluster_->client().exec(
        {"curl", "-fsS", "--max-time", "5", "-H",
         "Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json", url});
    text = r.output;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    simdjson::dom::array rows;
    if (p.parse(text).get(doc) != simdjson::SUCCESS || doc["rows"].get(rows) != simdjson::SUCCESS) {
      ADD_FAILURE() << "not a Table: " << text;
      return {reasons, text};
    }
    for (simdjson::dom::element row : rows) {
      std::string_view reason;
      if (row["cells"].at(2).get(reason) == simdjson::SUCCESS) reasons.emplace_back(reason);
    }
    return {reasons, text};
  }
  static std::string kubectl_path() {
    if (const char* k = std::getenv("KUBECTL"); k && *k) return k;
    const char* tools = std::getenv("ENDPOINTD_TOOLS");
    std::string t = std::string(tools && *tools ? tools : "/opt/endpointd-tools") + "/bin/kubectl";
    if (access(t.c_str(), X_OK) == 0) return t;
    return "";
  }

  std::unique_ptr<netns::Cluster> cluster_;
  std::unique_ptr<fakeapi::FakeApiServer> api_;  // destroyed before the cluster
  std::string kubeconfig_, pki_;
  std::map<std::string, Pod> pods_;
  std::map<std::string, netns::Process*> daemons_;
};

// Two rollouts of web's Deployment: web-2 replaces web-1, then web-4 replaces web-2. web-2's
// events read by kubectl: Propagated (once both nodes route it), DrainRemoved, DrainReleased,
// in that order. Then node-b's agent stops and web-4 is scaled away: its release is
// unconfirmed, and the Warning names node-b. The cluster programming latency is counted on
// node-a, whose endpoints changed, once per change, and not on node-b.
TEST_F(DaemonEventsTest, RollingUpdateEventsAsKubectlShowsThemAndUnconfirmedNamesTheStoppedNode) {
  start_daemon("node-a");
  start_daemon("node-b");
  for (const char* node : {"node-a", "node-b"})
    ASSERT_TRUE(eventually(
        [&] {
          return cluster_->node(node)
              .exec({"curl", "-fs", "--max-time", "1", kAdmin + "/readyz"})
              .ok();
        },
        15s))
        << node << " not ready: " << daemons_.at(node)->log();
  // Both agents in the drain's cluster, the watermark covering the API's state.
  uint64_t rv = api_->resource_version();
  ASSERT_TRUE(eventually([&] { return cluster_watermark("node-a") >= rv; }, 15s))
      << admin("node-a", "/debug/state?section=drainCluster");
  EXPECT_EQ(programmed("node-a"), 0);

  // Rollout 1: web-2 (node-a) turns ready; web-1 goes.
  start_pod("web-2", "node-a", "10.244.1.11", "7a0e0000-0000-4000-8000-000000000012");
  ASSERT_TRUE(
      eventually([&] { return has_event("web-2", "Propagated", "routable on 2/2 nodes"); }, 15s))
      << all_events() << admin("node-a", "/debug/state?section=drainCluster") << "\n"
      << admin("node-a", "/debug/state?section=services") << "\n"
      << metric_lines("node-a", {"endpointd_events_total", "endpointd_cluster_programming"})
      << admin("node-b", "/debug/state?section=drainCluster") << "\n"
      << daemons_.at("node-a")->log() << daemons_.at("node-b")->log();
  auto r = terminate("web-1");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // Rollout 2: web-4 (node-a) turns ready; web-2 goes.
  start_pod("web-4", "node-a", "10.244.1.12", "7a0e0000-0000-4000-8000-000000000014");
  ASSERT_TRUE(eventually([&] { return has_event("web-4", "Propagated"); }, 15s)) << all_events();
  r = terminate("web-2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(eventually([&] { return has_event("web-2", "DrainReleased"); }, 10s)) << all_events();

  auto [reasons, text] = kubectl_events("web-2");
  std::cout << "kubectl get events --field-selector involvedObject.name=web-2:\n" << text;
  EXPECT_EQ(reasons, (std::vector<std::string>{"Propagated", "DrainRemoved", "DrainReleased"}))
      << text;
  EXPECT_EQ(text.find("web-4"), std::string::npos) << "another pod's events listed:\n" << text;
  EXPECT_NE(text.find("pod/web-2"), std::string::npos) << text;
  EXPECT_NE(text.find("removed from every consumer on 2 nodes"), std::string::npos) << text;
  EXPECT_NE(text.find(": confirmed"), std::string::npos) << text;

  // Four changes of node-a's endpoints, each with a trigger time: web-2 and web-4 ready, web-1
  // and web-2 no longer ready. node-b's endpoint never changed: it measures nothing.
  EXPECT_TRUE(eventually([&] { return programmed("node-a") == 4; }, 5s))
      << "count " << programmed("node-a") << "\n"
      << admin("node-a", "/metrics");
  EXPECT_EQ(programmed("node-b"), 0);

  // node-b's agent stops (its rules stay in its kernel): web-4's release cannot be confirmed.
  daemons_.at("node-b")->stop();
  r = terminate("web-4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(eventually([&] { return has_event("web-4", "DrainUnconfirmed", "node-b"); }, 10s))
      << all_events() << daemons_.at("node-a")->log();
  auto [unconfirmed, utext] = kubectl_events("web-4");
  std::cout << "kubectl get events --field-selector involvedObject.name=web-4:\n" << utext;
  ASSERT_FALSE(unconfirmed.empty()) << utext;
  EXPECT_EQ(unconfirmed.back(), "DrainUnconfirmed") << utext;
  EXPECT_NE(utext.find("Warning"), std::string::npos) << utext;
  EXPECT_NE(utext.find("without confirmation from node-b"), std::string::npos) << utext;
  EXPECT_EQ(std::count(unconfirmed.begin(), unconfirmed.end(), "DrainRemoved"), 0) << utext;
}

}  // namespace
}  // namespace endpointd::drain
