// The DNS metrics. Workers count into plain per-worker arrays and flush them here now and
// then, so the hot path touches no shared cache line per query.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
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
  // null: counts nowhere. `server`: the listen address, for the CoreDNS-named families'
  // `server` label ("dns://ADDR:PORT", as CoreDNS names its server blocks).
  explicit Metrics(prometheus::Registry* registry, const std::string& server = "dns://:53");
  void flush(LocalCounts& local);
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
};

}  // namespace endpointd::dns
