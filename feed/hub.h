// The feed's hub: the newest snapshot, the live subscribers (UpstreamFeed watch streams and
// xDS streams), and the acknowledgement arithmetic that turns their acks into the feed
// sink's applied(g). No gRPC here, so all of it is testable without a server.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "feed/fanout.h"
#include "model/snapshot.h"

namespace endpointd::feed {

// What one subscriber confirmed. Fed by its stream: every response sent (with the snapshot
// whose state it carries), every snapshot that changed nothing the subscriber sees, and every
// ack. acked() is the newest snapshot whose state the subscriber is known to route by: the
// snapshot it acknowledged, or a newer one that differs from it only in what it does not
// subscribe to. A subscriber starts at the snapshot current when it joined: it has been told
// nothing older, so it holds back no removal that happened before it came.
class AckTracker {
 public:
  // Unacknowledged responses remembered; older ones can no longer be acknowledged (a newer
  // ack covers them).
  static constexpr size_t kMaxInFlight = 16;

  explicit AckTracker(model::SnapshotPtr joined) : acked_(std::move(joined)) {}

  void sent(model::SnapshotPtr snap);
  // `snap` is newer than the last response and changes nothing this subscriber receives.
  void unchanged(const model::SnapshotPtr& snap);
  // The client applied the response of `version`. false: no such response is outstanding
  // and it is not older than what was acknowledged (a bogus ack; nothing changes).
  bool ack(uint64_t version);
  // Nothing sent is outstanding: every response was acknowledged.
  bool caught_up() const { return in_flight_.empty(); }
  const model::SnapshotPtr& acked() const { return acked_; }
  uint64_t acked_version() const { return acked_version_; }
  uint64_t sent_version() const {
    return in_flight_.empty() ? acked_version_ : in_flight_.back().version;
  }

 private:
  struct InFlight {
    uint64_t version;
    model::SnapshotPtr equivalent;  // the newest snapshot with the same state for this client
  };
  model::SnapshotPtr acked_;
  uint64_t acked_version_ = 0;  // the newest version the client acknowledged
  std::deque<InFlight> in_flight_;
};

// A row of /debug/state's feed section.
struct SubscriberInfo {
  uint64_t id = 0;
  std::string api;     // "watch", "ads", "delta-ads"
  std::string peer;    // gRPC peer string
  std::string client;  // Subscribe.client_name or the xDS node id
  std::string subscription;
  uint64_t sent_version = 0;
  uint64_t acked_version = 0;
  uint64_t acked_generation = 0;  // what counts toward applied(g)
  uint64_t nacks = 0;
  std::string last_nack;
};

class Subscriber {
 public:
  virtual ~Subscriber() = default;
  // A new snapshot; called on the sink thread, one call at a time per subscriber.
  virtual void notify(const model::SnapshotPtr& snap) = 0;
  // The snapshot this subscriber's confirmed state matches (never null once registered).
  virtual model::SnapshotPtr acked() const = 0;
  virtual SubscriberInfo info() const = 0;
};

class Hub {
 public:
  // Called with each new applied snapshot (the feed's applied(g)); outside the hub's lock.
  using AppliedFn = std::function<void(const model::SnapshotPtr&)>;

  // `fanout_threads`: how many threads notify subscribers in publish() (0: one per core, at
  // most FanOut::kMaxThreads; 1: the caller alone).
  explicit Hub(size_t max_subscribers, AppliedFn applied = {}, size_t fanout_threads = 1)
      : max_subscribers_(max_subscribers),
        applied_fn_(std::move(applied)),
        fanout_(fanout_threads) {}

  // The sink thread: every subscriber is notified (shared among the fan-out threads), then
  // applied(g) is recomputed.
  void publish(model::SnapshotPtr snap);
  // The newest synced snapshot; null until the first one.
  model::SnapshotPtr current() const;

  // A new stream. false when the limit is reached (the stream must refuse itself).
  bool add(Subscriber* s);
  void remove(Subscriber* s);
  // `s`'s acked() may have moved. Never call it holding a subscriber's own lock. Costs
  // O(log subscribers): the hub keeps a count of subscribers per acknowledged generation, so
  // 1,000 acks of one change are not 1,000 scans of 1,000 subscribers.
  void acks_changed(Subscriber* s);

  // The delta between two snapshots, computed once for all subscribers that need it.
  std::shared_ptr<const model::Delta> diff(const model::SnapshotPtr& from,
                                           const model::SnapshotPtr& to);

  size_t subscribers() const;
  std::vector<SubscriberInfo> infos() const;
  // The snapshot every live subscriber acknowledged (the current one when there is none).
  model::SnapshotPtr applied() const;
  uint64_t next_id() { return next_id_.fetch_add(1) + 1; }

 private:
  // Moves `s`'s entry in acked_ to what it reports now. Under acks_mu_.
  void refresh_locked(Subscriber* s, model::SnapshotPtr& recorded);
  // applied_ from acked_; the snapshot to report when it moved. Under acks_mu_.
  model::SnapshotPtr recompute_locked();
  void report(const model::SnapshotPtr& snap);

  const size_t max_subscribers_;
  AppliedFn applied_fn_;
  std::atomic<uint64_t> next_id_{0};

  // Two locks, so that acks never wait for a fan-out: mu_ is held while every subscriber is
  // notified (tens of milliseconds for 1,000 streams) and keeps them alive meanwhile;
  // acks_mu_ guards only the ack arithmetic, which gRPC's threads update on every ack.
  // Order: mu_, then acks_mu_, then a subscriber's own lock.
  mutable std::mutex mu_;
  model::SnapshotPtr current_;
  std::vector<Subscriber*> subscribers_;

  mutable std::mutex acks_mu_;
  model::SnapshotPtr acks_current_;  // current_, as the ack arithmetic last saw it
  // Each subscriber with the acknowledged snapshot the hub last counted for it.
  std::unordered_map<Subscriber*, model::SnapshotPtr> recorded_;
  // Acknowledged generation → how many subscribers are there, and that snapshot.
  struct AckedAt {
    size_t count = 0;
    model::SnapshotPtr snap;
  };
  std::map<uint64_t, AckedAt> acked_;
  model::SnapshotPtr applied_;

  std::mutex diff_mu_;
  struct CachedDiff {
    uint64_t from, to;
    std::shared_ptr<const model::Delta> delta;
  };
  std::deque<CachedDiff> diffs_;

  FanOut fanout_;  // used by publish() only, under mu_
};

}  // namespace endpointd::feed
