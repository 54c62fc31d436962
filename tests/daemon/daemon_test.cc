// The daemon end to end on a manifest directory: admin endpoints, an edit reflected in
// /debug/state, and a broken manifest that leaves the last good state in place.
#include "daemon/daemon.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <simdjson.h>

#include <chrono>
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
    cfg.node_name = "node-a";
    cfg.dataplane = Dataplane::kNone;
    cfg.drain_socket = (dir_ / "drain.sock").string();
    cfg.drain_peer_listen = std::nullopt;  // no peer server: tests run side by side
    d_ = std::make_unique<Daemon>(cfg);
    auto st = d_->start();
    ASSERT_TRUE(st) << st.error();
    http_ = std::make_unique<httplib::Client>("127.0.0.1", d_->admin_port());
  }
  void TearDown() override {
    d_.reset();
    fs::remove_all(dir_);
  }
  // The endpoint count of demo/web in /debug/state, -1 when absent.
  int web_endpoints(std::string* errors_json = nullptr) {
    auto r = http_->Get("/debug/state");
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

}  // namespace
}  // namespace endpointd::daemon
