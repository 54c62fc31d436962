#include <gtest/gtest.h>

#include "proxy/planner.h"
#include "proxy/render.h"
#include "tests/proxy/fixtures.h"

namespace endpointd::proxy {
namespace {

const Element* find(const Table& t, const std::string& set, const std::string& key) {
  auto s = t.sets.find(set);
  if (s == t.sets.end()) return nullptr;
  auto e = s->second.elements.find(key);
  return e == s->second.elements.end() ? nullptr : &e->second;
}

std::string vip(const char* a, uint8_t proto, uint16_t port) {
  return addr_field(testing::ip(a)) + proto_field(proto) + port_field(port);
}

TEST(ProxyPlanner, SetsAndChainsDoNotGrowWithServices) {
  Planner p(testing::node_context());
  std::vector<model::ServiceStatePtr> v;
  for (int i = 0; i < 200; ++i) {
    std::string a = "10.96.1." + std::to_string(i + 1);
    v.push_back(testing::state(testing::service("s" + std::to_string(i), {testing::ip(a.c_str())}, 80),
                               {testing::endpoint("10.244.1.2", 8080), testing::endpoint("10.244.1.3", 8080)}));
  }
  p.reset(*testing::snapshot(1, v));
  const Table& t = p.table(IpFamily::kV4);
  EXPECT_EQ(t.sets.size(), 9u);  // 8 fixed + backends-2
  EXPECT_EQ(t.sets.at("backends-2").elements.size(), 400u);
  EXPECT_EQ(t.sets.at("hairpin").elements.size(), 2u);
}

TEST(ProxyPlanner, EveryShape) {
  Planner p(testing::node_context());
  p.reset(*testing::every_shape());
  const Table& t = p.table(IpFamily::kV4);
  auto* reject = find(t, "no-endpoint-services", vip("10.96.0.11", 6, 80));
  ASSERT_NE(reject, nullptr);
  EXPECT_EQ(reject->chain, "reject-chain");
  EXPECT_EQ(find(t, "service-lb", vip("10.96.0.12", 17, 53))->chain, "lb-hash-3");  // affinity
  EXPECT_EQ(find(t, "service-ips", vip("203.0.113.7", 6, 443))->chain, "svc-external-local");
  EXPECT_EQ(find(t, "service-local-lb", vip("192.168.50.1", 6, 30443))->chain, "local-lb-1");  // NodePort
  EXPECT_NE(find(t, "firewall-ips", vip("203.0.113.7", 6, 443)), nullptr);
  EXPECT_EQ(find(t, "firewall-ips", vip("203.0.113.8", 6, 443)), nullptr);  // externalIP: no firewall
  // internalTrafficPolicy Local without a local endpoint: drop, counted.
  EXPECT_EQ(find(t, "no-endpoint-services", vip("10.96.0.14", 132, 9000))->verdict, Verdict::kDrop);
  EXPECT_EQ(p.no_local_internal(), 1u);
  // Terminating fallback: the serving terminating endpoint is used.
  EXPECT_EQ(find(t, "service-lb", vip("10.96.0.15", 6, 80))->chain, "lb-1");
  // IPv6: the LB's only endpoint is on another node -> drop for external traffic.
  const Table& t6 = p.table(IpFamily::kV6);
  EXPECT_EQ(find(t6, "service-local-lb", vip("2001:db8::7", 6, 443))->verdict, Verdict::kDrop);
}

TEST(ProxyPlanner, OneEndpointChangeIsASmallChange) {
  Planner p(testing::node_context());
  auto s1 = testing::every_shape(1);
  p.reset(*s1);
  std::vector<model::ServiceStatePtr> v;
  for (const auto& st : s1->services) {
    if (st->key().name != "term") {
      v.push_back(st);
      continue;
    }
    v.push_back(testing::state(st->service, {testing::endpoint("10.244.1.8", 8080)}));
  }
  auto s2 = testing::snapshot(2, v);
  auto ch = p.update(*s2, model::diff(s1.get(), *s2));
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_TRUE(ch[0].add_sets.empty());
  EXPECT_TRUE(ch[0].del_sets.empty());
  // backends-1 element replaced, hairpin element replaced.
  EXPECT_EQ(ch[0].del_elements.size(), 2u);
  EXPECT_EQ(ch[0].add_elements.size(), 2u);
  // The planner's table equals a fresh plan of the new snapshot.
  Planner fresh(testing::node_context());
  fresh.reset(*s2);
  EXPECT_EQ(render(p.table(IpFamily::kV4)), render(fresh.table(IpFamily::kV4)));
}

TEST(ProxyPlanner, BadInputIsSkippedAndCounted) {
  NodeContext ctx = testing::node_context();
  ctx.ipv6 = false;
  Planner p(ctx);
  auto zero = testing::service("zero", {testing::ip("10.96.0.20")}, 0);
  auto v6 = testing::service("v6", {testing::ip("fd96::20")}, 80);
  auto ok = testing::service("ok", {testing::ip("10.96.0.21")}, 80);
  p.reset(*testing::snapshot(1, {testing::state(zero, {}), testing::state(v6, {}),
                                 testing::state(ok, {testing::endpoint("10.244.1.2", 8080)})}));
  EXPECT_EQ(p.last_stats().skipped, 2u);
  EXPECT_NE(find(p.table(IpFamily::kV4), "service-ips", vip("10.96.0.21", 6, 80)), nullptr);
}

}  // namespace
}  // namespace endpointd::proxy
