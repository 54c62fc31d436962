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
}

}  // namespace
}  // namespace endpointd::proxy
