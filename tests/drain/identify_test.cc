// Caller identification from /proc text, and matching a caller to a pod of this node.
#include "drain/identify.h"

#include <gtest/gtest.h>

#include "drain/coordinator.h"
#include "tests/drain/fixture.h"

namespace endpointd::drain {
namespace {

TEST(Identify, ParsesProcText) {
  const char* fib =
      "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
      "     +-- 10.244.1.0/24 2 0 2\n        |-- 10.244.1.10\n           /32 host LOCAL\n"
      "     +-- 127.0.0.0/8 2 0 2\n        |-- 127.0.0.1\n           /32 host LOCAL\n"
      "Local:\n        |-- 10.244.1.10\n           /32 host LOCAL\n";
  auto a = parse_fib_trie_local(fib);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].str(), "10.244.1.10");
  auto v6 = parse_if_inet6(
      "fd000000000000000000000000000010 02 40 00 80 eth0\n"
      "fe800000000000000000000000000001 02 40 20 80 eth0\n"
      "00000000000000000000000000000001 01 80 10 80 lo\n");
  ASSERT_EQ(v6.size(), 1u);
  EXPECT_EQ(v6[0].str(), "fd00::10");
  EXPECT_EQ(pod_uid_from_cgroup("0::/kubepods.slice/kubepods-burstable.slice/"
                                "kubepods-burstable-pod7a0e0000_0000_4000_8000_000000000011.slice/"
                                "cri-containerd-ab.scope\n"),
            "7a0e0000-0000-4000-8000-000000000011");
  EXPECT_EQ(
      pod_uid_from_cgroup("0::/kubepods/besteffort/pod7a0e0000-0000-4000-8000-000000000011/abc\n"),
      "7a0e0000-0000-4000-8000-000000000011");
  EXPECT_EQ(pod_uid_from_cgroup("0::/user.slice/user-0.slice/session-3.scope\n"), "");
}

TEST(Identify, MatchesOnlyPodsOfThisNode) {
  auto s =
      testing::make_snapshot(1, {}, {{"web-1", "10.244.1.10"}, {"web-3", "10.244.2.10", "node-b"}});
  Caller c;
  c.pid = 42;
  c.addresses = {testing::ip("10.244.1.10")};
  auto p = match_pod(*s, "node-a", c);
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ((*p)->key.name, "web-1");
  c.addresses = {testing::ip("10.244.2.10")};
  auto elsewhere = match_pod(*s, "node-a", c);
  ASSERT_FALSE(elsewhere);
  EXPECT_NE(elsewhere.error().find("not a pod on node node-a"), std::string::npos);
  // The node's own namespace never matches by address, only by a pod cgroup.
  c.addresses = {testing::ip("10.244.1.10")};
  c.host_netns = true;
  EXPECT_FALSE(match_pod(*s, "node-a", c));
  c.pod_uid = "uid-web-1";
  EXPECT_TRUE(match_pod(*s, "node-a", c));
  c.pod_uid = "uid-web-3";
  auto other_node = match_pod(*s, "node-a", c);
  ASSERT_FALSE(other_node);
  EXPECT_NE(other_node.error().find("of node node-b"), std::string::npos);
}

TEST(Identify, ParsesDurations) {
  EXPECT_EQ(parse_duration("500ms"), std::chrono::milliseconds(500));
  EXPECT_EQ(parse_duration("30s"), std::chrono::milliseconds(30000));
  EXPECT_EQ(parse_duration("2m"), std::chrono::milliseconds(120000));
  EXPECT_EQ(parse_duration("7"), std::chrono::milliseconds(7000));
  EXPECT_FALSE(parse_duration("soon"));
  // Found by fuzz_drain_action: past int64 milliseconds the conversion was undefined.
  EXPECT_FALSE(parse_duration("99999999999999999999999"));
  EXPECT_FALSE(parse_duration("400d"));
  EXPECT_EQ(parse_duration("8760h"), std::chrono::milliseconds(8760LL * 3600 * 1000));
}

}  // namespace
}  // namespace endpointd::drain
