// The conntrack matching and counting rules (shared by the netlink implementation and the
// fake).
#include <netinet/in.h>

#include <gtest/gtest.h>

#include "proxy/conntrack.h"
#include "tests/proxy_support/fake_conntrack.h"

namespace endpointd::proxy {
namespace {

model::IpAddr ip(const char* s) {
  return *model::IpAddr::parse(s);
}

// A client -> VIP flow DNAT'd to a backend.
Flow dnat_flow(uint8_t proto, const char* client, uint16_t cport, const char* vip, uint16_t vport,
               const char* backend, uint16_t bport, std::optional<uint8_t> tcp_state = {}) {
  Flow f;
  f.l4proto = proto;
  f.orig_src = ip(client);
  f.orig_src_port = cport;
  f.orig_dst = ip(vip);
  f.orig_dst_port = vport;
  f.reply_src = ip(backend);
  f.reply_src_port = bport;
  f.reply_dst = ip(client);
  f.reply_dst_port = cport;
  f.tcp_state = tcp_state;
  return f;
}

constexpr uint8_t kEstablished = 3, kSynSent = 1, kFinWait = 4, kTimeWait = 7;

TEST(FlowMatch, MatchesEverySetField) {
  Flow f = dnat_flow(IPPROTO_UDP, "10.244.1.10", 40000, "10.96.0.53", 53, "10.244.2.20", 5353);
  EXPECT_TRUE(FlowMatch{}.matches(f));
  EXPECT_TRUE(udp_to_endpoint(ip("10.244.2.20")).matches(f));
  EXPECT_TRUE(udp_to_endpoint(ip("10.244.2.20"), 5353).matches(f));
  EXPECT_FALSE(udp_to_endpoint(ip("10.244.2.20"), 53).matches(f));
  EXPECT_FALSE(udp_to_endpoint(ip("10.244.2.21")).matches(f));
  EXPECT_TRUE(udp_to_service(ip("10.96.0.53"), 53).matches(f));
  EXPECT_FALSE(udp_to_service(ip("10.96.0.53"), 54).matches(f));
  EXPECT_TRUE(udp_to_node_port(53).matches(f));
  f.l4proto = IPPROTO_TCP;
  EXPECT_FALSE(udp_to_endpoint(ip("10.244.2.20")).matches(f));
  EXPECT_FALSE(udp_to_service(ip("10.96.0.53"), 53).matches(f));
}

TEST(FlowCount, CountsLiveConnectionsByReplySource) {
  FakeConntrack ct;
  const char* ep = "10.244.1.10";
  ct.add(dnat_flow(IPPROTO_TCP, "10.244.2.10", 1, "10.96.0.10", 80, ep, 8080, kEstablished));
  ct.add(dnat_flow(IPPROTO_TCP, "10.244.2.10", 2, "10.96.0.10", 80, ep, 8080, kEstablished));
  ct.add(dnat_flow(IPPROTO_TCP, "10.244.2.10", 3, "10.96.0.10", 80, ep, 8080, kSynSent));
  ct.add(dnat_flow(IPPROTO_TCP, "10.244.2.10", 4, "10.96.0.10", 80, ep, 8080, kFinWait));
  ct.add(dnat_flow(IPPROTO_TCP, "10.244.2.10", 5, "10.96.0.10", 80, ep, 8080, kTimeWait));
  ct.add(dnat_flow(IPPROTO_UDP, "10.244.2.10", 6, "10.96.0.10", 53, ep, 53));
  ct.add(dnat_flow(IPPROTO_TCP, "10.244.2.10", 7, "10.96.0.10", 80, "10.244.1.11", 8080,
                   kEstablished));
  auto c = ct.count_flows_to(ip(ep));
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, (FlowCount{.tcp_established = 2, .tcp_opening = 1, .tcp_closing = 1, .udp = 1}));
  EXPECT_EQ(c->live(), 5u);
  EXPECT_EQ(ct.count_flows_to(ip("10.244.9.9"))->live(), 0u);
  auto each = ct.count_flows_to_each({ip("10.244.1.11"), ip(ep)});
  ASSERT_TRUE(each);
  EXPECT_EQ((*each)[0], FlowCount{.tcp_established = 1});
  EXPECT_EQ((*each)[1], *c);
}

TEST(FakeConntrack, DeletesWhatAnyMatchSelectsAndReportsErrors) {
  FakeConntrack ct;
  ct.add(dnat_flow(IPPROTO_UDP, "10.244.2.10", 1, "10.96.0.53", 53, "10.244.1.20", 53));
  ct.add(dnat_flow(IPPROTO_UDP, "10.244.2.10", 2, "10.96.0.53", 53, "10.244.1.21", 53));
  ct.add(dnat_flow(IPPROTO_UDP, "10.244.2.10", 3, "10.96.0.99", 53, "10.96.0.99", 53));
  ct.add(
      dnat_flow(IPPROTO_TCP, "10.244.2.10", 4, "10.96.0.53", 53, "10.244.1.20", 53, kEstablished));
  auto n =
      ct.delete_flows({udp_to_endpoint(ip("10.244.1.20")), udp_to_service(ip("10.96.0.99"), 53)});
  ASSERT_TRUE(n);
  EXPECT_EQ(n->total(), 2u);
  EXPECT_EQ(n->ipv6, 0u);
  EXPECT_EQ(ct.list()->size(), 2u);
  ct.fail_with("netlink down");
  EXPECT_FALSE(ct.delete_flows({FlowMatch{}}));
  EXPECT_EQ(ct.delete_calls().size(), 2u);
}

}  // namespace
}  // namespace endpointd::proxy
