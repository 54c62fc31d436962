// IP address and prefix parsing.
#include "model/ip.h"

#include <gtest/gtest.h>

namespace endpointd::model {
namespace {

TEST(IpAddr, ParsesBothFamiliesAndPrintsCanonically) {
  auto a = IpAddr::parse("10.0.0.1");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->is_v4());
  EXPECT_EQ(a->str(), "10.0.0.1");
  auto b = IpAddr::parse("FD00:0::0001");
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->is_v6());
  EXPECT_EQ(b->str(), "fd00::1");
  EXPECT_EQ(b->dashed(), "fd00--1");
  EXPECT_EQ(a->dashed(), "10-0-0-1");
}

TEST(IpAddr, RejectsWhatIsNotAnAddress) {
  for (const char* bad : {"", "10.0.0", "10.0.0.256", "10.0.0.1/8", "fe80::1%eth0", "abc",
                          "1.2.3.4 ", "::g", "01234567890123456789012345678901234567890123456789"})
    EXPECT_FALSE(IpAddr::parse(bad)) << bad;
}

TEST(IpAddr, MappedV4IsV4) {
  auto a = IpAddr::parse("::ffff:10.1.2.3");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->is_v4());
  EXPECT_EQ(*a, *IpAddr::parse("10.1.2.3"));
}

TEST(IpAddr, OrdersByFamilyThenBytes) {
  EXPECT_LT(*IpAddr::parse("10.0.0.2"), *IpAddr::parse("10.0.0.10"));
  EXPECT_LT(*IpAddr::parse("255.0.0.0"), *IpAddr::parse("::1"));
}

TEST(IpPrefix, NormalisesAndContains) {
  auto p = IpPrefix::parse("10.1.2.3/16");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->str(), "10.1.0.0/16");
  EXPECT_TRUE(p->contains(*IpAddr::parse("10.1.200.1")));
  EXPECT_FALSE(p->contains(*IpAddr::parse("10.2.0.1")));
  EXPECT_FALSE(p->contains(*IpAddr::parse("::1")));
  auto q = IpPrefix::parse("fd00::/7");
  ASSERT_TRUE(q);
  EXPECT_TRUE(q->contains(*IpAddr::parse("fc00::5")));
  EXPECT_FALSE(q->contains(*IpAddr::parse("fe00::5")));
  EXPECT_TRUE(IpPrefix::parse("0.0.0.0/0")->contains(*IpAddr::parse("1.2.3.4")));
  for (const char* bad : {"10.0.0.0", "10.0.0.0/33", "::/129", "10.0.0.0/-1", "10.0.0.0/a", "/8"})
    EXPECT_FALSE(IpPrefix::parse(bad)) << bad;
}

}  // namespace
}  // namespace endpointd::model
