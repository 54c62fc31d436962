// The DNS metrics. Workers count into plain per-worker arrays and flush them here now and
// then, so the hot path touches no shared cache line per query.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
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

struct LocalCounts {
  std::array<std::array<uint64_t, kRcodeSlots>, kTypeSlots> queries{};
  std::vector<double> latency_buckets = std::vector<double>(16, 0.0);  // size >= buckets + 1
  double latency_sum = 0;
  uint64_t pending = 0;
  void count(uint16_t qtype, size_t rcode_slot_index);
  void latency(double seconds, size_t n);
};

class Metrics {
 public:
  explicit Metrics(prometheus::Registry* registry);  // null: counts nowhere
  void flush(LocalCounts& local);
  void cache_hit();
  void cache_miss();
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
};

}  // namespace endpointd::dns
