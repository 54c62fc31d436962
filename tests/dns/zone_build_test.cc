// What the zone built from a Snapshot holds, asked through the hot path (answer()): every
// record form, which endpoints are answered, pod records per mode.
#include "dns/zone.h"

#include <gtest/gtest.h>

#include "dns/answer.h"
#include "tests/dns/test_util.h"
#include "tests/dns/zone_fixture.h"

namespace endpointd::dns {
namespace {

using namespace testing;

class ZoneBuildTest : public ZoneFixture {};

TEST_F(ZoneBuildTest, ClusterIpPerFamily) {
  auto a = ask(*zone_, "web.default.svc.cluster.local", type::kA);
  ASSERT_TRUE(a.msg);
  EXPECT_EQ(a.msg->rcode, 0);
  EXPECT_TRUE(a.msg->flags & flag::kAA);
  EXPECT_EQ(texts(a.msg->answer), std::vector<std::string>{"10.96.0.10"});
  EXPECT_EQ(a.msg->answer[0].ttl, 5u);
  auto aaaa = ask(*zone_, "web.default.svc.cluster.local", type::kAAAA);
  EXPECT_EQ(texts(aaaa.msg->answer), std::vector<std::string>{"fd00::10"});
}

TEST_F(ZoneBuildTest, HeadlessReadyEndpointsOnly) {
  auto a = ask(*zone_, "db.default.svc.cluster.local", type::kA);
  EXPECT_EQ(texts(a.msg->answer), (std::vector<std::string>{"10.1.0.1", "10.1.0.2"}));
  auto aaaa = ask(*zone_, "db.default.svc.cluster.local", type::kAAAA);
  EXPECT_EQ(texts(aaaa.msg->answer), (std::vector<std::string>{"fd00::1:5"}));
}

TEST_F(ZoneBuildTest, HeadlessHostnames) {
  EXPECT_EQ(texts(ask(*zone_, "db-0.db.default.svc.cluster.local", type::kA).msg->answer),
            std::vector<std::string>{"10.1.0.1"});
  EXPECT_EQ(texts(ask(*zone_, "10-1-0-2.db.default.svc.cluster.local", type::kA).msg->answer),
            std::vector<std::string>{"10.1.0.2"});
  EXPECT_EQ(ask(*zone_, "10-1-0-3.db.default.svc.cluster.local", type::kA).msg->rcode, 3);
  EXPECT_EQ(ask(*zone_, "10-1-0-4.db.default.svc.cluster.local", type::kA).msg->rcode, 3);
}

TEST_F(ZoneBuildTest, HeadlessWithoutReadyIsNxDomain) {
  EXPECT_EQ(ask(*zone_, "empty.default.svc.cluster.local", type::kA).msg->rcode, 3);
}

TEST_F(ZoneBuildTest, PublishNotReadyAddresses) {
  EXPECT_EQ(texts(ask(*zone_, "pub.default.svc.cluster.local", type::kA).msg->answer),
            std::vector<std::string>{"10.1.2.1"});
}

TEST_F(ZoneBuildTest, SrvClusterIp) {
  auto a = ask(*zone_, "_http._tcp.web.default.svc.cluster.local", type::kSRV);
  ASSERT_EQ(a.msg->answer.size(), 1u);
  EXPECT_EQ(a.msg->answer[0].srv_port, 80);
  EXPECT_EQ(a.msg->answer[0].text, "web.default.svc.cluster.local.");
  EXPECT_EQ(texts(a.msg->additional), (std::vector<std::string>{"10.96.0.10", "fd00::10"}));
  EXPECT_EQ(ask(*zone_, "_tcp.web.default.svc.cluster.local", type::kA).msg->rcode, 0);
}

TEST_F(ZoneBuildTest, SrvHeadlessPerEndpoint) {
  auto a = ask(*zone_, "_http._tcp.db.default.svc.cluster.local", type::kSRV);
  EXPECT_EQ(texts(a.msg->answer),
            (std::vector<std::string>{"10-1-0-2.db.default.svc.cluster.local.",
                                      "db-0.db.default.svc.cluster.local.",
                                      "fd00--1-5.db.default.svc.cluster.local."}));
  EXPECT_EQ(a.msg->answer[0].srv_port, 8080);
  EXPECT_EQ(texts(a.msg->additional),
            (std::vector<std::string>{"10.1.0.1", "10.1.0.2", "fd00::1:5"}));
}

TEST_F(ZoneBuildTest, Ptr) {
  EXPECT_EQ(texts(ask(*zone_, "10.0.96.10.in-addr.arpa", type::kPTR).msg->answer),
            std::vector<std::string>{"web.default.svc.cluster.local."});
  EXPECT_EQ(texts(ask(*zone_, "1.0.1.10.in-addr.arpa", type::kPTR).msg->answer),
            std::vector<std::string>{"db-0.db.default.svc.cluster.local."});
  std::string v6 = "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa";
  EXPECT_EQ(texts(ask(*zone_, v6, type::kPTR).msg->answer),
            std::vector<std::string>{"web.default.svc.cluster.local."});
  // Unknown reverse names are not ours: forwarded.
  EXPECT_EQ(ask(*zone_, "9.9.9.9.in-addr.arpa", type::kPTR).reply.action, Reply::Action::kForward);
}

TEST_F(ZoneBuildTest, ExternalNameCname) {
  for (uint16_t t : {type::kA, type::kAAAA, type::kCNAME}) {
    auto a = ask(*zone_, "ext.default.svc.cluster.local", t);
    ASSERT_EQ(a.msg->answer.size(), 1u);
    EXPECT_EQ(a.msg->answer[0].type, type::kCNAME);
    EXPECT_EQ(a.msg->answer[0].text, "example.org.");
  }
}

TEST_F(ZoneBuildTest, DnsVersion) {
  auto a = ask(*zone_, "dns-version.cluster.local", type::kTXT);
  ASSERT_EQ(a.msg->answer.size(), 1u);
  EXPECT_EQ(a.msg->answer[0].text, "1.1.0");
}

TEST_F(ZoneBuildTest, PodRecords) {
  ZoneOptions o = opts_;
  o.pod_mode = PodMode::kDisabled;
  auto z = Zone::build(*snap_, o);
  EXPECT_EQ(ask(*z, "10-1-0-1.default.pod.cluster.local", type::kA).msg->rcode, 3);
  o.pod_mode = PodMode::kVerified;
  z = Zone::build(*snap_, o);
  EXPECT_EQ(texts(ask(*z, "10-1-0-1.default.pod.cluster.local", type::kA).msg->answer),
            std::vector<std::string>{"10.1.0.1"});
  EXPECT_EQ(ask(*z, "10-9-9-9.default.pod.cluster.local", type::kA).msg->rcode, 3);
  EXPECT_EQ(ask(*z, "10-1-0-1.other.pod.cluster.local", type::kA).msg->rcode, 3);
  o.pod_mode = PodMode::kInsecure;
  z = Zone::build(*snap_, o);
  EXPECT_EQ(texts(ask(*z, "10-9-9-9.any.pod.cluster.local", type::kA).msg->answer),
            std::vector<std::string>{"10.9.9.9"});
  EXPECT_EQ(texts(ask(*z, "fd00--9.any.pod.cluster.local", type::kAAAA).msg->answer),
            std::vector<std::string>{"fd00::9"});
  EXPECT_EQ(ask(*z, "10-9-9-9.any.pod.cluster.local", type::kAAAA).msg->rcode, 0);
  EXPECT_EQ(ask(*z, "bogus.any.pod.cluster.local", type::kA).msg->rcode, 3);
}

TEST_F(ZoneBuildTest, TerminatingLeavesAndLastServedIsKept) {
  ZoneBuilder b(opts_);
  auto z = b.apply(snap_);
  auto a = ask(*z, "db.default.svc.cluster.local", type::kA, 0, 0, 1000);
  ASSERT_EQ(a.msg->answer.size(), 2u);
  EXPECT_EQ(b.last_served_ns(ip("10.1.0.2")), 1000);
  EXPECT_FALSE(b.last_served_ns(ip("10.1.0.4")));  // terminating: never handed out
  EXPECT_FALSE(b.last_served_ns(ip("10.9.9.9")));
}

}  // namespace
}  // namespace endpointd::dns
