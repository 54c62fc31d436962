// The feed's metrics. A null registry counts nowhere.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
}  // namespace prometheus

namespace endpointd::feed {

class Metrics {
 public:
  explicit Metrics(prometheus::Registry* registry);

  enum class Api { kWatch, kAds, kDeltaAds };
  // Refusals and bad input, each one a reason label of endpointd_feed_rejected_total.
  enum class Reject {
    kTooManyStreams,
    kInvalidSubscribe,
    kInvalidAck,
    kUnknownType,
    kStaleNonce,
    kBadResourceName,
    kMalformed,
    kStreamLimit,  // a stream past its cap on type URLs or subscribed names
  };

  void stream_opened(Api a);
  void stream_closed(Api a);
  void update_sent(Api a);
  void ack(Api a);
  void nack(Api a);
  void coalesced();
  void rejected(Reject r);
  void applied(uint64_t generation);
  // A subscriber turned stale (excluded from applied(g)); one that was stale caught up or
  // went away.
  void stale_entered();
  void stale_left();

  uint64_t count(Reject r) const;  // for tests
  uint64_t nacks() const;
  uint64_t coalesced_count() const;
  uint64_t stale_total() const;  // transitions to stale
  int64_t stale_now() const;     // subscribers stale now

 private:
  static constexpr int kApis = 3;
  static constexpr int kRejects = 8;
  prometheus::Gauge* streams_[kApis] = {};
  prometheus::Counter* updates_[kApis] = {};
  prometheus::Counter* acks_[kApis] = {};
  prometheus::Counter* nacks_[kApis] = {};
  prometheus::Counter* rejected_[kRejects] = {};
  prometheus::Counter* coalesced_ = nullptr;
  prometheus::Gauge* applied_ = nullptr;
  prometheus::Counter* stale_total_ = nullptr;
  prometheus::Gauge* stale_now_ = nullptr;
  // Plain counts too, so tests read them without a registry.
  std::atomic<uint64_t> reject_counts_[kRejects] = {};
  std::atomic<uint64_t> nack_count_{0};
  std::atomic<uint64_t> coalesced_count_{0};
  std::atomic<uint64_t> stale_total_count_{0};
  std::atomic<int64_t> stale_now_count_{0};
};

}  // namespace endpointd::feed
