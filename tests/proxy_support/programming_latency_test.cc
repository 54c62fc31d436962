// kubeproxy_network_programming_duration_seconds as kube-proxy defines it (no root): from a
// service's EndpointSlice trigger time to the commit of its rules, once per service and
// trigger time, never for trigger times before the process started nor at the first sync.
#include <prometheus/registry.h>

#include <gtest/gtest.h>

#include <limits>

#include "pipeline/ack_board.h"
#include "proxy/sink.h"
#include "tests/proxy_support/sink_helpers.h"

namespace endpointd::proxy {
namespace {

using namespace std::chrono_literals;
using support::ip;
using support::state;
using support::udp_endpoint;
using support::udp_service;
using SysClock = std::chrono::system_clock;

struct Histogram {
  uint64_t count = std::numeric_limits<uint64_t>::max();  // max: not registered
  double sum = -1;
  std::vector<double> bounds;
};

// The series of `name` labelled ip_family=`family` (kube-proxy's label); "": the series
// without that label (endpointd's own figures).
Histogram histogram(prometheus::Registry& registry, const std::string& name,
                    const std::string& family = "IPv4") {
  Histogram h;
  for (const auto& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const auto& metric : f.metric) {
      std::string labelled;
      for (const auto& l : metric.label)
        if (l.name == "ip_family") labelled = l.value;
      bool ours = labelled == family;
      if (!ours) continue;
      const auto& m = metric.histogram;
      h.count = m.sample_count;
      h.sum = m.sample_sum;
      for (const auto& b : m.bucket) h.bounds.push_back(b.upper_bound);
    }
  }
  return h;
}

constexpr const char* kProgramming = "kubeproxy_network_programming_duration_seconds";

class ProgrammingLatencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t0_ = SysClock::now();
    ProxySink::Options o;
    o.node.node_name = "node-1";
    o.registry = &registry_;
    o.backoff_min = 5ms;
    o.backoff_max = 20ms;
    o.process_start = t0_ - 1h;
    sink_ = std::make_unique<ProxySink>(&backend_, &board_, o);
  }
  void TearDown() override { sink_.reset(); }

  // Service `name` with `endpoints` endpoints and the given trigger time.
  model::ServiceStatePtr svc(const std::string& name, const char* vip, int endpoints,
                             SysClock::time_point trigger) {
    std::vector<model::MergedEndpoint> eps;
    for (int i = 0; i < endpoints; ++i) {
      std::string a = "10.244.1." + std::to_string(10 + i);
      eps.push_back(udp_endpoint(a.c_str(), 53));
    }
    auto st = std::const_pointer_cast<model::ServiceState>(
        state(udp_service(name, vip, 53), std::move(eps)));
    st->trigger_time = trigger;
    return st;
  }
  void publish(std::vector<model::ServiceStatePtr> services) {
    auto next = support::snapshot(++generation_, std::move(services));
    sink_->apply(next, model::diff(last_.get(), *next));
    last_ = next;
  }
  Histogram programming() { return histogram(registry_, kProgramming); }

  SysClock::time_point t0_;
  support::AcceptingBackend backend_;
  pipeline::AckBoard board_;
  prometheus::Registry registry_;
  std::unique_ptr<ProxySink> sink_;
  model::SnapshotPtr last_;
  uint64_t generation_ = 0;
};

TEST_F(ProgrammingLatencyTest, FromTheTriggerTimeToTheCommitOncePerServiceAndTrigger) {
  // The first sync: trigger times (even ones after the start) are only noted.
  publish({svc("a", "10.96.0.10", 1, t0_ - 10min), svc("b", "10.96.0.11", 1, {})});
  EXPECT_EQ(programming().count, 0u);
  auto bounds = programming().bounds;
  ASSERT_EQ(bounds.size(), 2u + 59 + 12 + 7 + 1);  // kube-proxy's buckets, then +Inf
  EXPECT_EQ(bounds.front(), 0.25);
  EXPECT_EQ(bounds[bounds.size() - 2], 300);

  // a's endpoints change, triggered 2 s before t0.
  publish({svc("a", "10.96.0.10", 2, t0_ - 2s), svc("b", "10.96.0.11", 1, {})});
  auto h = programming();
  EXPECT_EQ(h.count, 1u);
  EXPECT_GE(h.sum, 2.0);
  EXPECT_LT(h.sum, 2.0 + 60);  // the test's own time, bounded loosely

  // a changes again with the same trigger time (a Service edit, say): not observed again.
  auto a = svc("a", "10.96.0.10", 2, t0_ - 2s);
  std::const_pointer_cast<model::ServiceState>(a)->service.external_ips = {ip("203.0.113.1")};
  publish({a, svc("b", "10.96.0.11", 1, {})});
  EXPECT_EQ(programming().count, 1u);

  // One commit, three changed services: c is new (observed), b's trigger time is before the
  // process started (left out), d has none (left out).
  publish({a, svc("b", "10.96.0.11", 2, t0_ - 2h), svc("c", "10.96.0.12", 1, t0_ - 1s),
           svc("d", "10.96.0.13", 1, {})});
  h = programming();
  EXPECT_EQ(h.count, 2u);
  EXPECT_GE(h.sum, 3.0);
  // kube-proxy's ip_family: these services are IPv4 only; the IPv6 series saw none of them.
  EXPECT_EQ(histogram(registry_, kProgramming, "IPv6").count, 0u);

  // A dual-stack service's change is programmed in both families, and observed in each.
  auto e = std::const_pointer_cast<model::ServiceState>(svc("e", "10.96.0.14", 1, t0_ - 1s));
  e->service.cluster_ips.push_back(ip("fd00::14"));
  publish({a, svc("b", "10.96.0.11", 2, t0_ - 2h), svc("c", "10.96.0.12", 1, t0_ - 1s),
           svc("d", "10.96.0.13", 1, {}), e});
  EXPECT_EQ(programming().count, 3u);
  EXPECT_EQ(histogram(registry_, kProgramming, "IPv6").count, 1u);
}

TEST_F(ProgrammingLatencyTest, ARejectedBatchIsObservedWhenTheRepairCommits) {
  publish({svc("a", "10.96.0.10", 1, t0_ - 10min)});
  backend_.fail_batches(1);
  publish({svc("a", "10.96.0.10", 2, t0_ - 1s)});
  ASSERT_TRUE(sink_->wait_idle(5s));
  EXPECT_EQ(backend_.full_syncs(), 2);
  auto h = programming();
  EXPECT_EQ(h.count, 1u);
  EXPECT_GE(h.sum, 1.0);
}

TEST_F(ProgrammingLatencyTest, AServiceRemovedAndMadeAgainIsObservedAgain) {
  publish({svc("a", "10.96.0.10", 1, t0_ - 10min)});
  publish({svc("a", "10.96.0.10", 2, t0_ - 5s)});
  EXPECT_EQ(programming().count, 1u);
  publish({});
  // Re-created with a trigger time older than the one observed before its removal.
  publish({svc("a", "10.96.0.10", 1, t0_ - 6s)});
  EXPECT_EQ(programming().count, 2u);
}

TEST_F(ProgrammingLatencyTest, TheQueuedToCommitFigureKeepsItsOwnName) {
  sink_->note_queued();
  publish({svc("a", "10.96.0.10", 1, {})});
  EXPECT_EQ(histogram(registry_, "endpointd_proxy_queued_to_commit_duration_seconds", "").count,
            1u);
  EXPECT_EQ(programming().count, 0u);
}

}  // namespace
}  // namespace endpointd::proxy
