// healthCheckNodePort servers on loopback: targets from snapshots, 200/503 with kube-proxy's
// body, listeners opened and closed as services come and go, bind failures counted.
#include "proxy/healthcheck.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

namespace endpointd::proxy {
namespace {

model::IpAddr ip(const char* s) {
  return *model::IpAddr::parse(s);
}

model::MergedEndpoint endpoint(const char* addr, const char* node, bool ready = true,
                               bool terminating = false) {
  model::MergedEndpoint e;
  e.address = ip(addr);
  e.node_name = node;
  e.conditions.ready = ready;
  e.conditions.serving = true;
  e.conditions.terminating = terminating;
  return e;
}

model::ServiceStatePtr service(const char* name, uint16_t hc_port, model::TrafficPolicy etp,
                               std::vector<model::MergedEndpoint> eps) {
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = {"demo", name};
  st->service.type = model::ServiceType::kLoadBalancer;
  st->service.external_traffic_policy = etp;
  st->service.health_check_node_port = hc_port;
  st->endpoints = std::move(eps);
  return st;
}

model::Snapshot snapshot(std::vector<model::ServiceStatePtr> services) {
  model::Snapshot s;
  s.generation = 1;
  s.synced = true;
  std::sort(services.begin(), services.end(),
            [](const auto& a, const auto& b) { return a->key() < b->key(); });
  s.services = std::move(services);
  return s;
}

// A loopback port that was free a moment ago (the spec's port is what gets bound, so tests
// pick ports the kernel just handed out).
uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), sizeof sin);
  socklen_t len = sizeof sin;
  getsockname(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), &len);
  close(fd);
  return ntohs(sin.sin_port);
}

constexpr auto kLocal = model::TrafficPolicy::kLocal;
constexpr auto kCluster = model::TrafficPolicy::kCluster;

TEST(HealthCheckTargets, CountsReadyEndpointsOnThisNodeOnly) {
  auto snap = snapshot({
      service("lb-local", 30001, kLocal,
              {endpoint("10.244.1.10", "node-a"), endpoint("10.244.1.11", "node-a"),
               endpoint("10.244.1.12", "node-a", /*ready=*/false, /*terminating=*/true),
               endpoint("10.244.2.10", "node-b")}),
      service("lb-cluster", 30002, kCluster, {endpoint("10.244.1.10", "node-a")}),
      service("local-no-port", 0, kLocal, {endpoint("10.244.1.10", "node-a")}),
      service("lb-empty", 30003, kLocal, {}),
  });
  auto targets = health_check_targets(snap, "node-a");
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(targets[0], (HealthCheckTarget{{"demo", "lb-local"}, 30001, 2}));
  EXPECT_EQ(targets[1], (HealthCheckTarget{{"demo", "lb-empty"}, 30003, 0}));
  EXPECT_EQ(health_check_targets(snap, "node-b")[0].local_endpoints, 1);
}

TEST(HealthCheckTargets, APortClaimedTwiceGoesToTheFirstService) {
  auto snap = snapshot({service("a", 30001, kLocal, {endpoint("10.244.1.10", "n")}),
                        service("b", 30001, kLocal, {})});
  auto targets = health_check_targets(snap, "n");
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[0].service.name, "a");
}

TEST(HealthCheckBody, MatchesKubeProxysFields) {
  EXPECT_EQ(
      health_check_body({"demo", "web"}, 3, true),
      R"({"service":{"namespace":"demo","name":"web"},"localEndpoints":3,"serviceProxyHealthy":true})");
  EXPECT_EQ(
      health_check_body({"d\"q", "w"}, 0, false),
      R"({"service":{"namespace":"d\"q","name":"w"},"localEndpoints":0,"serviceProxyHealthy":false})");
}

class HealthCheckServerTest : public ::testing::Test {
 protected:
  httplib::Result get(uint16_t port, const char* path = "/healthz") {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(2);
    c.set_read_timeout(2);
    return c.Get(path);
  }
};

TEST_F(HealthCheckServerTest, AnswersWithLocalEndpointCountAndFollowsUpdates) {
  uint16_t port = free_port();
  HealthCheckServer hc({.bind_address = "127.0.0.1"});
  hc.update(
      snapshot({service("web", port, kLocal,
                        {endpoint("10.244.1.10", "node-a"), endpoint("10.244.1.11", "node-a")})}),
      "node-a");
  EXPECT_EQ(hc.ports(), std::vector<uint16_t>{port});

  auto r = get(port);
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(
      r->body,
      R"({"service":{"namespace":"demo","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true})");
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->get_header_value("X-Load-Balancing-Endpoint-Weight"), "2");
  EXPECT_EQ(get(port, "/any/path")->status, 200);

  // The local endpoints terminate: 503 with a count of 0, same listener.
  hc.update(snapshot({service("web", port, kLocal,
                              {endpoint("10.244.1.10", "node-a", false, true),
                               endpoint("10.244.2.10", "node-b")})}),
            "node-a");
  r = get(port);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("\"localEndpoints\":0"), std::string::npos);

  // The service goes: the port closes.
  hc.update(snapshot({}), "node-a");
  EXPECT_TRUE(hc.ports().empty());
  EXPECT_FALSE(get(port));
}

TEST_F(HealthCheckServerTest, ListenersComeAndGoWithServicesAndPolicy) {
  uint16_t p1 = free_port(), p2 = free_port();
  HealthCheckServer hc({.bind_address = "127.0.0.1"});
  auto a = service("a", p1, kLocal, {endpoint("10.244.1.10", "n")});
  hc.update(snapshot({a}), "n");
  hc.update(snapshot({a, service("b", p2, kLocal, {endpoint("10.244.1.11", "n")})}), "n");
  auto ports = hc.ports();
  EXPECT_EQ(ports.size(), 2u);
  EXPECT_EQ(get(p2)->status, 200);
  // "b" switches to externalTrafficPolicy Cluster: no health check any more.
  hc.update(snapshot({a, service("b", p2, kCluster, {endpoint("10.244.1.11", "n")})}), "n");
  EXPECT_EQ(hc.ports(), std::vector<uint16_t>{p1});
  EXPECT_FALSE(get(p2));
  EXPECT_EQ(get(p1)->status, 200);
}

TEST_F(HealthCheckServerTest, UnhealthyProxyAnswers503) {
  uint16_t port = free_port();
  std::atomic<bool> healthy{true};
  HealthCheckServer hc(
      {.bind_address = "127.0.0.1", .proxy_healthy = [&] { return healthy.load(); }});
  hc.update(snapshot({service("web", port, kLocal, {endpoint("10.244.1.10", "n")})}), "n");
  EXPECT_EQ(get(port)->status, 200);
  healthy = false;
  auto r = get(port);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("\"localEndpoints\":1,\"serviceProxyHealthy\":false"), std::string::npos);
}

TEST_F(HealthCheckServerTest, BusyPortIsCountedAndRetriedOnTheNextUpdate) {
  // Hold the port with a listening socket of our own.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), sizeof sin), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof sin;
  getsockname(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), &len);
  uint16_t port = ntohs(sin.sin_port);

  HealthCheckServer hc({.bind_address = "127.0.0.1"});
  auto snap = snapshot({service("web", port, kLocal, {endpoint("10.244.1.10", "n")})});
  hc.update(snap, "n");
  EXPECT_EQ(hc.bind_failures(), 1u);
  EXPECT_TRUE(hc.ports().empty());

  close(fd);
  hc.update(snap, "n");
  EXPECT_EQ(hc.bind_failures(), 1u);
  EXPECT_EQ(hc.ports(), std::vector<uint16_t>{port});
  EXPECT_EQ(get(port)->status, 200);
}

}  // namespace
}  // namespace endpointd::proxy
