// The DNS metrics' per-thread counts and their fold into the registry at a scrape.
#include "dns/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

#include <prometheus/registry.h>

#include "dns/message.h"

namespace endpointd::dns {
namespace {

// The value of the sample of `family` whose labels include every one of `labels`; -1 when
// there is none.
double sample(prometheus::Registry& r, const std::string& family,
              const std::vector<std::pair<std::string, std::string>>& labels = {}) {
  for (const auto& f : r.Collect()) {
    if (f.name != family) continue;
    for (const auto& m : f.metric) {
      bool all = true;
      for (const auto& [k, v] : labels) {
        bool found = false;
        for (const auto& l : m.label) found = found || (l.name == k && l.value == v);
        all = all && found;
      }
      if (!all) continue;
      if (f.type == prometheus::MetricType::Histogram)
        return static_cast<double>(m.histogram.sample_count);
      return m.counter.value;
    }
  }
  return -1;
}

double histogram_sum(prometheus::Registry& r, const std::string& family) {
  for (const auto& f : r.Collect())
    if (f.name == family && !f.metric.empty()) return f.metric.front().histogram.sample_sum;
  return -1;
}

TEST(DnsMetrics, CountsReachTheRegistryOnlyWhenFoldedAndOnce) {
  prometheus::Registry r;
  Metrics m(&r, "dns://127.0.0.1:53");
  ThreadCounts* a = m.thread_counts();
  ThreadCounts* b = m.thread_counts();
  a->count(type::kA, rcode_slot(0));
  a->count(type::kA, rcode_slot(0));
  b->count(type::kA, rcode_slot(3));
  b->count(type::kSRV, rcode_slot(0));
  a->latency(30'000, 2);  // 30 µs: the 50 µs bucket
  b->latency(2'000'000, 1);
  EXPECT_EQ(sample(r, "endpointd_dns_queries_total", {{"type", "A"}, {"rcode", "NOERROR"}}), 0);
  m.fold();
  EXPECT_EQ(sample(r, "endpointd_dns_queries_total", {{"type", "A"}, {"rcode", "NOERROR"}}), 2);
  EXPECT_EQ(sample(r, "endpointd_dns_queries_total", {{"type", "A"}, {"rcode", "NXDOMAIN"}}), 1);
  EXPECT_EQ(sample(r, "endpointd_dns_queries_total", {{"type", "SRV"}, {"rcode", "NOERROR"}}), 1);
  EXPECT_EQ(sample(r, "coredns_dns_requests_total", {{"type", "A"}}), 3);
  EXPECT_EQ(sample(r, "coredns_dns_responses_total", {{"rcode", "NOERROR"}}), 3);
  EXPECT_EQ(sample(r, "endpointd_dns_request_duration_seconds"), 3);
  EXPECT_EQ(sample(r, "coredns_dns_request_duration_seconds"), 3);
  EXPECT_NEAR(histogram_sum(r, "endpointd_dns_request_duration_seconds"), 0.00206, 1e-9);
  // The buckets: two at or under 50 µs, the third under 2.5 ms.
  for (const auto& f : r.Collect()) {
    if (f.name != "endpointd_dns_request_duration_seconds") continue;
    const auto& buckets = f.metric.front().histogram.bucket;
    ASSERT_EQ(buckets.size(), kLatencySlots);
    EXPECT_EQ(buckets[1].cumulative_count, 0u);  // 25 µs
    EXPECT_EQ(buckets[2].cumulative_count, 2u);  // 50 µs
    EXPECT_EQ(buckets[6].cumulative_count, 2u);  // 1 ms
    EXPECT_EQ(buckets[7].cumulative_count, 3u);  // 2.5 ms
  }
  // Nothing new: a second fold adds nothing.
  m.fold();
  EXPECT_EQ(sample(r, "endpointd_dns_queries_total", {{"type", "A"}, {"rcode", "NOERROR"}}), 2);
  EXPECT_EQ(sample(r, "endpointd_dns_request_duration_seconds"), 3);
  // Only what came since.
  a->count(type::kA, rcode_slot(0));
  m.fold();
  EXPECT_EQ(sample(r, "endpointd_dns_queries_total", {{"type", "A"}, {"rcode", "NOERROR"}}), 3);
  EXPECT_EQ(sample(r, "coredns_dns_requests_total", {{"type", "A"}}), 4);
}

// A scrape folds while a worker counts: every count arrives exactly once.
TEST(DnsMetrics, FoldsWhileAThreadCountsLoseAndRepeatNothing) {
  prometheus::Registry r;
  Metrics m(&r);
  ThreadCounts* c = m.thread_counts();
  constexpr int kQueries = 200'000;
  std::atomic<bool> done{false};
  std::atomic<int> folds{0};
  std::thread worker([&] {
    for (int i = 0; i < kQueries; ++i) {
      // Halfway, the counting waits for a fold: one fold at least falls while this thread
      // counts, however the two are scheduled (a loaded machine once ran all of it first).
      if (i == kQueries / 2)
        while (folds.load() == 0) std::this_thread::yield();
      c->count(type::kA, rcode_slot(0));
      if (i % 64 == 63) c->latency(1'000, 64);
    }
    done = true;
  });
  while (!done) {
    m.fold();
    ++folds;
    double folded = sample(r, "endpointd_dns_queries_total", {{"type", "A"}, {"rcode", "NOERROR"}});
    EXPECT_LE(folded, kQueries);
    // The sum is read before the buckets: it never covers a batch the buckets do not.
    EXPECT_LE(histogram_sum(r, "endpointd_dns_request_duration_seconds"),
              sample(r, "endpointd_dns_request_duration_seconds") * 1e-6 + 1e-12);
  }
  worker.join();
  m.fold();
  EXPECT_GT(folds, 0);
  EXPECT_EQ(sample(r, "endpointd_dns_queries_total", {{"type", "A"}, {"rcode", "NOERROR"}}),
            kQueries);
  EXPECT_EQ(sample(r, "endpointd_dns_request_duration_seconds"), kQueries / 64 * 64);
  EXPECT_NEAR(histogram_sum(r, "endpointd_dns_request_duration_seconds"), kQueries / 64 * 64 * 1e-6,
              1e-9);
}

// Without a registry the threads still count; a fold folds into nothing.
TEST(DnsMetrics, NoRegistryCountsNowhere) {
  Metrics m(nullptr);
  ThreadCounts* c = m.thread_counts();
  c->count(type::kA, rcode_slot(0));
  c->latency(1'000, 1);
  m.fold();
  EXPECT_EQ(c->queries[type_slot(type::kA)][0].load(), 1u);
}

}  // namespace
}  // namespace endpointd::dns
