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
}

}  // namespace
}  // namespace endpointd::proxy
