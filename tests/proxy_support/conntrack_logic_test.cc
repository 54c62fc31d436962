// The conntrack matching and counting rules (shared by the netlink implementation and the
// fake), and the sysctl writer against a directory standing in for /proc/sys.
#include <netinet/in.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(ct.list()->size(), 2u);
  ct.fail_with("netlink down");
  EXPECT_FALSE(ct.delete_flows({FlowMatch{}}));
  EXPECT_EQ(ct.delete_calls().size(), 2u);
}

class SysctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("epd-sysctl-" + std::to_string(getpid()));
    std::filesystem::create_directories(root_ / "net/netfilter");
    write("net/netfilter/nf_conntrack_max", "65536");
    write("net/netfilter/nf_conntrack_tcp_timeout_established", "432000");
    write("net/netfilter/nf_conntrack_tcp_timeout_close_wait", "60");
    write("net/netfilter/nf_conntrack_tcp_be_liberal", "0");
    write("net/netfilter/nf_conntrack_udp_timeout", "30");
    write("hashsize", "16384");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void write(const std::string& rel, const std::string& v) { std::ofstream(root_ / rel) << v; }
  std::string read(const std::string& rel) {
    std::string v;
    std::ifstream(root_ / rel) >> v;
    return v;
  }
  std::filesystem::path root_;
};

TEST_F(SysctlTest, WritesOnlyWhatIsConfiguredAndDifferent) {
  ConntrackSysctls s;
  s.max_per_core = 32768;
  s.min = 131072;
  s.tcp_timeout_established_seconds = 86400;
  s.tcp_timeout_close_wait_seconds = 60;  // already so
  s.tcp_be_liberal = true;
  auto r = apply_conntrack_sysctls(s, 8, root_.string(), (root_ / "hashsize").string());
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(*r,
            (std::vector<std::string>{"hashsize=65536", "net.netfilter.nf_conntrack_max=262144",
                                      "net.netfilter.nf_conntrack_tcp_timeout_established=86400",
                                      "net.netfilter.nf_conntrack_tcp_be_liberal=1"}));
  EXPECT_EQ(read("net/netfilter/nf_conntrack_max"), "262144");
  EXPECT_EQ(read("net/netfilter/nf_conntrack_udp_timeout"), "30");  // not configured
  // A second run finds everything in place.
  EXPECT_TRUE(
      apply_conntrack_sysctls(s, 8, root_.string(), (root_ / "hashsize").string())->empty());
}

TEST_F(SysctlTest, NeverLowersTheMaximum) {
  ConntrackSysctls s;
  s.max_per_core = 1000;
  s.min = 2000;
  auto r = apply_conntrack_sysctls(s, 2, root_.string(), "");
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->empty());
  EXPECT_EQ(read("net/netfilter/nf_conntrack_max"), "65536");
}

TEST_F(SysctlTest, AnUnwritableSettingIsAnError) {
  ConntrackSysctls s;
  s.udp_timeout_stream_seconds = 120;  // its file does not exist in this tree
  auto r = apply_conntrack_sysctls(s, 1, (root_ / "missing").string(), "");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("nf_conntrack_udp_timeout_stream"), std::string::npos);
}

}  // namespace
}  // namespace endpointd::proxy
