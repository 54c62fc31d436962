// A service's frontends (proxy/frontends.h): the one list of address:port pairs that the
// planner programs and the sink's UDP index and stale-flow sweep match.
#include "proxy/frontends.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/proxy/fixtures.h"

namespace endpointd::proxy {
namespace {

using testing::ip;

model::Service every_kind() {
  model::Service s = testing::service("web", {ip("10.96.0.10"), ip("fd00::10")}, 80);
  s.type = model::ServiceType::kLoadBalancer;
  s.external_ips = {ip("192.0.2.7")};
  s.load_balancer_ips = {ip("198.51.100.1")};
  s.ports[0].node_port = 30080;
  return s;
}

TEST(Frontends, EveryServiceAddressOnThePortThenEveryNodePortAddressOnTheNodePort) {
  model::Service s = every_kind();
  std::vector<model::IpAddr> node_ips = {ip("192.168.1.5"), ip("fd01::5")};
  std::vector<Frontend> want = {
      {ip("10.96.0.10"), 80, FrontendKind::kClusterIp},
      {ip("fd00::10"), 80, FrontendKind::kClusterIp},
      {ip("192.0.2.7"), 80, FrontendKind::kExternalIp},
      {ip("198.51.100.1"), 80, FrontendKind::kLoadBalancerIp},
      {ip("192.168.1.5"), 30080, FrontendKind::kNodePort},
      {ip("fd01::5"), 30080, FrontendKind::kNodePort},
  };
  EXPECT_EQ(frontends(s, s.ports[0], node_ips), want);
  EXPECT_EQ(node_port(s, s.ports[0]), 30080);
}

TEST(Frontends, ServiceAddressesHaveNoPortAndNoNodeAddress) {
  model::Service s = every_kind();
  std::vector<Frontend> want = {
      {ip("10.96.0.10"), 0, FrontendKind::kClusterIp},
      {ip("fd00::10"), 0, FrontendKind::kClusterIp},
      {ip("192.0.2.7"), 0, FrontendKind::kExternalIp},
      {ip("198.51.100.1"), 0, FrontendKind::kLoadBalancerIp},
  };
  EXPECT_EQ(service_addresses(s), want);
}

TEST(Frontends, OnlyNodePortAndLoadBalancerServicesHaveANodePort) {
  model::Service s = every_kind();
  std::vector<model::IpAddr> node_ips = {ip("192.168.1.5")};
  s.type = model::ServiceType::kNodePort;
  EXPECT_EQ(frontends(s, s.ports[0], node_ips).size(), 5u);
  // A ClusterIP service with a stray nodePort (a hand-written manifest): none.
  s.type = model::ServiceType::kClusterIP;
  EXPECT_EQ(node_port(s, s.ports[0]), std::nullopt);
  EXPECT_EQ(frontends(s, s.ports[0], node_ips).size(), 4u);
  // Port 0 is no NodePort.
  s.type = model::ServiceType::kNodePort;
  s.ports[0].node_port = 0;
  EXPECT_EQ(node_port(s, s.ports[0]), std::nullopt);
  EXPECT_EQ(frontends(s, s.ports[0], node_ips).size(), 4u);
}

TEST(Frontends, UnroutableAddressesAreListedForTheCallerToSkip) {
  model::Service s = testing::service("odd", {ip("127.0.0.1"), ip("0.0.0.0")}, 53);
  auto f = frontends(s, s.ports[0], {});
  ASSERT_EQ(f.size(), 2u);
  EXPECT_TRUE(f[0].addr.is_loopback());
  EXPECT_TRUE(f[1].addr.is_unspecified());
}

}  // namespace
}  // namespace endpointd::proxy
