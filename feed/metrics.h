// The feed's metrics. A null registry counts nowhere.
#pragma once

#include <atomic>
#include <cstddef>
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
  // A connected stream stopped holding applied(g) (`lapse`: its grace passed; otherwise it
  // took over a lapsed ghost's state), or one that had caught up or went away.
  void stale_entered(bool lapse);
  void stale_left();
  // Why a subscriber (a stream or a ghost) stopped holding applied(g) after its grace: each
  // reason a label of endpointd_feed_subscribers_lapsed_total.
  enum class Lapse { kDisconnected, kUnacknowledged, kNacking };
  void lapsed(Lapse why);
  // A ghost forgotten: kForgetAfter after it lapsed, or for the cap on ghosts.
  enum class Forget { kExpired, kLimit };
  void forgotten(Forget why);
  // The subscriber state file (--feed-state-file): identities loaded at start, and why a load
  // or a write failed.
  enum class StateLoad { kUnreadable, kTooLarge, kMalformed };
  enum class StateWrite { kOpen, kWrite, kRename };
  void remembered(size_t n);
  void state_load_error(StateLoad why);
  void state_write_error(StateWrite why);
  void ghosts_holding(size_t n);  // ghosts that hold applied(g) now
  void holdouts(size_t n);        // holdouts on the board now

  uint64_t count(Reject r) const;  // for tests
  uint64_t nacks() const;
  uint64_t coalesced_count() const;
  uint64_t stale_total() const;  // connected streams that lapsed
  int64_t stale_now() const;     // connected streams lapsed now
  uint64_t lapsed_total(Lapse why) const;
  uint64_t forgotten_total(Forget why) const;
  int64_t ghosts_holding_now() const;
  uint64_t remembered_total() const;
  uint64_t state_load_errors(StateLoad why) const;
  uint64_t state_write_errors(StateWrite why) const;
  int64_t holdouts_now() const;

 private:
  static constexpr int kApis = 3;
  static constexpr int kRejects = 8;
  static constexpr int kLapses = 3;
  static constexpr int kForgets = 2;
  static constexpr int kStateLoads = 3;
  static constexpr int kStateWrites = 3;
  prometheus::Gauge* streams_[kApis] = {};
  prometheus::Counter* updates_[kApis] = {};
  prometheus::Counter* acks_[kApis] = {};
  prometheus::Counter* nacks_[kApis] = {};
  prometheus::Counter* rejected_[kRejects] = {};
  prometheus::Counter* coalesced_ = nullptr;
  prometheus::Gauge* applied_ = nullptr;
  prometheus::Counter* stale_total_ = nullptr;
  prometheus::Gauge* stale_now_ = nullptr;
  prometheus::Counter* lapsed_[kLapses] = {};
  prometheus::Counter* forgotten_[kForgets] = {};
  prometheus::Counter* remembered_ = nullptr;
  prometheus::Counter* state_load_[kStateLoads] = {};
  prometheus::Counter* state_write_[kStateWrites] = {};
  prometheus::Gauge* ghosts_holding_ = nullptr;
  prometheus::Gauge* holdouts_ = nullptr;
  // Plain counts too, so tests read them without a registry.
  std::atomic<uint64_t> reject_counts_[kRejects] = {};
  std::atomic<uint64_t> nack_count_{0};
  std::atomic<uint64_t> coalesced_count_{0};
  std::atomic<uint64_t> stale_total_count_{0};
  std::atomic<int64_t> stale_now_count_{0};
  std::atomic<uint64_t> lapsed_counts_[kLapses] = {};
  std::atomic<uint64_t> forgotten_counts_[kForgets] = {};
  std::atomic<int64_t> ghosts_holding_now_{0};
  std::atomic<uint64_t> remembered_count_{0};
  std::atomic<uint64_t> state_load_counts_[kStateLoads] = {};
  std::atomic<uint64_t> state_write_counts_[kStateWrites] = {};
  std::atomic<int64_t> holdouts_now_{0};
};

}  // namespace endpointd::feed
