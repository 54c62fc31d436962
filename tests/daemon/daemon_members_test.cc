// Three agents in one process against the fake API server, with the drain's members taken
// from the agents' own Service (--drain-members-service): each watches only its own Node, the
// cluster watermark confirms a removal among them, and a node that leaves the Service stays a
// member for the liveness deadline before it goes. Peers on 127.1.211.x (loopback).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include "daemon/daemon.h"
#include "tests/fakeapi/fake_api.h"

namespace endpointd::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kLiveness = 3000ms;
const char* const kNodes[] = {"node-a", "node-b", "node-c"};

std::string agent_ip(size_t i) {
  return "127.1.211." + std::to_string(i + 1);
}

// The agents' Service's slice: one endpoint per node named, at its agent's address.
std::string agents_slice(const std::vector<size_t>& agents) {
  std::string eps;
  for (size_t i : agents) {
    if (!eps.empty()) eps += ",";
    eps += R"({"addresses":[")" + agent_ip(i) + R"("],"nodeName":")" + kNodes[i] +
           R"(","conditions":{"ready":true}})";
  }
  return R"({"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"endpointd-1","namespace":"kube-system","labels":{"kubernetes.io/service-name":"endpointd"}},"addressType":"IPv4","ports":[{"name":"peer","port":9465}],"endpoints":[)" +
         eps + "]}";
}

// web-1 on node-a (terminating or not) and web-2 on node-b, ready: web-1 terminating is out of
// every selection (alone, it would be the terminating fallback and routable everywhere).
std::string web_slice(bool terminating) {
  std::string c = terminating ? R"({"ready":false,"serving":true,"terminating":true})"
                              : R"({"ready":true,"serving":true,"terminating":false})";
  return R"({"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"demo","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","ports":[{"name":"http","port":8080}],"endpoints":[{"addresses":["10.244.0.1"],"nodeName":"node-a","conditions":)" +
         c +
         R"(,"targetRef":{"kind":"Pod","namespace":"demo","name":"web-1"}},{"addresses":["10.244.0.2"],"nodeName":"node-b","conditions":{"ready":true,"serving":true,"terminating":false}}]})";
}

// A port free on the first agent's address: every agent listens on the same one.
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

class DaemonMembersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.ok()) << api_.error();
    api_.apply(
        R"({"apiVersion":"v1","kind":"Service","metadata":{"name":"endpointd","namespace":"kube-system"},"spec":{"clusterIP":"None","ports":[{"name":"peer","port":9465}]}})");
    api_.apply(agents_slice({0, 1, 2}));
    api_.apply(
        R"({"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"demo"},"spec":{"clusterIP":"10.96.0.10","ports":[{"name":"http","port":80}]}})");
    api_.apply(web_slice(false));
    // Four Nodes, one without an agent endpoint: the Node list is not the member list.
    for (const char* n : {"node-a", "node-b", "node-c", "node-x"})
      api_.apply(R"({"apiVersion":"v1","kind":"Node","metadata":{"name":")" + std::string(n) +
                 R"("},"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.1"}]}})");
    kubeconfig_ = api_.write_kubeconfig();
    ASSERT_FALSE(kubeconfig_.empty()) << "cannot write a kubeconfig under /tmp";
    // The three agents share one peer port, found free on the first address and then given
    // up: another process may take it (on any of the three) before an agent binds it. Then
    // all three start again on another.
    for (int attempt = 0; attempt < 5; ++attempt) {
      uint16_t port = free_port();
      ASSERT_NE(port, 0) << "no port free on " << agent_ip(0);
      auto st = start_agents(port);
      if (st) return;
      daemons_.clear();
      http_.clear();
      ASSERT_NE(st.error().find("cannot listen for peers"), std::string::npos) << st.error();
    }
    FAIL() << "five peer ports taken between their choice and their use";
  }
  // The three agents on `port`; the first error if one does not start.
  Status start_agents(uint16_t port) {
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
      cfg.drain_peer_insecure = true;
      cfg.drain_liveness = kLiveness;
      cfg.drain_members_service = model::ObjectKey{"kube-system", "endpointd"};
      auto d = std::make_unique<Daemon>(cfg);
      if (auto st = d->start(); !st) return Error{std::string(kNodes[i]) + ": " + st.error()};
      http_.push_back(std::make_unique<httplib::Client>("127.0.0.1", d->admin_port()));
      daemons_.push_back(std::move(d));
    }
    return {};
  }
  void TearDown() override {
    daemons_.clear();
    unlink(kubeconfig_.c_str());
    for (const char* n : kNodes) unlink((kubeconfig_ + "." + n + ".sock").c_str());
  }
  // Agent i's /debug/state, parsed into `doc` (false: no answer).
  bool state(size_t i, simdjson::dom::parser& p, simdjson::dom::element& doc) {
    // /debug/state serves one request at a time: the one before may still be finishing (503).
    auto r = http_[i]->Get("/debug/state?section=drains,drainCluster,services");
    for (int tries = 0; r && r->status == 503 && tries < 100; ++tries) {
      std::this_thread::sleep_for(10ms);
      r = http_[i]->Get("/debug/state?section=drains,drainCluster,services");
    }
    if (!r || r->status != 200) return false;
    body_ = r->body;
    return p.parse(body_).get(doc) == simdjson::SUCCESS;
  }
  int64_t members(size_t i) {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (!state(i, p, doc)) return -1;
    int64_t n = -1;
    if (doc["drainCluster"]["members"].get(n) != simdjson::SUCCESS) return -1;
    return n;
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
  std::string kubeconfig_;
  std::string body_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::vector<std::unique_ptr<httplib::Client>> http_;
};

TEST_F(DaemonMembersTest, MembersAreNodesWithAnAgentAndALeaverStaysAMember) {
  // Every agent: three members (not node-x, a Node without an agent), the watermark running.
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(kNodes[i]);
    ASSERT_TRUE(wait([&] {
      simdjson::dom::parser p;
      simdjson::dom::element doc;
      if (!state(i, p, doc)) return false;
      int64_t n = 0;
      uint64_t w = 0;
      bool member = false;
      auto c = doc["drainCluster"];
      return c["members"].get(n) == simdjson::SUCCESS && n == 3 &&
             c["member"].get(member) == simdjson::SUCCESS && member &&
             c["cluster_watermark"].get(w) == simdjson::SUCCESS && w > 0;
    })) << body_;
  }
  // Every agent watches every Node: membership is every node whose kernel may hold rules, and
  // a Node's deletion is what ends it (drain/members.h).
  for (size_t i = 0; i < 3; ++i) {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    ASSERT_TRUE(state(i, p, doc));
    int64_t nodes = -1;
    ASSERT_EQ(doc["counts"]["nodes"].get(nodes), simdjson::SUCCESS) << body_;
    EXPECT_EQ(nodes, 4) << kNodes[i];
  }

  // web-1 on node-a terminates: its drain there is confirmed removed by the three agents.
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

  // node-c's agent leaves the Service (its pod deleted; this one still runs): node-a sees the
  // Service shrink at once, and keeps node-c a member for the liveness deadline.
  api_.apply(agents_slice({0, 1}));
  auto service_endpoints = [&](size_t i) {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (!state(i, p, doc)) return int64_t{-1};
    simdjson::dom::array services;
    if (doc["services"].get(services) != simdjson::SUCCESS) return int64_t{-1};
    for (auto s : services) {
      std::string_view name;
      simdjson::dom::array eps;
      if (s["name"].get(name) == simdjson::SUCCESS && name == "endpointd" &&
          s["endpoints"].get(eps) == simdjson::SUCCESS)
        return static_cast<int64_t>(eps.size());
    }
    return int64_t{-1};
  };
  ASSERT_TRUE(wait([&] { return service_endpoints(0) == 2; })) << body_;
  // node-c stays a member: its kernel keeps the rules its agent left. /debug/state names it
  // among the departed (unknown until its agent is back or its Node is deleted).
  ASSERT_TRUE(wait([&] {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (!state(0, p, doc)) return false;
    simdjson::dom::array departed;
    std::string_view n;
    return doc["drainCluster"]["departed"].get(departed) == simdjson::SUCCESS &&
           departed.size() == 1 && departed.at(0).get(n) == simdjson::SUCCESS && n == "node-c";
  })) << body_;
  EXPECT_EQ(members(0), 3) << body_;
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ASSERT_TRUE(state(0, p, doc));
  std::string_view from;
  ASSERT_EQ(doc["drainCluster"]["members_from"].get(from), simdjson::SUCCESS) << body_;
  EXPECT_EQ(from, "nodes with an agent in service kube-system/endpointd");
}

}  // namespace
}  // namespace endpointd::daemon
