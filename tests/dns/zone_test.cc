// The zone built from a Snapshot, asked through the hot path (answer()): every record form.
#include "dns/zone.h"

#include <gtest/gtest.h>

#include "dns/answer.h"
#include "tests/dns/test_util.h"

namespace endpointd::dns {
namespace {

using namespace testing;

struct Asked {
  Reply reply;
  std::optional<Message> msg;
  std::vector<uint8_t> bytes;
};

Asked ask(const Zone& z, const std::string& name, uint16_t qtype, uint16_t edns = 0,
          size_t limit = 0, int64_t now = 1) {
  auto pkt = query(name, qtype, edns);
  Query q = parse_query(pkt);
  Asked a;
  a.bytes.resize(65535);
  a.reply = answer(z, pkt, q, a.bytes.data(), a.bytes.size(), limit ? limit : q.udp_limit(), now);
  a.bytes.resize(a.reply.size);
  if (a.reply.action == Reply::Action::kSend) a.msg = parse_message(a.bytes);
  return a;
}

std::vector<std::string> texts(const std::vector<Record>& rs, uint16_t t = 0) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    if (t == 0 || r.type == t) out.push_back(r.text);
  std::sort(out.begin(), out.end());
  return out;
}

class ZoneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto web = service("default", "web", {"10.96.0.10", "fd00::10"});
    auto v4only = service("default", "v4only", {"10.96.0.11"});
    auto headless = service(
        "default", "db", {"None"},
        {endpoint("10.1.0.1", true, false, "db-0"), endpoint("10.1.0.2"),
         endpoint("10.1.0.3", false), endpoint("10.1.0.4", true, true), endpoint("fd00::1:5")});
    auto empty = service("default", "empty", {"None"}, {endpoint("10.1.1.1", false)});
    auto pub = service("default", "pub", {"None"}, {endpoint("10.1.2.1", false)});
    std::const_pointer_cast<model::ServiceState>(pub)->service.publish_not_ready_addresses = true;
    auto ext = service("default", "ext", {});
    auto& e = std::const_pointer_cast<model::ServiceState>(ext)->service;
    e.type = model::ServiceType::kExternalName;
    e.external_name = "example.org";
    snap_ = snapshot({web, v4only, headless, empty, pub, ext});
    zone_ = Zone::build(*snap_, opts_);
  }
  ZoneOptions opts_;
  model::SnapshotPtr snap_;
  ZonePtr zone_;
};

TEST_F(ZoneTest, ClusterIpPerFamily) {
  auto a = ask(*zone_, "web.default.svc.cluster.local", type::kA);
  ASSERT_TRUE(a.msg);
  EXPECT_EQ(a.msg->rcode, 0);
  EXPECT_TRUE(a.msg->flags & flag::kAA);
  EXPECT_EQ(texts(a.msg->answer), std::vector<std::string>{"10.96.0.10"});
  EXPECT_EQ(a.msg->answer[0].ttl, 5u);
  auto aaaa = ask(*zone_, "web.default.svc.cluster.local", type::kAAAA);
  EXPECT_EQ(texts(aaaa.msg->answer), std::vector<std::string>{"fd00::10"});
}

TEST_F(ZoneTest, NoDataForMissingFamilyWithSoa) {
  auto a = ask(*zone_, "v4only.default.svc.cluster.local", type::kAAAA);
  ASSERT_TRUE(a.msg);
  EXPECT_EQ(a.msg->rcode, 0);
  EXPECT_TRUE(a.msg->answer.empty());
  ASSERT_EQ(a.msg->authority.size(), 1u);
  EXPECT_EQ(a.msg->authority[0].type, type::kSOA);
  EXPECT_EQ(a.msg->authority[0].name, "cluster.local.");
  EXPECT_EQ(a.msg->authority[0].ttl, opts_.negative_ttl);
}

TEST_F(ZoneTest, NxDomainWithSoa) {
  auto a = ask(*zone_, "nope.default.svc.cluster.local", type::kA);
  EXPECT_EQ(a.msg->rcode, 3);
  ASSERT_EQ(a.msg->authority.size(), 1u);
  EXPECT_EQ(a.msg->authority[0].type, type::kSOA);
}

TEST_F(ZoneTest, EmptyNonTerminalsAreNoData) {
  for (auto n : {"default.svc.cluster.local", "svc.cluster.local", "cluster.local"}) {
    auto a = ask(*zone_, n, type::kA);
    EXPECT_EQ(a.msg->rcode, 0) << n;
    EXPECT_TRUE(a.msg->answer.empty()) << n;
  }
  auto soa = ask(*zone_, "cluster.local", type::kSOA);
  EXPECT_EQ(soa.msg->answer.size(), 1u);
}

TEST_F(ZoneTest, HeadlessReadyEndpointsOnly) {
  auto a = ask(*zone_, "db.default.svc.cluster.local", type::kA);
  EXPECT_EQ(texts(a.msg->answer), (std::vector<std::string>{"10.1.0.1", "10.1.0.2"}));
  auto aaaa = ask(*zone_, "db.default.svc.cluster.local", type::kAAAA);
  EXPECT_EQ(texts(aaaa.msg->answer), (std::vector<std::string>{"fd00::1:5"}));
}

TEST_F(ZoneTest, HeadlessHostnames) {
  EXPECT_EQ(texts(ask(*zone_, "db-0.db.default.svc.cluster.local", type::kA).msg->answer),
            std::vector<std::string>{"10.1.0.1"});
  EXPECT_EQ(texts(ask(*zone_, "10-1-0-2.db.default.svc.cluster.local", type::kA).msg->answer),
            std::vector<std::string>{"10.1.0.2"});
  EXPECT_EQ(ask(*zone_, "10-1-0-3.db.default.svc.cluster.local", type::kA).msg->rcode, 3);
  EXPECT_EQ(ask(*zone_, "10-1-0-4.db.default.svc.cluster.local", type::kA).msg->rcode, 3);
}

TEST_F(ZoneTest, HeadlessWithoutReadyIsNxDomain) {
  EXPECT_EQ(ask(*zone_, "empty.default.svc.cluster.local", type::kA).msg->rcode, 3);
}

TEST_F(ZoneTest, PublishNotReadyAddresses) {
  EXPECT_EQ(texts(ask(*zone_, "pub.default.svc.cluster.local", type::kA).msg->answer),
            std::vector<std::string>{"10.1.2.1"});
}

TEST_F(ZoneTest, SrvClusterIp) {
  auto a = ask(*zone_, "_http._tcp.web.default.svc.cluster.local", type::kSRV);
  ASSERT_EQ(a.msg->answer.size(), 1u);
  EXPECT_EQ(a.msg->answer[0].srv_port, 80);
  EXPECT_EQ(a.msg->answer[0].text, "web.default.svc.cluster.local.");
  EXPECT_EQ(texts(a.msg->additional), (std::vector<std::string>{"10.96.0.10", "fd00::10"}));
  EXPECT_EQ(ask(*zone_, "_tcp.web.default.svc.cluster.local", type::kA).msg->rcode, 0);
}

TEST_F(ZoneTest, SrvHeadlessPerEndpoint) {
  auto a = ask(*zone_, "_http._tcp.db.default.svc.cluster.local", type::kSRV);
  EXPECT_EQ(texts(a.msg->answer),
            (std::vector<std::string>{"10-1-0-2.db.default.svc.cluster.local.",
                                      "db-0.db.default.svc.cluster.local.",
                                      "fd00--1-5.db.default.svc.cluster.local."}));
  EXPECT_EQ(a.msg->answer[0].srv_port, 8080);
  EXPECT_EQ(texts(a.msg->additional),
            (std::vector<std::string>{"10.1.0.1", "10.1.0.2", "fd00::1:5"}));
}

TEST_F(ZoneTest, Ptr) {
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

TEST_F(ZoneTest, ExternalNameCname) {
  for (uint16_t t : {type::kA, type::kAAAA, type::kCNAME}) {
    auto a = ask(*zone_, "ext.default.svc.cluster.local", t);
    ASSERT_EQ(a.msg->answer.size(), 1u);
    EXPECT_EQ(a.msg->answer[0].type, type::kCNAME);
    EXPECT_EQ(a.msg->answer[0].text, "example.org.");
  }
}

TEST_F(ZoneTest, DnsVersion) {
  auto a = ask(*zone_, "dns-version.cluster.local", type::kTXT);
  ASSERT_EQ(a.msg->answer.size(), 1u);
  EXPECT_EQ(a.msg->answer[0].text, "1.1.0");
}

TEST_F(ZoneTest, CaseInsensitiveWithCaseEchoed) {
  auto a = ask(*zone_, "WEB.Default.SVC.cluster.LOCAL", type::kA);
  EXPECT_EQ(texts(a.msg->answer), std::vector<std::string>{"10.96.0.10"});
  // The question is echoed byte for byte.
  auto pkt = query("WEB.Default.SVC.cluster.LOCAL", type::kA);
  EXPECT_TRUE(std::equal(pkt.begin() + 12, pkt.end(), a.bytes.begin() + 12));
  EXPECT_EQ(a.msg->qname, "WEB.Default.SVC.cluster.LOCAL.");
}

TEST_F(ZoneTest, OutsideZoneIsForwarded) {
  EXPECT_EQ(ask(*zone_, "example.org", type::kA).reply.action, Reply::Action::kForward);
  EXPECT_EQ(ask(*zone_, "local", type::kA).reply.action, Reply::Action::kForward);
}

TEST_F(ZoneTest, AnyIsMinimal) {
  auto a = ask(*zone_, "web.default.svc.cluster.local", type::kANY);
  EXPECT_EQ(a.msg->answer.size(), 1u);
}

TEST_F(ZoneTest, ServFailBeforeSync) {
  auto z = Zone::build(*snapshot({}, 0, false), opts_);
  EXPECT_EQ(ask(*z, "web.default.svc.cluster.local", type::kA).msg->rcode, 2);
  EXPECT_EQ(ask(*Zone::unsynced(opts_), "cluster.local", type::kSOA).msg->rcode, 2);
  EXPECT_EQ(ask(*z, "example.org", type::kA).reply.action, Reply::Action::kForward);
}

TEST_F(ZoneTest, RefusedForOtherClassesAndTransfers) {
  auto pkt = query("web.default.svc.cluster.local", type::kA);
  store_u16(pkt.data() + pkt.size() - 2, 3);  // CHAOS
  Query q = parse_query(pkt);
  uint8_t out[512];
  Reply r = answer(*zone_, pkt, q, out, sizeof out, 512, 1);
  EXPECT_EQ(r.rcode, 5);
  EXPECT_LE(r.size, pkt.size());
  EXPECT_EQ(ask(*zone_, "cluster.local", type::kAXFR).msg->rcode, 5);
}

TEST_F(ZoneTest, EdnsEchoedAndBadVers) {
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

TEST_F(ZoneTest, TruncationWhenTooLarge) {
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

TEST_F(ZoneTest, PodRecords) {
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

TEST_F(ZoneTest, TerminatingLeavesAndLastServedIsKept) {
  ZoneBuilder b(opts_);
  auto z = b.apply(snap_);
  auto a = ask(*z, "db.default.svc.cluster.local", type::kA, 0, 0, 1000);
  ASSERT_EQ(a.msg->answer.size(), 2u);
  EXPECT_EQ(b.last_served_ns(ip("10.1.0.2")), 1000);
  EXPECT_FALSE(b.last_served_ns(ip("10.1.0.4")));  // terminating: never handed out
  EXPECT_FALSE(b.last_served_ns(ip("10.9.9.9")));
}

TEST_F(ZoneTest, ReverseNoDataCarriesTheSoa) {
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

TEST_F(ZoneTest, InsecurePodAnswersAreRememberedForDrain) {
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
