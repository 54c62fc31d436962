// A healthCheckNodePort listener opened inside a node namespace answers a load balancer
// probing the node's address from another namespace.
#include <gtest/gtest.h>
#include <httplib.h>

#include "proxy/healthcheck.h"
#include "tests/netns/cluster.h"
#include "tests/netns/fixture.h"

namespace endpointd::proxy {
namespace {

model::Snapshot one_service(uint16_t hc_port, std::vector<std::string> endpoint_nodes) {
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = {"demo", "web"};
  st->service.type = model::ServiceType::kLoadBalancer;
  st->service.external_traffic_policy = model::TrafficPolicy::kLocal;
  st->service.health_check_node_port = hc_port;
  int i = 10;
  for (const auto& node : endpoint_nodes) {
    model::MergedEndpoint e;
    e.address = *model::IpAddr::parse("10.244.1." + std::to_string(i++));
    e.node_name = node;
    st->endpoints.push_back(e);
  }
  model::Snapshot s;
  s.generation = 1;
  s.services = std::vector<model::ServiceStatePtr>{st};
  return s;
}

using HealthCheckNetnsTest = netns::NetnsTest;

TEST_F(HealthCheckNetnsTest, ListensInTheNodeNamespaceOnItsAddress) {
  netns::Cluster c(netns::ClusterSpec::demo());
  HealthCheckServer hc({.bind_address = "0.0.0.0"});
  // Sockets are made in the namespace of the thread that calls update().
  c.node("node-a").run([&] {
    hc.update(one_service(30999, {"node-a", "node-a", "node-b"}), "node-a");
  });
  auto probe = [&](const std::string& node_ip) {
    return c.client().run([&] {
      httplib::Client http(node_ip, 30999);
      http.set_connection_timeout(2);
      auto r = http.Get("/");
      return r ? std::make_pair(r->status, r->body) : std::make_pair(-1, std::string());
    });
  };
  auto [status, body] = probe("192.168.77.2");
  EXPECT_EQ(status, 200);
  EXPECT_NE(body.find("\"localEndpoints\":2"), std::string::npos) << body;
  EXPECT_EQ(probe("192.168.77.3").first, -1);  // node-b runs no listener

  c.node("node-a").run([&] { hc.update(one_service(30999, {"node-b"}), "node-a"); });
  EXPECT_EQ(probe("192.168.77.2").first, 503);
}

}  // namespace
}  // namespace endpointd::proxy
