// The feed's hub: the newest snapshot, the live subscribers (UpstreamFeed watch streams and
// xDS streams), and the acknowledgement arithmetic that turns their acks into the feed
// sink's applied(g). No gRPC here, so all of it is testable without a server.
//
// Stale subscribers. A subscriber that has had a response outstanding (sent, not
// acknowledged) for `stale_after` or longer is stale: it stops counting toward applied(g), so
// one proxy that never acknowledges cannot hold every drain on the node until its deadline.
// The price is deliberate: a drain may then complete while that proxy still routes to the
// endpoint (it was sent the removal but never said it applied it). Each transition is counted
// and logged with the subscriber's identity; the subscriber stays connected and keeps getting
// updates, and counts again once an ack leaves it with no response outstanding for that long
// (acknowledging the newest version it was sent always does). applied(g) never moves back:
// a subscriber counted again that is behind holds it where it is until it catches up.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "feed/fanout.h"
#include "model/snapshot.h"

namespace endpointd::feed {

class Metrics;

using Clock = std::chrono::steady_clock;

// How long a response may stay unacknowledged before its subscriber is stale. A healthy proxy
// acknowledges in milliseconds (Envoy and proxyless gRPC apply EDS at once; endpointd-haproxy
// after one runtime-API pass, bounded by its 2 s timeout), and a few seconds more absorb a GC
// pause or CPU throttling. The drain deadline is 24 s, so 5 s leaves a drain held by a dead or
// wedged proxy most of its budget for connections to finish, where keepalive alone (30 s + 10 s)
// would notice a dead peer only after the deadline.
inline constexpr std::chrono::milliseconds kDefaultStaleAfter{5000};

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

  // A response carrying `snap`'s state was sent at `now`.
  void sent(model::SnapshotPtr snap, Clock::time_point now);
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
  // When the oldest response not yet acknowledged was sent; nullopt when caught up.
  std::optional<Clock::time_point> outstanding_since() const {
    if (in_flight_.empty()) return std::nullopt;
    return in_flight_.front().sent_at;
  }

 private:
  struct InFlight {
    uint64_t version;
    model::SnapshotPtr equivalent;  // the newest snapshot with the same state for this client
    // When this response was sent; for the oldest one remembered, when the oldest response
    // still unacknowledged was (a forgotten one's time is carried over, so a client that
    // never acks ages even when more than kMaxInFlight responses were sent).
    Clock::time_point sent_at;
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
  bool stale = false;  // excluded from applied(g): a response unacknowledged for stale_after
};

class Subscriber {
 public:
  virtual ~Subscriber() = default;
  // A new snapshot; called on the sink thread, one call at a time per subscriber.
  virtual void notify(const model::SnapshotPtr& snap) = 0;
  // The snapshot this subscriber's confirmed state matches (never null once registered).
  virtual model::SnapshotPtr acked() const = 0;
  // When the oldest response it has not acknowledged was sent, by the hub's clock (Hub::now);
  // nullopt when it acknowledged everything. Subscribers that never wait for acks need not
  // say.
  virtual std::optional<Clock::time_point> outstanding_since() const { return std::nullopt; }
  virtual SubscriberInfo info() const = 0;
};

struct HubOptions {
  size_t max_subscribers = 4096;
  // How many threads notify subscribers in publish() (0: one per core, at most
  // FanOut::kMaxThreads; 1: the caller alone).
  size_t fanout_threads = 1;
  // A subscriber with a response unacknowledged this long is stale (see the top of this
  // file); zero or less: never.
  std::chrono::milliseconds stale_after = kDefaultStaleAfter;
  std::function<Clock::time_point()> clock;  // null: Clock::now
  Metrics* metrics = nullptr;                // stale transitions are counted here; may be null
};

class Hub {
 public:
  // Called with each new applied snapshot (the feed's applied(g)); outside the hub's lock.
  using AppliedFn = std::function<void(const model::SnapshotPtr&)>;

  Hub(HubOptions opts, AppliedFn applied);
  // `fanout_threads` as in HubOptions; stale_after is the default.
  explicit Hub(size_t max_subscribers, AppliedFn applied = {}, size_t fanout_threads = 1)
      : Hub(default_options(max_subscribers, fanout_threads), std::move(applied)) {}

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
  // The snapshot every live subscriber that is not stale acknowledged (the current one when
  // there is none).
  model::SnapshotPtr applied() const;
  uint64_t next_id() { return next_id_.fetch_add(1) + 1; }

  // The hub's clock: subscribers stamp the responses they send with it.
  Clock::time_point now() const { return clock_ ? clock_() : Clock::now(); }
  // Marks the subscribers whose oldest unacknowledged response is stale_after old as stale
  // (and recomputes applied(g)), and those that caught up as counted again. Must run even when
  // no ack or snapshot arrives: the feed sink's timer calls it. Returns when it should run
  // next at the latest: the moment the next subscriber would turn stale (nullopt: none is
  // waiting for an ack, or staleness is off). Subscribers that start waiting later turn stale
  // no sooner than stale_after from now.
  std::optional<Clock::time_point> check_stale();
  std::chrono::milliseconds stale_after() const { return stale_after_; }
  size_t stale_subscribers() const;

 private:
  static HubOptions default_options(size_t max_subscribers, size_t fanout_threads) {
    HubOptions o;
    o.max_subscribers = max_subscribers;
    o.fanout_threads = fanout_threads;
    return o;
  }
  // What the ack arithmetic holds for one subscriber.
  struct Entry {
    model::SnapshotPtr recorded;  // the acknowledged snapshot last counted (or seen, if stale)
    bool stale = false;           // excluded: recorded is not in acked_
  };
  // Moves `s`'s entry in acked_ to what it reports now. Under acks_mu_.
  void refresh_locked(Subscriber* s, Entry& e);
  // Decides whether `s` is stale at `now`; logs and counts a change. Under acks_mu_. Returns
  // the time it turns stale if it is counted and waiting for an ack.
  std::optional<Clock::time_point> update_stale_locked(Subscriber* s, Entry& e,
                                                       Clock::time_point now);
  void count_locked(const model::SnapshotPtr& snap, int by);
  // applied_ from acked_; the snapshot to report when it moved. Under acks_mu_.
  model::SnapshotPtr recompute_locked();
  void report(const model::SnapshotPtr& snap);

  const size_t max_subscribers_;
  AppliedFn applied_fn_;
  const std::chrono::milliseconds stale_after_;
  const std::function<Clock::time_point()> clock_;
  Metrics* const metrics_;
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
  std::unordered_map<Subscriber*, Entry> recorded_;
  size_t stale_count_ = 0;
  // Acknowledged generation → how many subscribers that are not stale are there, and that
  // snapshot.
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
