// The daemon end to end on a manifest directory: admin endpoints, an edit reflected in
// /debug/state, and a broken manifest that leaves the last good state in place.
#include "daemon/daemon.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <simdjson.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

namespace endpointd::daemon {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string web(int endpoints) {
  std::string s = R"(kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 8080}]}
---
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
)";
  for (int i = 1; i <= endpoints; ++i) s += "- addresses: [10.244.0." + std::to_string(i) + "]\n";
  return s;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endpointd-daemon-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ / "web.yaml") << web(2);
    std::ofstream(dir_ / "nodes.yaml") << "kind: Node\nmetadata: {name: node-a}\n";
    Config cfg;
    cfg.source_dir = dir_;
    cfg.admin_listen = model::HostPort{"127.0.0.1", 0};
    cfg.health_listen = model::HostPort{"127.0.0.1", 0};
    cfg.admin_token_file = token_file_;
    cfg.node_name = "node-a";
    cfg.dataplane = Dataplane::kNone;
    cfg.drain_socket = (dir_ / "drain.sock").string();
    cfg.drain_peer_listen = std::nullopt;  // no peer server: tests run side by side
    d_ = std::make_unique<Daemon>(cfg);
    auto st = d_->start();
    ASSERT_TRUE(st) << st.error();
    http_ = std::make_unique<httplib::Client>("127.0.0.1", d_->admin_port());
    if (!token_.empty()) http_->set_bearer_token_auth(token_);
  }
  void TearDown() override {
    d_.reset();
    fs::remove_all(dir_);
  }
  // The endpoint count of demo/web in /debug/state, -1 when absent.
  int web_endpoints(std::string* errors_json = nullptr) {
    auto r = http_->Get("/debug/state?section=services,sourceErrors");
    if (!r || r->status != 200) return -1;
    simdjson::dom::parser p;
    simdjson::dom::element root = p.parse(r->body);
    if (errors_json) *errors_json = simdjson::minify(root["sourceErrors"]);
    for (auto s : root["services"].get_array()) {
      if (std::string_view(s["name"].get_string()) == "web")
        return static_cast<int>(s["endpoints"].get_array().size());
    }
    return -1;
  }
  int wait_endpoints(int want, Clock::duration timeout) {
    auto deadline = Clock::now() + timeout;
    int n = -1;
    while (Clock::now() < deadline) {
      n = web_endpoints();
      if (n == want) return n;
      std::this_thread::sleep_for(2ms);  // polling an HTTP endpoint: nothing to await
    }
    return n;
  }

  fs::path dir_;
  std::string token_file_, token_;  // set by a subclass before SetUp
  std::unique_ptr<Daemon> d_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(DaemonTest, ProbesAndMetrics) {
  ASSERT_EQ(wait_endpoints(2, 5s), 2);
  auto ready = http_->Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  EXPECT_EQ(http_->Get("/healthz")->status, 200);
  EXPECT_EQ(http_->Get("/livez")->status, 200);
  auto m = http_->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("endpointd_snapshot_generation"), std::string::npos);
  EXPECT_NE(m->body.find("endpointd_event_to_snapshot_seconds_bucket"), std::string::npos);
  EXPECT_NE(m->body.find("process_resident_memory_bytes"), std::string::npos);
  EXPECT_NE(m->body.find("process_cpu_seconds_total"), std::string::npos);
  EXPECT_NE(m->body.find("endpointd_build_info{version=\""), std::string::npos);
}

TEST_F(DaemonTest, HealthListenerServesOnlyTheProbes) {
  ASSERT_EQ(wait_endpoints(2, 5s), 2);
  ASSERT_GT(d_->health_port(), 0);
  httplib::Client health("127.0.0.1", d_->health_port());
  EXPECT_EQ(health.Get("/livez")->status, 200);
  EXPECT_EQ(health.Get("/readyz")->status, 200);
  EXPECT_EQ(health.Get("/healthz")->status, 200);
  EXPECT_EQ(health.Get("/metrics")->status, 404);
  EXPECT_EQ(health.Get("/debug/state")->status, 404);
}

// KEP-3836: a node being deleted, or marked for deletion by the cluster autoscaler, fails
// /healthz (load balancers drain it) but not /livez; kube-proxy's JSON body either way.
TEST_F(DaemonTest, HealthzFailsForANodeMarkedForDeletionAndRecovers) {
  ASSERT_EQ(wait_endpoints(2, 5s), 2);
  httplib::Client health("127.0.0.1", d_->health_port());
  auto deadline = Clock::now() + 5s;
  while (health.Get("/readyz")->status != 200 && Clock::now() < deadline)
    std::this_thread::sleep_for(5ms);  // polling an HTTP endpoint: nothing to await
  auto ok = health.Get("/healthz");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Content-Type"), "application/json");
  simdjson::dom::parser p;
  simdjson::dom::element body = p.parse(ok->body);
  EXPECT_TRUE(body["nodeEligible"].get_bool().value());
  EXPECT_NE(std::string_view(body["lastUpdated"].get_string()), "0001-01-01 00:00:00 +0000 UTC");
  EXPECT_NE(std::string_view(body["currentTime"].get_string()).find(" +0000 UTC"),
            std::string_view::npos);

  auto wait_status = [&](const char* path, int want) {
    auto deadline = Clock::now() + 5s;
    int got = -1;
    while (Clock::now() < deadline) {
      auto r = health.Get(path);
      got = r ? r->status : -1;
      if (got == want) return got;
      std::this_thread::sleep_for(5ms);  // polling an HTTP endpoint: nothing to await
    }
    return got;
  };
  std::ofstream(dir_ / "nodes.yaml")
      << "kind: Node\nmetadata: {name: node-a}\n"
         "spec: {taints: [{key: ToBeDeletedByClusterAutoscaler, value: '1700000000', "
         "effect: NoSchedule}]}\n";
  ASSERT_EQ(wait_status("/healthz", 503), 503);
  auto bad = health.Get("/healthz");
  ASSERT_TRUE(bad);
  simdjson::dom::element b2 = p.parse(bad->body);
  EXPECT_FALSE(b2["nodeEligible"].get_bool().value());
  EXPECT_NE(std::string_view(b2["reason"].get_string()).find("ToBeDeletedByClusterAutoscaler"),
            std::string_view::npos);
  EXPECT_EQ(health.Get("/livez")->status, 200);  // the agent itself is fine

  std::ofstream(dir_ / "nodes.yaml") << "kind: Node\nmetadata: {name: node-a}\n";
  ASSERT_EQ(wait_status("/healthz", 200), 200);
  std::ofstream(dir_ / "nodes.yaml")
      << "kind: Node\nmetadata: {name: node-a, deletionTimestamp: '2026-01-01T00:00:00Z'}\n";
  ASSERT_EQ(wait_status("/healthz", 503), 503);
  auto m = http_->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("kubeproxy_proxy_healthz_total{code=\"503\"}"), std::string::npos);
  EXPECT_NE(m->body.find("kubeproxy_proxy_healthz_total{code=\"200\"}"), std::string::npos);
  EXPECT_NE(m->body.find("kubeproxy_proxy_livez_total{code=\"200\"}"), std::string::npos);
}

TEST_F(DaemonTest, DebugStateIsASummaryUnlessAskedForMore) {
  ASSERT_EQ(wait_endpoints(2, 5s), 2);
  simdjson::dom::parser p;
  auto summary = http_->Get("/debug/state");
  ASSERT_TRUE(summary && summary->status == 200);
  simdjson::dom::element root = p.parse(summary->body);
  EXPECT_EQ(uint64_t(root["counts"]["services"]), 1u);
  EXPECT_EQ(uint64_t(root["counts"]["endpoints"]), 2u);
  EXPECT_TRUE(root["services"].error()) << "the summary lists services: " << summary->body;
  EXPECT_FALSE(root["sinks"].error());
  EXPECT_FALSE(root["drains"].error());

  auto one = http_->Get("/debug/state?service=demo/web");
  ASSERT_TRUE(one && one->status == 200);
  root = p.parse(one->body);
  ASSERT_EQ(root["services"].get_array().size(), 1u);
  EXPECT_TRUE(root["sinks"].error());  // only what was asked for
  auto none = http_->Get("/debug/state?service=demo/nope");
  root = p.parse(none->body);
  EXPECT_EQ(root["services"].get_array().size(), 0u);

  auto all = http_->Get("/debug/state?section=all");
  root = p.parse(all->body);
  EXPECT_EQ(root["services"].get_array().size(), 1u);
  EXPECT_EQ(root["nodes"].get_array().size(), 1u);

  auto bad = http_->Get("/debug/state?section=secrets");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("unknown section \"secrets\""), std::string::npos) << bad->body;
}

// The attack on the liveness probe: connections that never send a request, and slowloris
// connections that send a request head a byte at a time, on the probes' listener. The probes
// still answer at once, and the agent's thread count does not follow the connections.
TEST_F(DaemonTest, IdleAndSlowClientsDoNotDelayTheProbes) {
  ASSERT_EQ(wait_endpoints(2, 5s), 2);
  auto threads = [] {
    size_t n = 0;
    for ([[maybe_unused]] auto& e : fs::directory_iterator("/proc/self/task")) ++n;
    return n;
  };
  size_t threads_before = threads();
  auto dial = [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(d_->health_port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  std::vector<int> idle, slow;
  for (int i = 0; i < 200; ++i) idle.push_back(dial());  // the per-address cap is 256
  for (int i = 0; i < 50; ++i) {
    slow.push_back(dial());
    [[maybe_unused]] auto n =
        ::send(slow.back(), "GET /livez HTTP/1.1\r\nHost: x", 29, MSG_NOSIGNAL);
  }
  double worst_ms = 0;
  httplib::Client health("127.0.0.1", d_->health_port());
  for (int round = 0; round < 5; ++round) {
    for (int fd : slow) [[maybe_unused]] auto n = ::send(fd, "x", 1, MSG_NOSIGNAL);
    auto t0 = Clock::now();
    auto r = health.Get("/livez");
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    worst_ms = std::max(worst_ms, ms);
    ASSERT_TRUE(r) << "round " << round;
    EXPECT_EQ(r->status, 200);
    std::this_thread::sleep_for(200ms);
  }
  size_t threads_during = threads();
  for (int fd : idle) ::close(fd);
  for (int fd : slow) ::close(fd);
  RecordProperty("livez_worst_ms", std::to_string(worst_ms));
  EXPECT_LT(worst_ms, 1000.0);
  EXPECT_LE(threads_during, threads_before + 2) << "threads followed the connections";
}

TEST_F(DaemonTest, EditedManifestReflectedWithin100ms) {
  ASSERT_EQ(wait_endpoints(2, 5s), 2);
  auto t0 = Clock::now();
  std::ofstream(dir_ / "web.yaml", std::ios::trunc) << web(3);
  ASSERT_EQ(wait_endpoints(3, 5s), 3);
  auto ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  RecordProperty("reflect_ms", std::to_string(ms));
  EXPECT_LT(ms, 100.0);
}

TEST_F(DaemonTest, BrokenManifestKeepsLastGoodStateAndSaysWhy) {
  ASSERT_EQ(wait_endpoints(2, 5s), 2);
  std::ofstream(dir_ / "web.yaml", std::ios::trunc) << "kind: Service\nmetadata: {name: web\n";
  std::string errors;
  auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    ASSERT_EQ(web_endpoints(&errors), 2);  // never lost, not for a moment
    if (errors != "[]") break;
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_NE(errors.find("web.yaml"), std::string::npos) << errors;
  EXPECT_NE(errors.find("YAML"), std::string::npos) << errors;
}

// With --admin-token-file, /metrics and /debug/state need the token; the probes do not.
class DaemonTokenTest : public DaemonTest {
 protected:
  void SetUp() override {
    token_file_ = "/tmp/endpointd-token-" + std::to_string(::getpid());
    token_ = "s3cret-token";
    std::ofstream(token_file_) << token_ << "\n";
    DaemonTest::SetUp();
  }
  void TearDown() override {
    DaemonTest::TearDown();
    fs::remove(token_file_);
  }
};

TEST_F(DaemonTokenTest, MetricsAndStateNeedTheTokenProbesDoNot) {
  ASSERT_EQ(wait_endpoints(2, 5s), 2);  // with the token
  httplib::Client anon("127.0.0.1", d_->admin_port());
  EXPECT_EQ(anon.Get("/metrics")->status, 401);
  EXPECT_EQ(anon.Get("/debug/state")->status, 401);
  EXPECT_EQ(anon.Get("/livez")->status, 200);
  httplib::Client wrong("127.0.0.1", d_->admin_port());
  wrong.set_bearer_token_auth("s3cret-tokem");
  EXPECT_EQ(wrong.Get("/metrics")->status, 401);
  auto m = http_->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  // The refusals are counted.
  EXPECT_NE(
      m->body.find(
          "endpointd_http_connections_dropped_total{reason=\"unauthorized\",server=\"admin\"} 3"),
      std::string::npos)
      << m->body.substr(0, 400);
}

}  // namespace
}  // namespace endpointd::daemon
