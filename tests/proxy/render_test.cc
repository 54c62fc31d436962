#include <gtest/gtest.h>

#include "proxy/render.h"

namespace endpointd::proxy {
namespace {

TEST(ProxyRender, RuleShapesAsNftPrintsThem) {
  EXPECT_EQ(render_rule(IpFamily::kV4, {RuleShape::kDnatRandom, "", "backends-2", 2}),
            "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends-2");
  EXPECT_EQ(render_rule(IpFamily::kV6, {RuleShape::kVipVmap, "", "service-ips", 0}),
            "ip6 daddr . meta l4proto . th dport vmap @service-ips");
  EXPECT_EQ(render_rule(IpFamily::kV4,
                        {RuleShape::kSaddrNotInJump, "mark-for-masquerade", "cluster-cidrs", 0}),
            "ip saddr != @cluster-cidrs jump mark-for-masquerade");
  // As nft 1.0.6 lists what the netlink backend programs (checked in the traffic test).
  EXPECT_EQ(render_rule(IpFamily::kV4, {RuleShape::kAffinityStick, "", "affinity", 0}),
            "dnat ip to ip saddr . ip daddr . meta l4proto . th dport map @affinity");
  Rule record{RuleShape::kAffinityRecord, "", "affinity-backends-10800", 0, "affinity", 10800, 17};
  EXPECT_EQ(render_rule(IpFamily::kV6, record),
            "meta l4proto udp ct original ip6 daddr . meta l4proto . ct original proto-dst . ip6 "
            "daddr . th dport "
            "@affinity-backends-10800 update @affinity { ip6 saddr . ct original ip6 daddr . meta "
            "l4proto . ct original proto-dst timeout 3h : ip6 daddr . th dport }");
  EXPECT_EQ(render_rule(IpFamily::kV6, {RuleShape::kGoto, "lb", "", 0}), "goto lb");
  // filter-forward's early exits (nft lists them so: netlink_test).
  EXPECT_EQ(render_rule(IpFamily::kV4, {RuleShape::kAcceptEstablished, "", ""}),
            "ct state established,related accept");
  EXPECT_EQ(render_rule(IpFamily::kV6, {RuleShape::kAcceptDnat, "", ""}), "ct status dnat accept");
  // Local traffic by interface, and cluster-ips-check (nft lists them so: netlink_test).
  Rule not_local{RuleShape::kIifnameNotJump, "mark-for-masquerade", "", 0, "", 0, 0, "veth*"};
  EXPECT_EQ(render_rule(IpFamily::kV4, not_local), "iifname != \"veth*\" jump mark-for-masquerade");
  Rule local{RuleShape::kIifnameVmap, "", "service-lb", 0, "", 0, 0, "cbr0"};
  EXPECT_EQ(render_rule(IpFamily::kV6, local),
            "iifname \"cbr0\" ip6 daddr . meta l4proto . th dport vmap @service-lb");
  EXPECT_EQ(render_rule(IpFamily::kV4, {RuleShape::kDaddrInSetGoto, "reject-chain", "cluster-ips"}),
            "ip daddr @cluster-ips goto reject-chain");
  EXPECT_EQ(render_rule(IpFamily::kV6, {RuleShape::kDaddrInSetDrop, "", "service-cidrs"}),
            "ip6 daddr @service-cidrs drop");
  // Node-local DNS (nft lists them so: netlink_test).
  Rule query{RuleShape::kNotrackDaddr, "", ""};
  query.addr = addr_field(*model::IpAddr::parse("169.254.20.10"));
  query.l4proto = 17;
  query.port = 53;
  EXPECT_EQ(render_rule(IpFamily::kV4, query), "ip daddr 169.254.20.10 udp dport 53 notrack");
  Rule answer{RuleShape::kNotrackSaddr, "", ""};
  answer.addr = addr_field(*model::IpAddr::parse("fd00::10"));
  answer.l4proto = 6;
  answer.port = 53;
  EXPECT_EQ(render_rule(IpFamily::kV6, answer), "ip6 saddr fd00::10 tcp sport 53 notrack");
}

}  // namespace
}  // namespace endpointd::proxy
