// Prometheus families of the DNS sink.
#include "dns/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "dns/message.h"

namespace endpointd::dns {

const std::vector<double> kLatencyBuckets = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025,
                                             0.0005,  0.001,    0.0025,  0.005,  0.01,
                                             0.05,    0.1,      0.5,     1,      2};

size_t type_slot(uint16_t t) {
  switch (t) {
    case type::kA:
      return 0;
    case type::kAAAA:
      return 1;
    case type::kSRV:
      return 2;
    case type::kPTR:
      return 3;
    case type::kTXT:
      return 4;
    case type::kCNAME:
      return 5;
    case type::kSOA:
      return 6;
    case type::kNS:
      return 7;
    case type::kANY:
      return 8;
    default:
      return 9;
  }
}

size_t rcode_slot(uint16_t rc) {
  if (rc <= 5) return rc;
  if (rc == kRcodeBadVers) return 6;
  return 7;
}

namespace {

// Only the owner writes: a load and a store, which the compiler makes one add to memory.
void bump(std::atomic<uint64_t>& c, uint64_t n) {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// kLatencyBuckets in nanoseconds.
const std::array<uint64_t, kLatencySlots - 1> kLatencyBucketsNs = [] {
  std::array<uint64_t, kLatencySlots - 1> ns{};
  for (size_t b = 0; b < ns.size(); ++b)
    ns[b] = static_cast<uint64_t>(kLatencyBuckets[b] * 1e9 + 0.5);
  return ns;
}();

}  // namespace

void ThreadCounts::count(uint16_t qtype, size_t rslot) {
  bump(queries[type_slot(qtype)][rslot], 1);
}

void ThreadCounts::latency(uint64_t ns, size_t n) {
  size_t b = 0;
  while (b < kLatencyBucketsNs.size() && ns > kLatencyBucketsNs[b]) ++b;
  bump(latency_buckets[b], n);
  // Released after the bucket: a fold that reads this sum sees the buckets it covers.
  latency_sum_ns.store(latency_sum_ns.load(std::memory_order_relaxed) + ns * n,
                       std::memory_order_release);
}

namespace {
const char* const kTypes[kTypeSlots] = {"A",     "AAAA", "SRV", "PTR", "TXT",
                                        "CNAME", "SOA",  "NS",  "ANY", "other"};
const char* const kRcodes[kRcodeSlots] = {"NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN",
                                          "NOTIMP",  "REFUSED", "BADVERS",  "dropped"};
}  // namespace

Metrics::Metrics(prometheus::Registry* r, const std::string& server) : registry_(r) {
  if (!r) return;
  auto& q = prometheus::BuildCounter()
                .Name("endpointd_dns_queries_total")
                .Help("DNS queries answered, by query type and response code")
                .Register(*r);
  for (size_t t = 0; t < kTypeSlots; ++t)
    for (size_t c = 0; c < kRcodeSlots; ++c)
      queries_[t][c] = &q.Add({{"type", kTypes[t]}, {"rcode", kRcodes[c]}});
  latency_ = &prometheus::BuildHistogram()
                  .Name("endpointd_dns_request_duration_seconds")
                  .Help("Time from receiving a query to sending its answer (zone answers)")
                  .Register(*r)
                  .Add({}, kLatencyBuckets);
  forward_latency = &prometheus::BuildHistogram()
                         .Name("endpointd_dns_forward_duration_seconds")
                         .Help("Time to answer a forwarded query")
                         .Register(*r)
                         .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05,
                                                                          0.1, 0.5, 1, 2, 5});
  auto& cache = prometheus::BuildCounter()
                    .Name("endpointd_dns_forward_cache_total")
                    .Help("Forwarding cache lookups, by result")
                    .Register(*r);
  cache_hits_ = &cache.Add({{"result", "hit"}});
  cache_misses_ = &cache.Add({{"result", "miss"}});
  cache_evictions_ = &prometheus::BuildCounter()
                          .Name("endpointd_dns_forward_cache_evictions_total")
                          .Help("Unexpired forwarding cache entries dropped because it was full")
                          .Register(*r)
                          .Add({});
  auto& fe = prometheus::BuildCounter()
                 .Name("endpointd_dns_forward_errors_total")
                 .Help("Forwarded queries that failed (timeout, upstream unreachable) or were shed")
                 .Register(*r);
  forward_errors_ = &fe.Add({{"reason", "upstream"}});
  forward_shed_ = &fe.Add({{"reason", "shed"}});
  programming_ = &prometheus::BuildHistogram()
                      .Name("endpointd_dns_programming_duration_seconds")
                      .Help("Time to build and swap in the zone of a snapshot")
                      .Register(*r)
                      .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.005, 0.01,
                                                                       0.05, 0.1, 0.5, 1, 5});
  // CoreDNS's names. zone ".": one server block, as kubeadm's Corefile has.
  auto& cdq = prometheus::BuildCounter()
                  .Name("coredns_dns_requests_total")
                  .Help("DNS requests, by query type (CoreDNS's name; no proto or family label)")
                  .Register(*r);
  for (size_t t = 0; t < kTypeSlots; ++t)
    cd_requests_[t] = &cdq.Add({{"server", server}, {"zone", "."}, {"type", kTypes[t]}});
  auto& cdr = prometheus::BuildCounter()
                  .Name("coredns_dns_responses_total")
                  .Help("DNS responses, by response code (CoreDNS's name)")
                  .Register(*r);
  for (size_t c = 0; c + 1 < kRcodeSlots; ++c)  // not "dropped": no response went out
    cd_responses_[c] = &cdr.Add({{"server", server}, {"zone", "."}, {"rcode", kRcodes[c]}});
  cd_latency_ = &prometheus::BuildHistogram()
                     .Name("coredns_dns_request_duration_seconds")
                     .Help("Time to answer a query from the zone (CoreDNS's name)")
                     .Register(*r)
                     .Add({{"server", server}, {"zone", "."}}, kLatencyBuckets);
  cd_cache_hits_ = &prometheus::BuildCounter()
                        .Name("coredns_cache_hits_total")
                        .Help("Forwarding cache hits (CoreDNS's name)")
                        .Register(*r)
                        .Add({{"server", server}, {"type", "success"}});
  cd_cache_misses_ = &prometheus::BuildCounter()
                          .Name("coredns_cache_misses_total")
                          .Help("Forwarding cache misses (CoreDNS's name)")
                          .Register(*r)
                          .Add({{"server", server}});
  tcp_rejected_ =
      &prometheus::BuildCounter()
           .Name("endpointd_dns_tcp_connections_rejected_total")
           .Help("TCP connections closed at once because the connection limit was reached")
           .Register(*r)
           .Add({});
  tcp_slow_dropped_ =
      &prometheus::BuildCounter()
           .Name("endpointd_dns_tcp_slow_readers_dropped_total")
           .Help(
               "TCP connections closed because their unread answers passed the per-connection "
               "limit (a client that sends queries and does not read the answers)")
           .Register(*r)
           .Add({});
}

Metrics::~Metrics() = default;

ThreadCounts* Metrics::thread_counts() {
  std::lock_guard lk(fold_mu_);
  threads_.emplace_back();
  return threads_.back().counts.get();
}

void Metrics::fold() {
  std::lock_guard lk(fold_mu_);
  for (Thread& th : threads_) {
    const ThreadCounts& now = *th.counts;
    Folded& was = th.folded;
    for (size_t t = 0; t < kTypeSlots; ++t)
      for (size_t c = 0; c < kRcodeSlots; ++c) {
        uint64_t v = now.queries[t][c].load(std::memory_order_relaxed);
        uint64_t d = v - was.queries[t][c];
        was.queries[t][c] = v;
        if (!d || !latency_) continue;
        auto n = static_cast<double>(d);
        queries_[t][c]->Increment(n);
        cd_requests_[t]->Increment(n);
        if (cd_responses_[c]) cd_responses_[c]->Increment(n);
      }
    // The sum is read first: a batch adds its buckets before its sum, so the sum folded never
    // runs ahead of the buckets (it may trail them by a batch until the next fold).
    uint64_t sum = now.latency_sum_ns.load(std::memory_order_acquire);
    std::vector<double> buckets(kLatencySlots);
    bool any = false;
    for (size_t b = 0; b < kLatencySlots; ++b) {
      uint64_t v = now.latency_buckets[b].load(std::memory_order_relaxed);
      buckets[b] = static_cast<double>(v - was.latency_buckets[b]);
      any = any || v != was.latency_buckets[b];
      was.latency_buckets[b] = v;
    }
    double sum_s = static_cast<double>(sum - was.latency_sum_ns) / 1e9;
    was.latency_sum_ns = sum;
    if (!any || !latency_) continue;
    latency_->ObserveMultiple(buckets, sum_s);
    cd_latency_->ObserveMultiple(buckets, sum_s);
  }
}

void Metrics::cache_hit() {
  if (cache_hits_) cache_hits_->Increment();
  if (cd_cache_hits_) cd_cache_hits_->Increment();
}
void Metrics::cache_miss() {
  if (cache_misses_) cache_misses_->Increment();
  if (cd_cache_misses_) cd_cache_misses_->Increment();
}
void Metrics::forward_to(const std::string& to) {
  if (!registry_) return;
  prometheus::Registry& r = *registry_;
  cd_fwd_requests_ = &prometheus::BuildCounter()
                          .Name("coredns_forward_requests_total")
                          .Help("Queries sent upstream (CoreDNS's name before 1.11)")
                          .Register(r)
                          .Add({{"to", to}});
  auto& responses = prometheus::BuildCounter()
                        .Name("coredns_forward_responses_total")
                        .Help("Upstream responses, by rcode (CoreDNS's name before 1.11)")
                        .Register(r);
  auto& fwd = prometheus::BuildHistogram()
                  .Name("coredns_forward_request_duration_seconds")
                  .Help("Time an upstream took to answer (CoreDNS's name before 1.11)")
                  .Register(r);
  auto& proxy = prometheus::BuildHistogram()
                    .Name("coredns_proxy_request_duration_seconds")
                    .Help("Time an upstream took to answer (CoreDNS's name from 1.11)")
                    .Register(r);
  // CoreDNS's buckets: 0.25 ms doubling to 8 s.
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 0.00025; b.size() < 16; v *= 2) b.push_back(v);
  for (size_t c = 0; c < kRcodeSlots; ++c) {
    // An upstream's rcode past REFUSED other than BADVERS lands in the last slot: "other".
    const char* rc = c + 1 < kRcodeSlots ? kRcodes[c] : "other";
    cd_fwd_responses_[c] = &responses.Add({{"to", to}, {"rcode", rc}});
    cd_fwd_latency_[c] = &fwd.Add({{"to", to}, {"rcode", rc}}, b);
    cd_proxy_latency_[c] = &proxy.Add({{"proxy_name", "forward"}, {"to", to}, {"rcode", rc}}, b);
  }
  cd_fwd_broken_ =
      &prometheus::BuildCounter()
           .Name("coredns_forward_healthcheck_broken_total")
           .Help(
               "Forwarded queries every upstream failed (CoreDNS's name; endpointd has no "
               "separate health check: a query that exhausted every upstream counts)")
           .Register(r)
           .Add({});
  cd_fwd_rejects_ = &prometheus::BuildCounter()
                         .Name("coredns_forward_max_concurrent_rejects_total")
                         .Help(
                             "Queries refused because the forwarder had the most in flight "
                             "(CoreDNS's name)")
                         .Register(r)
                         .Add({});
}
void Metrics::forward_request() {
  if (cd_fwd_requests_) cd_fwd_requests_->Increment();
}
void Metrics::forward_response(uint16_t rcode, double seconds) {
  size_t c = rcode_slot(rcode);
  if (cd_fwd_responses_[c]) cd_fwd_responses_[c]->Increment();
  if (cd_fwd_latency_[c]) cd_fwd_latency_[c]->Observe(seconds);
  if (cd_proxy_latency_[c]) cd_proxy_latency_[c]->Observe(seconds);
}
void Metrics::forward_error() {
  if (forward_errors_) forward_errors_->Increment();
  if (cd_fwd_broken_) cd_fwd_broken_->Increment();
}
void Metrics::forward_shed() {
  if (forward_shed_) forward_shed_->Increment();
  if (cd_fwd_rejects_) cd_fwd_rejects_->Increment();
}
void Metrics::cache_eviction() {
  if (cache_evictions_) cache_evictions_->Increment();
}
void Metrics::programming(double s) {
  if (programming_) programming_->Observe(s);
}
void Metrics::tcp_slow_dropped() {
  if (tcp_slow_dropped_) tcp_slow_dropped_->Increment();
}

void Metrics::tcp_rejected() {
  if (tcp_rejected_) tcp_rejected_->Increment();
}

}  // namespace endpointd::dns
