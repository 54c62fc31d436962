// The UDP conntrack sweep after a full sync (no root): which entries UdpServiceIndex calls
// stale, and that a new ProxySink deletes, at its first synced full sync, the entries bound to
// endpoints that left while no agent ran.
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <gtest/gtest.h>

#include "pipeline/ack_board.h"
#include "proxy/sink.h"
#include "tests/proxy_support/fake_conntrack.h"
#include "tests/proxy_support/sink_helpers.h"

namespace endpointd::proxy {
namespace {

using support::ip;
using support::snapshot;
using support::state;
using support::udp_endpoint;
using support::udp_service;

// client:40000 -> dst:dport, answered by src:sport (src == dst and sport == dport: no DNAT).
Flow udp_flow(const char* dst, uint16_t dport, const char* src, uint16_t sport,
              uint16_t client_port = 40000) {
  Flow f;
  f.l4proto = IPPROTO_UDP;
  f.orig_src = ip("10.244.9.9");
  f.orig_src_port = client_port;
  f.orig_dst = ip(dst);
  f.orig_dst_port = dport;
  f.reply_src = ip(src);
  f.reply_src_port = sport;
  f.reply_dst = f.orig_src;
  f.reply_dst_port = client_port;
  return f;
}

NodeContext node_context() {
  NodeContext c;
  c.node_name = "node-1";
  c.node_ips = {ip("192.168.77.2"), ip("192.168.78.2"), ip("127.0.0.1")};
  c.node_port_addresses = {*model::IpPrefix::parse("192.168.77.0/24"),
                           *model::IpPrefix::parse("127.0.0.0/8")};
  c.cluster_cidrs = {*model::IpPrefix::parse("10.244.0.0/16")};
  return c;
}

TEST(UdpServiceIndex, StaleMeansBoundElsewhereOrBlackholedWhileThereAreEndpoints) {
  auto dns = udp_service("dns", "10.96.0.10", 53);
  dns.type = model::ServiceType::kLoadBalancer;
  dns.external_ips = {ip("203.0.113.1")};
  dns.load_balancer_ips = {ip("203.0.113.2")};
  dns.ports[0].node_port = 30053;
  auto empty = udp_service("empty", "10.96.0.11", 53);
  auto headless = udp_service("headless", "10.96.0.12", 53);
  headless.headless = true;
  auto snap =
      snapshot(1, {state(dns, {udp_endpoint("10.244.1.10", 5353), udp_endpoint("10.244.1.11", 5353),
                               udp_endpoint("10.244.1.12", 5353, /*ready=*/false),
                               udp_endpoint("10.244.1.13", 5353, false, /*terminating=*/true)}),
                   state(empty, {}), state(headless, {udp_endpoint("10.244.1.20", 53)})});
  UdpServiceIndex index(*snap, node_context());
  // 3 service addresses + 1 NodePort address (192.168.78.2 is not selected, 127.0.0.1 never)
  // + the empty service's cluster IP; the headless service has none.
  EXPECT_EQ(index.addresses(), 5u);

  for (const char* vip : {"10.96.0.10", "203.0.113.1", "203.0.113.2"}) {
    SCOPED_TRACE(vip);
    EXPECT_FALSE(index.stale(udp_flow(vip, 53, "10.244.1.10", 5353)));
    EXPECT_FALSE(index.stale(udp_flow(vip, 53, "10.244.1.11", 5353)));
    // The terminating, serving endpoint may still be chosen (fallback): kept.
    EXPECT_FALSE(index.stale(udp_flow(vip, 53, "10.244.1.13", 5353)));
    // Gone, not ready, or on a port the endpoint no longer has: stale.
    EXPECT_TRUE(index.stale(udp_flow(vip, 53, "10.244.1.99", 5353)));
    EXPECT_TRUE(index.stale(udp_flow(vip, 53, "10.244.1.12", 5353)));
    EXPECT_TRUE(index.stale(udp_flow(vip, 53, "10.244.1.10", 5354)));
    // Not DNAT'd while the service has endpoints: made when it had none.
    EXPECT_TRUE(index.stale(udp_flow(vip, 53, vip, 53)));
  }
  EXPECT_FALSE(index.stale(udp_flow("192.168.77.2", 30053, "10.244.1.10", 5353)));
  EXPECT_TRUE(index.stale(udp_flow("192.168.77.2", 30053, "10.244.1.99", 5353)));
  EXPECT_TRUE(index.stale(udp_flow("192.168.77.2", 30053, "192.168.77.2", 30053)));
  // Addresses endpointd does not serve that port on are never touched.
  EXPECT_FALSE(index.stale(udp_flow("192.168.78.2", 30053, "10.244.1.99", 5353)));
  EXPECT_FALSE(index.stale(udp_flow("127.0.0.1", 30053, "10.244.1.99", 5353)));
  EXPECT_FALSE(index.stale(udp_flow("10.96.0.10", 54, "10.244.1.99", 5353)));
  EXPECT_FALSE(index.stale(udp_flow("10.96.0.12", 53, "10.244.1.99", 53)));
  EXPECT_FALSE(index.stale(udp_flow("8.8.8.8", 53, "8.8.8.8", 53)));
  // TCP entries never.
  Flow tcp = udp_flow("10.96.0.10", 53, "10.244.1.99", 5353);
  tcp.l4proto = IPPROTO_TCP;
  EXPECT_FALSE(index.stale(tcp));
  // A service without endpoints: its unanswered entries wait for endpoints; one still bound
  // to an endpoint it had is stale.
  EXPECT_FALSE(index.stale(udp_flow("10.96.0.11", 53, "10.96.0.11", 53)));
  EXPECT_TRUE(index.stale(udp_flow("10.96.0.11", 53, "10.244.1.10", 53)));
}

TEST(UdpServiceIndex, TwoServicesOnOneAddressKeepEachOthersEntries) {
  auto a = udp_service("a", "10.96.0.20", 53);
  a.external_ips = {ip("203.0.113.5")};
  auto b = udp_service("b", "10.96.0.21", 53);
  b.external_ips = {ip("203.0.113.5")};
  auto snap = snapshot(1, {state(a, {udp_endpoint("10.244.1.10", 53)}),
                           state(b, {udp_endpoint("10.244.1.11", 53)})});
  UdpServiceIndex index(*snap, NodeContext{});
  EXPECT_FALSE(index.stale(udp_flow("203.0.113.5", 53, "10.244.1.10", 53)));
  EXPECT_FALSE(index.stale(udp_flow("203.0.113.5", 53, "10.244.1.11", 53)));
  EXPECT_TRUE(index.stale(udp_flow("203.0.113.5", 53, "10.244.1.12", 53)));
  EXPECT_TRUE(index.stale(udp_flow("10.96.0.20", 53, "10.244.1.11", 53)));
}

TEST(UdpServiceIndex, NoUdpServiceNoSweep) {
  model::Service web = udp_service("web", "10.96.0.30", 80);
  web.ports[0].protocol = model::Protocol::kTCP;
  auto snap = snapshot(1, {state(web, {})});
  EXPECT_TRUE(UdpServiceIndex(*snap, node_context()).empty());
}

class SweepTest : public ::testing::Test {
 protected:
  std::unique_ptr<ProxySink> start_sink() {
    ProxySink::Options o;
    o.node = node_context();
    o.registry = &registry_;
    o.conntrack = &ct_;
    o.backoff_min = std::chrono::milliseconds(10);
    return std::make_unique<ProxySink>(&backend_, &board_, o);
  }
  double metric(const std::string& series) {
    std::string text = prometheus::TextSerializer().Serialize(registry_.Collect());
    auto pos = text.find("\n" + series + " ");
    if (pos == std::string::npos) return -1;
    return std::stod(text.substr(pos + series.size() + 2));
  }
  double reconciler_deleted(const char* family) {
    return metric(std::string("kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"") +
                  family + "\"}");
  }
  // endpointd's name and kube-proxy's (summed over its families) count the same.
  double deleted_metric() {
    double ours = metric("endpointd_proxy_conntrack_deleted_total");
    double theirs = reconciler_deleted("IPv4") + reconciler_deleted("IPv6");
    return ours == theirs ? ours : -2;
  }

  support::AcceptingBackend backend_;
  pipeline::AckBoard board_;
  prometheus::Registry registry_;
  FakeConntrack ct_;
};

TEST_F(SweepTest, ANewSinkDeletesEntriesOfEndpointsThatLeftWhileItWasDown) {
  auto svc = udp_service("dns", "10.96.0.10", 53);
  Flow to_a = udp_flow("10.96.0.10", 53, "10.244.1.10", 5353, 40001);
  Flow to_b = udp_flow("10.96.0.10", 53, "10.244.1.11", 5353, 40002);
  Flow other = udp_flow("8.8.8.8", 53, "8.8.8.8", 53, 40003);
  ct_.add(to_a);
  ct_.add(to_b);
  ct_.add(other);
  auto sink = start_sink();
  // Endpoint A is gone from the state the new process starts with.
  auto s1 = snapshot(1, {state(svc, {udp_endpoint("10.244.1.11", 5353)})});
  sink->apply(s1, model::diff(nullptr, *s1));
  ASSERT_TRUE(sink->synced());
  EXPECT_EQ(ct_.sweeps(), 1u);
  EXPECT_EQ(*ct_.list(), (std::vector<Flow>{to_b, other}));
  EXPECT_EQ(sink->conntrack_deleted(), 1u);
  EXPECT_EQ(deleted_metric(), 1);
  EXPECT_EQ(reconciler_deleted("IPv4"), 1);

  // Incremental commits do not sweep; a full sync (here: requested, as after a foreign
  // change) does.
  ct_.add(to_a);
  auto s2 = snapshot(
      2, {state(svc, {udp_endpoint("10.244.1.11", 5353), udp_endpoint("10.244.1.12", 5353)})});
  sink->apply(s2, model::diff(s1.get(), *s2));
  EXPECT_EQ(ct_.sweeps(), 1u);
  EXPECT_EQ(ct_.list()->size(), 3u);
  sink->request_resync();
  ASSERT_TRUE(sink->wait_idle(std::chrono::seconds(5)));
  EXPECT_EQ(ct_.sweeps(), 2u);
  EXPECT_EQ(ct_.list()->size(), 2u);
  EXPECT_EQ(sink->conntrack_deleted(), 2u);
  EXPECT_EQ(deleted_metric(), 2);
  // Each cleanup is timed under kube-proxy's reconciler name: the sweep and the delta's, one
  // walk for both of the node's families.
  for (const char* f : {"IPv4", "IPv6"})
    EXPECT_EQ(metric(std::string("kubeproxy_conntrack_reconciler_sync_duration_seconds_count{"
                                 "ip_family=\"") +
                     f + "\"}"),
              2)
        << f;
}

// kube-proxy counts its reconciler's deletions per family; so does endpointd, by each
// entry's own family, though one walk takes both.
TEST_F(SweepTest, DeletedEntriesAreCountedUnderTheirFamily) {
  auto v4 = udp_service("dns", "10.96.0.10", 53);
  auto v6 = udp_service("dns6", "fd00:96::10", 53);
  auto v6_flow = [](const char* src, uint16_t client_port) {
    Flow f = udp_flow("fd00:96::10", 53, src, 5353, client_port);
    f.orig_src = f.reply_dst = ip("fd00:244:9::9");
    return f;
  };
  ct_.add(udp_flow("10.96.0.10", 53, "10.244.1.10", 5353, 40001));  // endpoint gone
  ct_.add(v6_flow("fd00:244:1::10", 40002));                        // endpoint gone
  ct_.add(v6_flow("fd00:244:1::11", 40003));                        // gone too
  Flow kept = v6_flow("fd00:244:1::12", 40004);
  ct_.add(kept);
  auto sink = start_sink();
  auto s1 = snapshot(1, {state(v4, {udp_endpoint("10.244.1.11", 5353)}),
                         state(v6, {udp_endpoint("fd00:244:1::12", 5353)})});
  sink->apply(s1, model::diff(nullptr, *s1));
  ASSERT_TRUE(sink->synced());
  EXPECT_EQ(*ct_.list(), std::vector<Flow>{kept});
  EXPECT_EQ(reconciler_deleted("IPv4"), 1);
  EXPECT_EQ(reconciler_deleted("IPv6"), 2);
  EXPECT_EQ(deleted_metric(), 3);
}

TEST_F(SweepTest, AServiceThatHadNoEndpointsLosesItsBlackholedEntriesAtStart) {
  auto svc = udp_service("dns", "10.96.0.10", 53);
  ct_.add(udp_flow("10.96.0.10", 53, "10.96.0.10", 53));
  auto sink = start_sink();
  auto s1 = snapshot(1, {state(svc, {udp_endpoint("10.244.1.11", 5353)})});
  sink->apply(s1, model::diff(nullptr, *s1));
  EXPECT_TRUE(ct_.list()->empty());
  EXPECT_EQ(sink->conntrack_deleted(), 1u);
}

TEST_F(SweepTest, NoSweepOverAPartialStateButAtTheFirstSyncedCommit) {
  auto svc = udp_service("dns", "10.96.0.10", 53);
  Flow to_a = udp_flow("10.96.0.10", 53, "10.244.1.10", 5353);
  ct_.add(to_a);
  auto sink = start_sink();
  // Services listed, endpoints not yet: every entry would look stale.
  auto s1 = snapshot(1, {state(svc, {})}, /*synced=*/false);
  sink->apply(s1, model::diff(nullptr, *s1));
  EXPECT_EQ(ct_.sweeps(), 0u);
  EXPECT_EQ(ct_.list()->size(), 1u);
  auto s2 = snapshot(2, {state(svc, {udp_endpoint("10.244.1.10", 5353)})});
  sink->apply(s2, model::diff(s1.get(), *s2));
  EXPECT_EQ(ct_.sweeps(), 1u);
  EXPECT_EQ(ct_.list()->size(), 1u);  // bound to an endpoint it has: kept
  // A later incremental commit does not sweep again.
  auto s3 = snapshot(3, {state(svc, {udp_endpoint("10.244.1.11", 5353)})});
  sink->apply(s3, model::diff(s2.get(), *s3));
  EXPECT_EQ(ct_.sweeps(), 1u);
  EXPECT_TRUE(ct_.list()->empty());  // the delta's cleanup: A left
}

TEST_F(SweepTest, AFailedSweepIsCountedAndRetriedAtTheNextCommit) {
  auto svc = udp_service("dns", "10.96.0.10", 53);
  ct_.add(udp_flow("10.96.0.10", 53, "10.244.1.10", 5353));
  ct_.fail_with("EPERM (fake)");
  auto sink = start_sink();
  auto s1 = snapshot(1, {state(svc, {udp_endpoint("10.244.1.11", 5353)})});
  sink->apply(s1, model::diff(nullptr, *s1));
  EXPECT_EQ(sink->conntrack_failures(), 1u);
  ct_.fail_with("");
  auto s2 = snapshot(
      2, {state(svc, {udp_endpoint("10.244.1.11", 5353), udp_endpoint("10.244.1.12", 5353)})});
  sink->apply(s2, model::diff(s1.get(), *s2));
  EXPECT_EQ(ct_.sweeps(), 2u);
  EXPECT_TRUE(ct_.list()->empty());
  EXPECT_EQ(sink->conntrack_deleted(), 1u);
}

}  // namespace
}  // namespace endpointd::proxy
