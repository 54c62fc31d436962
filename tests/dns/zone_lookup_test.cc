// How a built zone answers: NODATA, NXDOMAIN and their SOA, names outside the zone or before
// the first sync, case, classes, EDNS, truncation, synthesised pod addresses.
#include "dns/zone.h"

#include <gtest/gtest.h>

#include "dns/answer.h"
#include "tests/dns/test_util.h"
#include "tests/dns/zone_fixture.h"

namespace endpointd::dns {
namespace {

using namespace testing;

class ZoneLookupTest : public ZoneFixture {};

TEST_F(ZoneLookupTest, NoDataForMissingFamilyWithSoa) {
  auto a = ask(*zone_, "v4only.default.svc.cluster.local", type::kAAAA);
  ASSERT_TRUE(a.msg);
  EXPECT_EQ(a.msg->rcode, 0);
  EXPECT_TRUE(a.msg->answer.empty());
  ASSERT_EQ(a.msg->authority.size(), 1u);
  EXPECT_EQ(a.msg->authority[0].type, type::kSOA);
  EXPECT_EQ(a.msg->authority[0].name, "cluster.local.");
  EXPECT_EQ(a.msg->authority[0].ttl, opts_.negative_ttl);
}

TEST_F(ZoneLookupTest, NxDomainWithSoa) {
  auto a = ask(*zone_, "nope.default.svc.cluster.local", type::kA);
  EXPECT_EQ(a.msg->rcode, 3);
  ASSERT_EQ(a.msg->authority.size(), 1u);
  EXPECT_EQ(a.msg->authority[0].type, type::kSOA);
}

TEST_F(ZoneLookupTest, EmptyNonTerminalsAreNoData) {
  for (auto n : {"default.svc.cluster.local", "svc.cluster.local", "cluster.local"}) {
    auto a = ask(*zone_, n, type::kA);
    EXPECT_EQ(a.msg->rcode, 0) << n;
    EXPECT_TRUE(a.msg->answer.empty()) << n;
  }
  auto soa = ask(*zone_, "cluster.local", type::kSOA);
  EXPECT_EQ(soa.msg->answer.size(), 1u);
}

TEST_F(ZoneLookupTest, CaseInsensitiveWithCaseEchoed) {
  auto a = ask(*zone_, "WEB.Default.SVC.cluster.LOCAL", type::kA);
  EXPECT_EQ(texts(a.msg->answer), std::vector<std::string>{"10.96.0.10"});
  // The question is echoed byte for byte.
  auto pkt = query("WEB.Default.SVC.cluster.LOCAL", type::kA);
  EXPECT_TRUE(std::equal(pkt.begin() + 12, pkt.end(), a.bytes.begin() + 12));
  EXPECT_EQ(a.msg->qname, "WEB.Default.SVC.cluster.LOCAL.");
}

TEST_F(ZoneLookupTest, OutsideZoneIsForwarded) {
  EXPECT_EQ(ask(*zone_, "example.org", type::kA).reply.action, Reply::Action::kForward);
  EXPECT_EQ(ask(*zone_, "local", type::kA).reply.action, Reply::Action::kForward);
}

TEST_F(ZoneLookupTest, AnyIsMinimal) {
  auto a = ask(*zone_, "web.default.svc.cluster.local", type::kANY);
  EXPECT_EQ(a.msg->answer.size(), 1u);
}

TEST_F(ZoneLookupTest, ServFailBeforeSync) {
  auto z = Zone::build(*snapshot({}, 0, false), opts_);
  EXPECT_EQ(ask(*z, "web.default.svc.cluster.local", type::kA).msg->rcode, 2);
  EXPECT_EQ(ask(*Zone::unsynced(opts_), "cluster.local", type::kSOA).msg->rcode, 2);
  EXPECT_EQ(ask(*z, "example.org", type::kA).reply.action, Reply::Action::kForward);
}

TEST_F(ZoneLookupTest, RefusedForOtherClassesAndTransfers) {
  auto pkt = query("web.default.svc.cluster.local", type::kA);
  store_u16(pkt.data() + pkt.size() - 2, 3);  // CHAOS
  Query q = parse_query(pkt);
  uint8_t out[512];
  Reply r = answer(*zone_, pkt, q, out, sizeof out, 512, 1);
  EXPECT_EQ(r.rcode, 5);
  EXPECT_LE(r.size, pkt.size());
  EXPECT_EQ(ask(*zone_, "cluster.local", type::kAXFR).msg->rcode, 5);
}

TEST_F(ZoneLookupTest, EdnsEchoedAndBadVers) {
  auto a = ask(*zone_, "web.default.svc.cluster.local", type::kA, 1232);
  EXPECT_TRUE(a.msg->edns);
  EXPECT_EQ(a.msg->edns_udp_size, kOurUdpSize);
  auto pkt = query("web.default.svc.cluster.local", type::kA, 1232);
  pkt[pkt.size() - 5] = 1;
  Query q = parse_query(pkt);
  uint8_t out[512];
  Reply r = answer(*zone_, pkt, q, out, sizeof out, 512, 1);
  auto m = parse_message({out, r.size});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode, kRcodeBadVers);
}

TEST_F(ZoneLookupTest, TruncationWhenTooLarge) {
  std::vector<model::MergedEndpoint> eps;
  for (int i = 1; i <= 60; ++i) eps.push_back(endpoint("10.2.0." + std::to_string(i)));
  auto big = Zone::build(*snapshot({service("default", "big", {"None"}, eps)}), opts_);
  auto udp = ask(*big, "big.default.svc.cluster.local", type::kA);
  EXPECT_TRUE(udp.msg->tc());
  EXPECT_TRUE(udp.msg->answer.empty());
  auto edns = ask(*big, "big.default.svc.cluster.local", type::kA, 4096);
  EXPECT_FALSE(edns.msg->tc());
  EXPECT_EQ(edns.msg->answer.size(), 60u);
  auto tcp = ask(*big, "big.default.svc.cluster.local", type::kA, 0, 65535);
  EXPECT_EQ(tcp.msg->answer.size(), 60u);
  // SRV that fits without its additional section: the additional is dropped, no TC.
  auto srv = ask(*big, "_http._tcp.big.default.svc.cluster.local", type::kSRV, 0, 4000);
  EXPECT_FALSE(srv.msg->tc());
  EXPECT_EQ(srv.msg->answer.size(), 60u);
  EXPECT_TRUE(srv.msg->additional.empty());
}

TEST_F(ZoneLookupTest, ReverseNoDataCarriesTheSoa) {
  auto a = ask(*zone_, "10.0.96.10.in-addr.arpa", type::kA);
  ASSERT_TRUE(a.msg);
  EXPECT_EQ(a.msg->rcode, 0);
  EXPECT_TRUE(a.msg->answer.empty());
  ASSERT_EQ(a.msg->authority.size(), 1u);
  EXPECT_EQ(a.msg->authority[0].type, type::kSOA);
  EXPECT_EQ(a.msg->authority[0].name, "in-addr.arpa.");
  std::string v6 = "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.IP6.arpa";
  auto b = ask(*zone_, v6, type::kTXT);
  ASSERT_EQ(b.msg->authority.size(), 1u);
  EXPECT_EQ(b.msg->authority[0].name, "IP6.arpa.");  // a pointer into the question: its case
  EXPECT_EQ(b.msg->authority[0].ttl, opts_.negative_ttl);
}

TEST_F(ZoneLookupTest, InsecurePodAnswersAreRememberedForDrain) {
  ZoneOptions o = opts_;
  o.pod_mode = PodMode::kInsecure;
  ZoneBuilder b(o);
  auto z = b.apply(snap_);
  EXPECT_FALSE(b.last_served_ns(ip("10.9.9.9")));
  ask(*z, "10-9-9-9.any.pod.cluster.local", type::kAAAA, 0, 0, 500);  // NODATA: carries nothing
  EXPECT_FALSE(b.last_served_ns(ip("10.9.9.9")));
  ask(*z, "10-9-9-9.any.pod.cluster.local", type::kA, 0, 0, 700);
  EXPECT_EQ(b.last_served_ns(ip("10.9.9.9")), 700);
  // A known pod name is a pre-encoded answer, remembered like any other.
  ask(*z, "10-1-0-2.default.pod.cluster.local", type::kA, 0, 0, 800);
  EXPECT_EQ(b.last_served_ns(ip("10.1.0.2")), 800);
}

}  // namespace
}  // namespace endpointd::dns

namespace endpointd::dns {
namespace {

using namespace testing;

// An ExternalName naming a service of the zone: A and AAAA carry the CNAME, then the target's
// records owned by the target's name (compressed against the CNAME's rdata); other types get the
// CNAME alone; the question's case does not break the pointers.
TEST(ZoneLookupChase, InZoneExternalNameCarriesTheTargetsRecords) {
  auto web = service("default", "web", {"10.96.0.10", "fd00::10"});
  auto alias = service("default", "alias", {});
  auto& e = std::const_pointer_cast<model::ServiceState>(alias)->service;
  e.type = model::ServiceType::kExternalName;
  e.external_name = "Web.Default.svc.cluster.local";
  auto z = Zone::build(*snapshot({web, alias}), ZoneOptions{});
  auto a = ask(*z, "ALIAS.default.svc.cluster.local", type::kA);
  ASSERT_TRUE(a.msg);
  ASSERT_EQ(a.msg->answer.size(), 2u);
  EXPECT_EQ(a.msg->answer[0].type, type::kCNAME);
  EXPECT_EQ(a.msg->answer[0].name, "ALIAS.default.svc.cluster.local.");  // the question's case
  EXPECT_EQ(a.msg->answer[1].type, type::kA);
  EXPECT_EQ(a.msg->answer[1].name, "web.default.svc.cluster.local.");
  EXPECT_EQ(a.msg->answer[1].text, "10.96.0.10");
  auto aaaa = ask(*z, "alias.default.svc.cluster.local", type::kAAAA);
  ASSERT_EQ(aaaa.msg->answer.size(), 2u);
  EXPECT_EQ(aaaa.msg->answer[1].text, "fd00::10");
  for (uint16_t t : {type::kTXT, type::kCNAME, type::kSRV}) {
    auto other = ask(*z, "alias.default.svc.cluster.local", t);
    ASSERT_EQ(other.msg->answer.size(), 1u) << type_name(t);
    EXPECT_EQ(other.msg->answer[0].type, type::kCNAME);
  }
  // A target outside the zone, or a service that does not exist: the CNAME alone.
  e.external_name = "nope.default.svc.cluster.local";
  auto z2 = Zone::build(*snapshot({web, alias}), ZoneOptions{});
  EXPECT_EQ(ask(*z2, "alias.default.svc.cluster.local", type::kA).msg->answer.size(), 1u);
}

}  // namespace
}  // namespace endpointd::dns
