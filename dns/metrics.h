// The DNS metrics. Each server thread counts into a block of its own (ThreadCounts), and a
// scrape folds every block into the registry's counters (Metrics::fold): the hot path takes
// no lock, makes no locked instruction and writes no cache line another thread writes.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace prometheus {
class Registry;
class Counter;
class Histogram;
}  // namespace prometheus

namespace endpointd::dns {

inline constexpr size_t kTypeSlots = 10;  // A AAAA SRV PTR TXT CNAME SOA NS ANY other
inline constexpr size_t kRcodeSlots = 8;  // 0..5, BADVERS, dropped
size_t type_slot(uint16_t qtype);
size_t rcode_slot(uint16_t rcode);
extern const std::vector<double> kLatencyBuckets;
inline constexpr size_t kLatencySlots = 16;  // kLatencyBuckets.size() + 1 (+Inf)

// What one server thread counted since it started. Written by that thread alone, as a relaxed
// load and store (a plain add: nothing locked, and the block is its own cache lines); read
// from any thread by Metrics::fold.
struct alignas(64) ThreadCounts {
  std::array<std::array<std::atomic<uint64_t>, kRcodeSlots>, kTypeSlots> queries{};
  std::array<std::atomic<uint64_t>, kLatencySlots> latency_buckets{};
  std::atomic<uint64_t> latency_sum_ns{0};
  // The owning thread only.
  void count(uint16_t qtype, size_t rcode_slot_index);
  void latency(uint64_t ns, size_t n);  // n queries, each `ns` from receipt to answer
};

class Metrics {
 public:
  // null: counts nowhere. `server`: the listen address, for the CoreDNS-named families'
  // `server` label ("dns://ADDR:PORT", as CoreDNS names its server blocks).
  explicit Metrics(prometheus::Registry* registry, const std::string& server = "dns://:53");
  ~Metrics();
  // A block for one server thread to count into, kept as long as these Metrics.
  ThreadCounts* thread_counts();
  // Adds what every thread counted since the last fold to the registry's query counters and
  // latency histograms, under endpointd's and CoreDNS's names: what a scrape calls first.
  // Any thread, any time.
  void fold();
  void cache_hit();
  void cache_miss();
  // The forwarder's figures, under endpointd's names and CoreDNS's forward plugin's:
  // forward_to() names the upstreams once they are known (CoreDNS's `to` label; before it,
  // nothing is counted under CoreDNS's forward names), then a request as it is sent, a
  // response with its rcode and time, an error (every upstream failed: CoreDNS's
  // healthcheck_broken), a request shed at the in-flight limit (max_concurrent_rejects).
  void forward_to(const std::string& to);
  void forward_request();
  void forward_response(uint16_t rcode, double seconds);
  void forward_error();
  void forward_shed();
  void cache_eviction();
  void programming(double seconds);
  void tcp_rejected();
  void tcp_slow_dropped();
  prometheus::Histogram* forward_latency = nullptr;

 private:
  std::array<std::array<prometheus::Counter*, kRcodeSlots>, kTypeSlots> queries_{};
  prometheus::Histogram* latency_ = nullptr;
  prometheus::Counter* cache_hits_ = nullptr;
  prometheus::Counter* cache_misses_ = nullptr;
  prometheus::Counter* cache_evictions_ = nullptr;
  prometheus::Counter* forward_errors_ = nullptr;
  prometheus::Counter* forward_shed_ = nullptr;
  prometheus::Histogram* programming_ = nullptr;
  prometheus::Counter* tcp_rejected_ = nullptr;
  prometheus::Counter* tcp_slow_dropped_ = nullptr;
  // The same counts under CoreDNS's names and labels (dashboards and alerts made for it):
  // coredns_dns_requests_total{server,zone,type}, coredns_dns_responses_total{server,zone,
  // rcode}, coredns_dns_request_duration_seconds{server,zone}, coredns_cache_hits_total /
  // coredns_cache_misses_total (the forwarding cache).
  std::array<prometheus::Counter*, kTypeSlots> cd_requests_{};
  std::array<prometheus::Counter*, kRcodeSlots> cd_responses_{};
  prometheus::Histogram* cd_latency_ = nullptr;
  prometheus::Counter* cd_cache_hits_ = nullptr;
  prometheus::Counter* cd_cache_misses_ = nullptr;
  // coredns_forward_requests_total{to}, coredns_forward_responses_total{to,rcode},
  // coredns_forward_request_duration_seconds{to,rcode} (CoreDNS before 1.11) and
  // coredns_proxy_request_duration_seconds{proxy_name="forward",to,rcode} (1.11 on),
  // coredns_forward_healthcheck_broken_total, coredns_forward_max_concurrent_rejects_total.
  prometheus::Registry* registry_ = nullptr;
  prometheus::Counter* cd_fwd_requests_ = nullptr;
  std::array<prometheus::Counter*, kRcodeSlots> cd_fwd_responses_{};
  std::array<prometheus::Histogram*, kRcodeSlots> cd_fwd_latency_{};
  std::array<prometheus::Histogram*, kRcodeSlots> cd_proxy_latency_{};
  prometheus::Counter* cd_fwd_broken_ = nullptr;
  prometheus::Counter* cd_fwd_rejects_ = nullptr;

  // Every thread's block, and what of it the registry holds already.
  struct Folded {
    std::array<std::array<uint64_t, kRcodeSlots>, kTypeSlots> queries{};
    std::array<uint64_t, kLatencySlots> latency_buckets{};
    uint64_t latency_sum_ns = 0;
  };
  struct Thread {
    std::unique_ptr<ThreadCounts> counts = std::make_unique<ThreadCounts>();
    Folded folded;
  };
  std::mutex fold_mu_;  // guards threads_ and the folds
  std::vector<Thread> threads_;
};

}  // namespace endpointd::dns
