// The daemon end to end against the fake API server: synced state in /debug/state, a watch
// event reflected, and a malformed object counted while everything else stays.
#include <gtest/gtest.h>
#include <httplib.h>
#include <simdjson.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "daemon/daemon.h"
#include "tests/fakeapi/fake_api.h"

namespace endpointd::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string slice_json(const std::vector<std::string>& addrs) {
  std::string eps;
  for (const auto& a : addrs) {
    if (!eps.empty()) eps += ",";
    eps += R"({"addresses":[")" + a + R"("],"conditions":{"ready":true}})";
  }
  return R"({"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"demo","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","ports":[{"name":"http","port":8080}],"endpoints":[)" +
         eps + "]}";
}

class DaemonApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.ok()) << api_.error();
    api_.apply(
        R"({"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"demo"},"spec":{"clusterIP":"10.96.0.10","ports":[{"name":"http","port":80}]}})");
    api_.apply(
        R"({"apiVersion":"v1","kind":"Service","metadata":{"name":"api","namespace":"demo"},"spec":{"clusterIP":"10.96.0.11","ports":[{"name":"http","port":80}]}})");
    api_.apply(slice_json({"10.244.0.1", "10.244.0.2"}));
    api_.apply(R"({"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"}})");
    kubeconfig_ = api_.write_kubeconfig();
    ASSERT_FALSE(kubeconfig_.empty()) << "cannot write a kubeconfig under /tmp";
    Config cfg;
    cfg.kubeconfig = kubeconfig_;
    cfg.admin_listen = model::HostPort{"127.0.0.1", 0};
    cfg.health_listen = std::nullopt;
    cfg.node_name = "node-a";
    cfg.dataplane = Dataplane::kNone;
    cfg.drain_socket = kubeconfig_ + ".sock";
    cfg.drain_peer_listen = std::nullopt;  // no peer server: tests run side by side
    d_ = std::make_unique<Daemon>(cfg);
    auto st = d_->start();
    ASSERT_TRUE(st) << st.error();
    http_ = std::make_unique<httplib::Client>("127.0.0.1", d_->admin_port());
  }
  void TearDown() override {
    d_.reset();
    unlink(kubeconfig_.c_str());
    unlink((kubeconfig_ + ".sock").c_str());
  }
  // demo/<name>'s endpoint count in /debug/state; -1 when absent.
  int endpoints(const char* name) {
    auto r = http_->Get("/debug/state?section=services,sourceErrors");
    if (!r || r->status != 200) return -1;
    simdjson::dom::parser p;
    simdjson::dom::element root = p.parse(r->body);
    for (auto s : root["services"].get_array())
      if (std::string_view(s["name"].get_string()) == name)
        return static_cast<int>(s["endpoints"].get_array().size());
    return -1;
  }
  bool wait(const std::function<bool()>& cond) {
    auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline) {
      if (cond()) return true;
      std::this_thread::sleep_for(5ms);  // polling HTTP: nothing to await
    }
    return false;
  }

  fakeapi::FakeApiServer api_;
  std::string kubeconfig_;
  std::unique_ptr<Daemon> d_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(DaemonApiTest, SyncsThenFollowsWatchEvents) {
  ASSERT_TRUE(wait([&] { return endpoints("web") == 2; }));
  ASSERT_TRUE(wait([&] {
    auto r = http_->Get("/readyz");
    return r && r->status == 200;
  }));
  api_.apply(slice_json({"10.244.0.1", "10.244.0.2", "10.244.0.3"}));
  EXPECT_TRUE(wait([&] { return endpoints("web") == 3; }));
}

TEST_F(DaemonApiTest, MalformedObjectIsCountedAndNothingElseChanges) {
  ASSERT_TRUE(wait([&] { return endpoints("web") == 2; }));
  // The raw line goes to open watches only: wait for the daemon's four (Services,
  // EndpointSlices, Nodes, Pods), which it opens after its lists.
  ASSERT_TRUE(wait([&] { return api_.open_watches() >= 4; })) << api_.open_watches();
  // A watch event whose slice has an invalid address: refused, counted; the slice's last
  // good version and every other object stay.
  api_.send_raw_watch_line("endpointslices",
                           R"({"type":"MODIFIED","object":)" + slice_json({"10.244.0.999"}) + "}");
  ASSERT_TRUE(wait([&] {
    auto m = http_->Get("/metrics");
    return m && m->body.find("endpointd_decode_errors_total{kind=\"EndpointSlice\"} 1") !=
                    std::string::npos;
  }));
  EXPECT_EQ(endpoints("web"), 2);
  EXPECT_EQ(endpoints("api"), 0);
}

}  // namespace
}  // namespace endpointd::daemon
