// Three agents in one process against the fake API server, with peer identity as the chart
// deploys it: each agent's token from TokenRequest (as the kubelet's projected volume holds
// it), one server certificate shared by all, the issuer's keys fetched from the fake's
// /.well-known/openid-configuration and /openid/v1/jwks. The cluster watermark confirms a
// removal among them; an agent started with --drain-peer-insecure says so in /readyz and
// /metrics, and the agents with identity never take its reports (it stays unheard, excluded);
// issuer keys that cannot be fetched: every peer refused until they can.
// Peers on 127.1.212.x (loopback).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include "daemon/daemon.h"
#include "tests/fakeapi/fake_api.h"
#include "tests/support/test_certs.h"

namespace endpointd::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const char* const kNodes[] = {"node-a", "node-b", "node-c"};

std::string agent_ip(size_t i) {
  return "127.1.212." + std::to_string(i + 1);
}

std::string web_slice(bool terminating) {
  std::string c = terminating ? R"({"ready":false,"serving":true,"terminating":true})"
                              : R"({"ready":true,"serving":true,"terminating":false})";
  return R"({"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"demo","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","ports":[{"name":"http","port":8080}],"endpoints":[{"addresses":["10.244.0.1"],"nodeName":"node-a","conditions":)" +
         c +
         R"(,"targetRef":{"kind":"Pod","namespace":"demo","name":"web-1"}},{"addresses":["10.244.0.2"],"nodeName":"node-b","conditions":{"ready":true,"serving":true,"terminating":false}}]})";
}

uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, agent_ip(0).c_str(), &a.sin_addr);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

class DaemonIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.ok()) << api_.error();
    api_.apply(
        R"({"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"demo"},"spec":{"clusterIP":"10.96.0.10","ports":[{"name":"http","port":80}]}})");
    api_.apply(web_slice(false));
    for (size_t i = 0; i < 3; ++i)
      api_.apply(R"({"apiVersion":"v1","kind":"Node","metadata":{"name":")" +
                 std::string(kNodes[i]) +
                 R"("},"status":{"addresses":[{"type":"InternalIP","address":")" + agent_ip(i) +
                 R"("}]}})");
    kubeconfig_ = api_.write_kubeconfig();
    ASSERT_FALSE(kubeconfig_.empty());
    std::string tmpl = std::filesystem::temp_directory_path() / "endpointd-identity-XXXXXX";
    ASSERT_TRUE(mkdtemp(tmpl.data()));
    dir_ = tmpl;
    ASSERT_EQ(endpointd::testing::make_test_certs(dir_), "");
    // Each agent's token as the kubelet would request it: TokenRequest for the endpointd
    // ServiceAccount, bound to the agent's pod (the fake takes the node from ?node=).
    httplib::Client c("127.0.0.1", api_.port());
    for (const char* n : kNodes) {
      auto r = c.Post(
          std::string("/api/v1/namespaces/kube-system/serviceaccounts/endpointd/token?"
                      "node=") +
              n,
          R"({"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"audiences":["endpointd-peer"],"expirationSeconds":600,"boundObjectRef":{"kind":"Pod","apiVersion":"v1","name":"endpointd-)" +
              std::string(n) + R"("}}})",
          "application/json");
      ASSERT_TRUE(r && r->status == 201) << (r ? r->body : "no answer");
      simdjson::dom::parser p;
      simdjson::dom::element doc;
      std::string_view token;
      ASSERT_EQ(p.parse(r->body).get(doc), simdjson::SUCCESS);
      ASSERT_EQ(doc["status"]["token"].get(token), simdjson::SUCCESS);
      std::ofstream(dir_ + "/" + n + ".token") << token;
    }
  }
  void TearDown() override {
    daemons_.clear();
    unlink(kubeconfig_.c_str());
    for (const char* n : kNodes) unlink((kubeconfig_ + "." + n + ".sock").c_str());
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // The agents on one port (retried on another when one was taken meanwhile); `insecure`:
  // the agents that run the peer port in plaintext instead.
  void start_agents(const std::set<size_t>& insecure = {}) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      uint16_t port = free_port();
      ASSERT_NE(port, 0);
      auto st = start_on(port, insecure);
      if (st) return;
      daemons_.clear();
      http_.clear();
      ASSERT_NE(st.error().find("cannot listen for peers"), std::string::npos) << st.error();
    }
    FAIL() << "five peer ports taken between their choice and their use";
  }
  Status start_on(uint16_t port, const std::set<size_t>& insecure) {
    for (size_t i = 0; i < 3; ++i) {
      Config cfg;
      cfg.kubeconfig = kubeconfig_;
      cfg.admin_listen = model::HostPort{"127.0.0.1", 0};
      cfg.health_listen = std::nullopt;
      cfg.node_name = kNodes[i];
      cfg.dataplane = Dataplane::kNone;
      cfg.watch_pods = false;
      cfg.drain_socket = kubeconfig_ + "." + kNodes[i] + ".sock";
      cfg.drain_peer_listen = model::HostPort{agent_ip(i), port};
      cfg.drain_peer_port = port;
      cfg.drain_liveness = 2000ms;
      if (insecure.count(i)) {
        cfg.drain_peer_insecure = true;
      } else {
        cfg.drain_peer_token_file = dir_ + "/" + kNodes[i] + ".token";
        cfg.drain_peer_ca = dir_ + "/ca.crt";
        cfg.drain_peer_cert = dir_ + "/server.crt";
        cfg.drain_peer_key = dir_ + "/server.key";
      }
      auto d = std::make_unique<Daemon>(cfg);
      if (auto st = d->start(); !st) return Error{std::string(kNodes[i]) + ": " + st.error()};
      http_.push_back(std::make_unique<httplib::Client>("127.0.0.1", d->admin_port()));
      daemons_.push_back(std::move(d));
    }
    return {};
  }
  std::string get(size_t i, const std::string& path) {
    auto r = http_[i]->Get(path);
    for (int tries = 0; r && r->status == 503 && tries < 100; ++tries) {
      std::this_thread::sleep_for(10ms);
      r = http_[i]->Get(path);
    }
    return r ? r->body : std::string();
  }
  bool state(size_t i, simdjson::dom::parser& p, simdjson::dom::element& doc) {
    body_ = get(i, "/debug/state?section=drains,drainCluster");
    return p.parse(body_).get(doc) == simdjson::SUCCESS;
  }
  uint64_t cluster_watermark(size_t i) {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    uint64_t w = 0;
    if (!state(i, p, doc) || doc["drainCluster"]["cluster_watermark"].get(w) != simdjson::SUCCESS)
      return 0;
    return w;
  }
  std::vector<std::string> excluded(size_t i) {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    std::vector<std::string> out;
    simdjson::dom::array a;
    if (!state(i, p, doc) || doc["drainCluster"]["excluded"].get(a) != simdjson::SUCCESS)
      return out;
    for (auto e : a) {
      std::string_view s;
      if (e.get(s) == simdjson::SUCCESS) out.emplace_back(s);
    }
    return out;
  }
  // The value of the metric line starting with `series` (-1: absent).
  double metric(size_t i, const std::string& series) {
    std::string m = get(i, "/metrics");
    auto at = m.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(m.substr(at + series.size() + 2));
  }
  bool wait(const std::function<bool()>& cond, std::chrono::milliseconds limit = 15s) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (cond()) return true;
      std::this_thread::sleep_for(20ms);  // polling HTTP: nothing to await
    }
    return false;
  }

  fakeapi::FakeApiServer api_;
  std::string kubeconfig_, dir_, body_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::vector<std::unique_ptr<httplib::Client>> http_;
};

TEST_F(DaemonIdentityTest, TokensCarryTheWatermarkAndConfirmARemoval) {
  start_agents();
  for (size_t i = 0; i < 3; ++i)
    ASSERT_TRUE(wait([&] { return cluster_watermark(i) > 0; })) << kNodes[i] << ": " << body_;
  api_.apply(web_slice(true));
  ASSERT_TRUE(wait([&] {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (!state(0, p, doc)) return false;
    simdjson::dom::array drains;
    if (doc["drains"].get(drains) != simdjson::SUCCESS) return false;
    for (auto d : drains) {
      uint64_t removed = 0;
      if (d["timeline_unix_ms"]["removed"].get(removed) == simdjson::SUCCESS && removed > 0)
        return true;
    }
    return false;
  })) << body_;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(metric(i, "endpointd_drain_peer_insecure"), 0) << kNodes[i];
    EXPECT_GE(metric(i, "endpointd_drain_peer_jwks_fetches_total{result=\"ok\"}"), 1) << kNodes[i];
    EXPECT_TRUE(excluded(i).empty()) << kNodes[i] << ": " << body_;
  }
  // The keys came from the fake's discovery and JWKS documents.
  size_t disco = 0, jwks = 0;
  for (const auto& r : api_.requests()) {
    disco += r.path == "/.well-known/openid-configuration";
    jwks += r.path == "/openid/v1/jwks";
  }
  EXPECT_GE(disco, 3u);
  EXPECT_GE(jwks, 3u);
}

// node-c runs --drain-peer-insecure: it says so loudly, and node-a and node-b never take a
// report from it (no TLS, no token): it is excluded as silent, its node unknown, never counted
// as confirmed.
TEST_F(DaemonIdentityTest, AnInsecureAgentSaysSoAndIsNeverBelieved) {
  start_agents({2});
  std::string ready;
  ASSERT_TRUE(wait([&] {
    ready = get(2, "/readyz");
    return ready.rfind("ok", 0) == 0;
  })) << ready;
  EXPECT_NE(ready.find("PLAINTEXT and UNAUTHENTICATED"), std::string::npos) << ready;
  EXPECT_EQ(metric(2, "endpointd_drain_peer_insecure"), 1);
  EXPECT_EQ(get(0, "/readyz").find("PLAINTEXT"), std::string::npos);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(wait([&] {
      auto e = excluded(i);
      return std::find(e.begin(), e.end(), "node-c") != e.end();
    })) << kNodes[i]
        << ": " << body_;
  }
}

// The API server cannot serve the issuer's keys when the agents start: they start (and say so),
// refuse every peer (jwks_unavailable, counted in /metrics), and once the keys can be fetched
// again (at most one attempt per 10 s) take their peers and confirm.
TEST_F(DaemonIdentityTest, NoIssuerKeysNoPeersUntilTheyCanBeFetched) {
  api_.fail_issuer_keys(true);
  start_agents();
  for (size_t i = 0; i < 3; ++i)
    ASSERT_TRUE(wait([&] {
      return metric(i, "endpointd_drain_peer_refused_total{reason=\"jwks_unavailable\"}") >= 1;
    })) << kNodes[i];
  // Nobody is believed: node-a excludes both peers as silent (their nodes unknown).
  ASSERT_TRUE(wait([&] { return excluded(0).size() == 2; })) << body_;
  api_.fail_issuer_keys(false);
  // The next fetch (10 s after the last attempt at most) brings the keys: every peer readmitted.
  for (size_t i = 0; i < 3; ++i)
    ASSERT_TRUE(wait([&] { return excluded(i).empty() && cluster_watermark(i) > 0; }, 30s))
        << kNodes[i] << ": " << body_;
  // Some agent fetched in vain and then with success (each verifies on its own schedule).
  double errors = 0, ok = 0;
  for (size_t i = 0; i < 3; ++i) {
    errors += metric(i, "endpointd_drain_peer_jwks_fetches_total{result=\"error\"}");
    ok += metric(i, "endpointd_drain_peer_jwks_fetches_total{result=\"ok\"}");
  }
  EXPECT_GE(errors, 3);
  EXPECT_GE(ok, 1) << get(0, "/metrics");
}

}  // namespace
}  // namespace endpointd::daemon
