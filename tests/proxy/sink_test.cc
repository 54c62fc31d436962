// The proxy sink against a fake backend (no root): acknowledgement only after commit, resync
// with backoff after a rejected batch, /healthz semantics, metric names, UDP conntrack cleanup
// and the node context following the Node object.
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <functional>

#include "pipeline/ack_board.h"
#include "proxy/sink.h"
#include "tests/proxy/fixtures.h"
#include "tests/proxy_support/fake_conntrack.h"

namespace endpointd::proxy {
namespace {

using std::chrono::milliseconds;

class FakeBackend : public Backend {
 public:
  // Called inside full_sync/apply, before the result is returned (the "kernel" has the batch
  // but has not answered yet).
  std::function<void()> during;
  int fail_full = 0;   // the next n full syncs fail
  int fail_apply = 0;  // the next n batches fail
  int full_calls = 0;
  int apply_calls = 0;
  std::vector<ProxySink::Clock::time_point> full_times;
  std::vector<TableChanges> last_changes;

  Result<BatchStats> full_sync(const std::vector<const Table*>&) override {
    std::lock_guard l(mu);
    ++full_calls;
    full_times.push_back(ProxySink::Clock::now());
    if (during) during();
    if (fail_full > 0) {
      --fail_full;
      return Error{"EINVAL (fake)"};
    }
    return BatchStats{1, 1, full_elements};
  }
  Result<BatchStats> apply(const std::vector<TableChanges>& changes) override {
    std::lock_guard l(mu);
    ++apply_calls;
    last_changes = changes;
    if (during) during();
    if (fail_apply > 0) {
      --fail_apply;
      return Error{"ENOENT (fake)"};
    }
    size_t elements = 0;
    for (const auto& c : changes) elements += c.add_elements.size() + c.del_elements.size();
    return BatchStats{changes.size(), 1, elements};
  }
  bool fits(const std::vector<TableChanges>&) const override { return room; }
  size_t full_elements = 7;  // what a full sync reports it changed
  bool room = true;          // whether the kernel's sets have room for a batch
  std::mutex mu;
};

model::SnapshotPtr web(uint64_t g, int endpoints, model::Protocol proto = model::Protocol::kTCP) {
  std::vector<model::MergedEndpoint> eps;
  for (int i = 0; i < endpoints; ++i) {
    std::string a = "10.244.1." + std::to_string(i + 2);
    eps.push_back(testing::endpoint(a.c_str(), 8080, "node-a", true, false, true, proto));
  }
  return testing::snapshot(
      g, {testing::state(testing::service("web", {testing::ip("10.96.0.10")}, 80, proto), eps)});
}

model::Delta delta(const model::SnapshotPtr& a, const model::SnapshotPtr& b) {
  return model::diff(a.get(), *b);
}

uint64_t board_generation(const pipeline::AckBoard& board) {
  for (const auto& e : board.entries()) {
    if (e.consumer == "proxy") return e.generation();
  }
  return 0;
}

ProxySink::Options options() {
  ProxySink::Options o;
  o.node = testing::node_context();
  o.backoff_min = milliseconds(20);
  o.backoff_max = milliseconds(80);
  o.jitter_seed = 7;
  return o;
}

// options(), with the sink's metrics registered in `reg`.
ProxySink::Options metered(prometheus::Registry* reg) {
  auto o = options();
  o.registry = reg;
  return o;
}

TEST(ProxySink, AppliedOnlyAfterTheBatchCommitted) {
  FakeBackend be;
  pipeline::AckBoard board;
  ProxySink sink(&be, &board, options());
  std::vector<uint64_t> seen_during;
  be.during = [&] { seen_during.push_back(board_generation(board)); };
  auto s1 = web(1, 2);
  sink.apply(s1, delta(nullptr, s1));
  EXPECT_EQ(board_generation(board), 1u);
  auto s2 = web(2, 3);
  sink.apply(s2, delta(s1, s2));
  EXPECT_EQ(board_generation(board), 2u);
  // While the kernel held each batch, the board still showed the generation before it.
  EXPECT_EQ(seen_during, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(be.full_calls, 1);
  EXPECT_EQ(be.apply_calls, 1);
}

// A change that would overfill a set made with a size is a full sync (which makes the set anew,
// larger), not a batch the kernel would refuse: no failure, and the change is applied.
TEST(ProxySink, AChangeThatOutgrowsASetIsAFullSync) {
  FakeBackend be;
  pipeline::AckBoard board;
  ProxySink sink(&be, &board, options());
  auto s1 = web(1, 2);
  sink.apply(s1, delta(nullptr, s1));
  be.room = false;
  auto s2 = web(2, 3);
  sink.apply(s2, delta(s1, s2));
  EXPECT_EQ(be.full_calls, 2);
  EXPECT_EQ(be.apply_calls, 0);
  EXPECT_EQ(sink.failures(), 0u);
  EXPECT_EQ(board_generation(board), 2u);
  be.room = true;
  auto s3 = web(3, 4);
  sink.apply(s3, delta(s2, s3));
  EXPECT_EQ(be.apply_calls, 1);
  EXPECT_EQ(board_generation(board), 3u);
}

TEST(ProxySink, RejectedBatchResyncsWithBackoffAndKeepsTheLastGoodState) {
  FakeBackend be;
  pipeline::AckBoard board;
  prometheus::Registry reg;
  ProxySink sink(&be, &board, metered(&reg));
  auto s1 = web(1, 2);
  sink.apply(s1, delta(nullptr, s1));
  ASSERT_TRUE(sink.synced());

  {
    std::lock_guard l(be.mu);
    be.fail_apply = 1;
    be.fail_full = 2;  // the first two resyncs fail too
  }
  auto s2 = web(2, 3);
  sink.apply(s2, delta(s1, s2));
  // Not acknowledged: the last good generation is what the board (and the kernel) has.
  EXPECT_EQ(board_generation(board), 1u);
  EXPECT_GE(sink.failures(), 1u);  // the resync thread may already have failed once more
  ASSERT_TRUE(sink.wait_idle(milliseconds(5000)));
  EXPECT_EQ(board_generation(board), 2u);
  EXPECT_EQ(sink.failures(), 3u);  // the batch and two full syncs
  std::lock_guard l(be.mu);
  ASSERT_EQ(be.full_calls, 4);  // the first sync, two failed resyncs, the good one
  // Backoff: the gap grows after each failed full sync (20 ms, then 40 ms, ±50 % jitter).
  auto gap1 = be.full_times[2] - be.full_times[1];
  auto gap2 = be.full_times[3] - be.full_times[2];
  EXPECT_GE(gap1, milliseconds(10));
  EXPECT_GE(gap2, milliseconds(20));
  std::string text = prometheus::TextSerializer().Serialize(reg.Collect());
  EXPECT_NE(
      text.find("kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 3"),
      std::string::npos)
      << text;
}

TEST(ProxySink, UnhealthyWhenAQueuedUpdateIsNotAppliedInTime) {
  FakeBackend be;
  pipeline::AckBoard board;
  auto o = options();
  o.health_timeout = milliseconds(1000);
  ProxySink sink(&be, &board, o);
  auto t0 = ProxySink::Clock::now();
  EXPECT_TRUE(sink.healthy(t0));
  sink.note_queued(t0);
  EXPECT_TRUE(sink.healthy(t0 + milliseconds(999)));
  EXPECT_FALSE(sink.healthy(t0 + milliseconds(1001)));
  auto s1 = web(1, 1);
  sink.apply(s1, delta(nullptr, s1));
  EXPECT_TRUE(sink.healthy(ProxySink::Clock::now() + milliseconds(5000)));  // nothing pending

  // A batch that keeps failing: healthy until the timeout, then not.
  {
    std::lock_guard l(be.mu);
    be.fail_apply = 1;
    be.fail_full = 1000;
  }
  auto t1 = ProxySink::Clock::now();
  sink.note_queued(t1);
  auto s2 = web(2, 2);
  sink.apply(s2, delta(s1, s2));
  EXPECT_FALSE(sink.healthy(t1 + milliseconds(1500)));
  EXPECT_EQ(board_generation(board), 1u);
}

TEST(ProxySink, MetricsUnderKubeProxyNames) {
  FakeBackend be;
  pipeline::AckBoard board;
  prometheus::Registry reg;
  ProxySink sink(&be, &board, metered(&reg));
  auto s1 = web(1, 1);
  sink.note_queued();
  sink.apply(s1, delta(nullptr, s1));
  auto s2 = web(2, 2);
  sink.note_queued();
  sink.apply(s2, delta(s1, s2));
  std::string text = prometheus::TextSerializer().Serialize(reg.Collect());
  for (const char* name :
       // kube-proxy 1.33's ip_family label: one commit programs both of the node's families,
       // so each sync counts under both; web is IPv4 only, so its changes count under IPv4.
       {"kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 2",
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 2",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
        // no trigger times here
        "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 0",
        "endpointd_proxy_queued_to_commit_duration_seconds_count 2",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv6\"}",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv4\"} 2",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv6\"} 0",
        "kubeproxy_sync_proxy_rules_service_changes_total{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending{ip_family=\"IPv4\"} 0",
        "kubeproxy_sync_proxy_rules_service_changes_pending{ip_family=\"IPv4\"} 0",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 0",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy="
        "\"internal\"} 0",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv6\",traffic_policy="
        "\"external\"} 0",
        // What the backend reported each batch changed: the full sync's 7 (the fake's), then
        // the elements of the one incremental batch.
        "endpointd_proxy_elements_written_total{sync=\"full\"} 7"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name;
  }
  size_t partial = 0;
  {
    std::lock_guard l(be.mu);
    for (const auto& c : be.last_changes) partial += c.add_elements.size() + c.del_elements.size();
  }
  ASSERT_GT(partial, 0u);
  std::string want =
      "endpointd_proxy_elements_written_total{sync=\"partial\"} " + std::to_string(partial);
  EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
}

// A single-stack node has no series for the family it lacks: an alert on a stale sync time
// stamp (`time() - kubeproxy_sync_proxy_rules_last_timestamp_seconds`) must not fire for it.
TEST(ProxySink, ASingleStackNodeHasNoSeriesForTheOtherFamily) {
  FakeBackend be;
  pipeline::AckBoard board;
  prometheus::Registry reg;
  auto o = metered(&reg);
  o.node.ipv6 = false;
  ProxySink sink(&be, &board, o);
  auto s1 = web(1, 1);
  sink.apply(s1, delta(nullptr, s1));
  std::string text = prometheus::TextSerializer().Serialize(reg.Collect());
  EXPECT_NE(text.find("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("ip_family=\"IPv6\""), std::string::npos) << text;
}

// kube-proxy's *_changes_pending: changes given and not yet in the kernel, counted while a
// rejected batch waits for its resync, back to 0 once the kernel has them.
TEST(ProxySink, PendingChangesAreCountedUntilTheKernelHasThem) {
  FakeBackend be;
  pipeline::AckBoard board;
  prometheus::Registry reg;
  ProxySink sink(&be, &board, metered(&reg));
  auto metrics = [&] { return prometheus::TextSerializer().Serialize(reg.Collect()); };
  auto s1 = web(1, 1);
  sink.apply(s1, delta(nullptr, s1));
  EXPECT_NE(
      metrics().find("kubeproxy_sync_proxy_rules_endpoint_changes_pending{ip_family=\"IPv4\"} 0"),
      std::string::npos);
  {
    std::lock_guard l(be.mu);
    be.fail_apply = 1;
    be.fail_full = 1000;
  }
  auto s2 = web(2, 3);  // web's endpoints change
  sink.apply(s2, delta(s1, s2));
  std::string text = metrics();
  EXPECT_NE(text.find("kubeproxy_sync_proxy_rules_endpoint_changes_pending{ip_family=\"IPv4\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kubeproxy_sync_proxy_rules_service_changes_pending{ip_family=\"IPv4\"} 0"),
            std::string::npos)
      << text;
  {
    std::lock_guard l(be.mu);
    be.fail_full = 0;
  }
  ASSERT_TRUE(sink.wait_idle(milliseconds(5000)));
  text = metrics();
  EXPECT_NE(text.find("kubeproxy_sync_proxy_rules_endpoint_changes_pending{ip_family=\"IPv4\"} 0"),
            std::string::npos)
      << text;
}

TEST(ProxySink, UdpConntrackCleanup) {
  FakeBackend be;
  pipeline::AckBoard board;
  FakeConntrack ct;
  auto o = options();
  o.conntrack = &ct;
  ProxySink sink(&be, &board, o);
  using model::Protocol;
  // No endpoints, then one: the entries that blackholed the VIP go.
  auto s0 = web(1, 0, Protocol::kUDP);
  sink.apply(s0, delta(nullptr, s0));
  Flow blackholed;
  blackholed.l4proto = 17;
  blackholed.orig_src = testing::ip("10.244.9.9");
  blackholed.orig_dst = testing::ip("10.96.0.10");
  blackholed.orig_dst_port = 80;
  blackholed.reply_src = testing::ip("10.96.0.10");
  blackholed.reply_src_port = 80;
  ct.add(blackholed);
  auto s1 = web(2, 2, Protocol::kUDP);
  sink.apply(s1, delta(s0, s1));
  EXPECT_TRUE(ct.list()->empty());
  EXPECT_EQ(sink.conntrack_deleted(), 1u);

  // An endpoint leaves: the entries bound to it go; the other endpoint's stay.
  Flow to_gone = blackholed, to_kept = blackholed;
  to_gone.reply_src = testing::ip("10.244.1.3");
  to_gone.reply_src_port = 8080;
  to_kept.reply_src = testing::ip("10.244.1.2");
  to_kept.reply_src_port = 8080;
  ct.add(to_gone);
  ct.add(to_kept);
  auto s2 = web(3, 1, Protocol::kUDP);
  sink.apply(s2, delta(s1, s2));
  ASSERT_EQ(ct.list()->size(), 1u);
  EXPECT_EQ(ct.list()->front(), to_kept);

  // TCP services never touch conntrack; a failing cleanup is counted and nothing else.
  size_t calls = ct.delete_calls().size();
  auto t1 = web(4, 1);
  sink.apply(t1, delta(s2, t1));
  auto t2 = web(5, 2);
  sink.apply(t2, delta(t1, t2));
  EXPECT_EQ(ct.delete_calls().size(), calls + 1);  // the UDP service leaving (t1 replaced it)
  ct.fail_with("EPERM (fake)");
  auto u = web(6, 1, Protocol::kUDP);
  sink.apply(u, delta(t2, u));
  auto u2 = web(7, 0, Protocol::kUDP);
  sink.apply(u2, delta(u, u2));
  EXPECT_EQ(sink.conntrack_failures(), 2u);
  EXPECT_EQ(board_generation(board), 7u);
}

TEST(ProxySink, StaleUdpFlowsArePure) {
  using model::Protocol;
  auto a = web(1, 3, Protocol::kUDP);
  auto b = web(2, 2, Protocol::kUDP);
  auto key = model::ServiceKey{"default", "web"};
  auto m = stale_udp_flows(a->find(key), b->find(key));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].reply_src, testing::ip("10.244.1.4"));
  EXPECT_TRUE(stale_udp_flows(b->find(key), b->find(key)).empty());
  // The service goes: every endpoint's entries.
  EXPECT_EQ(stale_udp_flows(a->find(key), nullptr).size(), 3u);
  // A new service with endpoints: its VIP's entries.
  auto n = stale_udp_flows(nullptr, a->find(key));
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].orig_dst, testing::ip("10.96.0.10"));
}

TEST(ProxySink, NodeContextFollowsTheNodeObject) {
  FakeBackend be;
  pipeline::AckBoard board;
  ProxySink sink(&be, &board, options());
  auto s1 = web(1, 1);
  sink.apply(s1, delta(nullptr, s1));
  EXPECT_EQ(sink.planner()->context().zone, "zone-a");
  auto node = std::make_shared<model::Node>();
  node->name = "node-a";
  node->zone = "zone-b";
  node->addresses = {{"InternalIP", "192.168.50.9"}, {"Hostname", "node-a"}};
  auto s2 = std::make_shared<model::Snapshot>(*s1);
  s2->generation = 2;
  s2->nodes = {node};
  model::Delta d;
  d.from_generation = 1;
  d.to_generation = 2;
  d.nodes_changed = true;
  sink.apply(s2, d);
  EXPECT_EQ(sink.planner()->context().zone, "zone-b");
  const auto& ips = sink.planner()->context().node_ips;
  EXPECT_NE(std::find(ips.begin(), ips.end(), testing::ip("192.168.50.9")), ips.end());
  EXPECT_EQ(be.full_calls, 2);  // re-planned from the new context
  // The same node again (a status update): no full sync.
  auto s3 = std::make_shared<model::Snapshot>(*s2);
  s3->generation = 3;
  d.from_generation = 2;
  d.to_generation = 3;
  sink.apply(s3, d);
  EXPECT_EQ(be.full_calls, 2);
  EXPECT_EQ(board_generation(board), 3u);
}

}  // namespace
}  // namespace endpointd::proxy
