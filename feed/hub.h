// The feed's hub: the newest snapshot, the subscribers (UpstreamFeed watch streams, xDS
// streams, and the ghosts of those that went away) and the acknowledgement arithmetic that
// turns their acks into the feed sink's applied(g). No gRPC here, so all of it is testable
// without a server.
//
// Subscribers are identities, not streams (../shared/DESIGN.md, "What confirmed means"): a
// proxy routes by the last config it accepted whether or not it is connected, and Envoy keeps
// routing by its last EDS while it reconnects.
//
// Ghosts. A stream whose client named itself (Subscribe.client_name; the xDS node id) and goes
// away leaves a ghost under that name: its last acknowledged snapshot keeps holding applied(g).
// A stream that names itself the same takes the ghost over (Hub::identify): it starts from the
// ghost's snapshot, not the current one, and holds until it acknowledges a response sent on it.
// A stream of that name still connected when the other goes (a proxy that reconnected before
// its old stream ended) is held the same way, unless it acknowledged a response already. A new
// name starts at the current snapshot (it was told nothing older); a stream without a name
// holds only while it is connected, as it can never be recognised again. One name is one
// subscriber: two proxies that give the same name are taken for one.
//
// Remembered subscribers. With a state file (HubOptions::state_file, --feed-state-file) the
// hub writes every named subscriber it knows (connected, ghost or holdout) there: its name,
// the EndpointSlice revision of its last acknowledged snapshot, whether it was caught up. At
// most kMaxGhosts of them, written atomically (a temporary file, then rename), at most every
// kStateWriteInterval and on stop. A new process (an agent restarted) loads the file: each
// name is a ghost from the start without a snapshot (this process never had it) — it holds
// applied(g) at nothing, as a proxy that stayed away may route by anything older than what
// this process has, until a stream of that name acknowledges a response sent on it, or its
// grace passes: then it is a holdout with no snapshot and the remembered revision, which
// drain/ takes as routing to every endpoint terminating since. A stream that takes such a
// ghost over holds at nothing until it acknowledges. A file that cannot be read, is larger
// than kMaxStateFileBytes or does not parse is logged, counted and ignored (the hub starts
// empty).
//
// Grace. A subscriber is waited for at most `grace` (--feed-subscriber-grace-ms, default 10 s)
// from the moment it is first waited on: its oldest response not acknowledged (NACKed ones
// included) or its disconnection, whichever came first; a stream that takes a ghost over
// carries the ghost's wait on, so a proxy that reconnects over and over is not waited for
// longer. Past that it lapses: it stops holding applied(g), so a proxy that is gone, wedged or
// rejecting its config cannot hold every drain on the node until its deadline, and it becomes
// a holdout on the acknowledgement board (pipeline/ack_board.h: its name, or "stream <id>
// <peer>" without one; its last acknowledged snapshot; when it lapsed; "disconnected",
// "unacknowledged" or "nacking"), which drain/ reads: a release whose endpoint a holdout's
// snapshot still routes to is unconfirmed. Holdouts reach the board before the applied(g) their
// lapse lets through. Each lapse is counted and logged with the name.
//
// A lapsed stream stays connected and keeps getting updates, and is a holdout while it is; it
// holds again, and leaves the board, once an ack leaves nothing unacknowledged for that long
// (acknowledging the newest version it was sent always does). A lapsed ghost leaves the board
// when its name comes back and catches up, or kForgetAfter (10 min) after it lapsed or went
// away, whichever is later; at most kMaxGhosts ghosts are kept, the one gone longest forgotten
// first (each forgetting counted and logged). applied(g) never moves back: a subscriber that
// holds again while behind holds it where it is until it catches up.
//
// grace 0: no ghosts and no lapses — a stream holds while it is connected, however long, and
// not after.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "feed/fanout.h"
#include "model/snapshot.h"
#include "pipeline/ack_board.h"

namespace endpointd::feed {

class Metrics;

using Clock = std::chrono::steady_clock;
using Holdout = pipeline::AckBoard::Holdout;

// How long a subscriber is waited for (see the top of this file). A healthy proxy
// acknowledges in milliseconds (Envoy and proxyless gRPC apply EDS at once; endpointd-haproxy
// after one runtime-API pass, bounded by its 2 s timeout) and reconnects within a few seconds
// (Envoy's backoff starts at 0.5 s); a few seconds more absorb a GC pause or CPU throttling.
// The drain deadline is 24 s, so 10 s leaves a drain held by a dead or wedged proxy more than
// half its budget for connections to finish, where keepalive alone (30 s + 10 s) would notice a
// dead peer only after the deadline.
inline constexpr std::chrono::milliseconds kDefaultGrace{10000};
// How long a lapsed ghost stays a holdout. A proxy cut off from the feed may route by its last
// config for as long as it runs; ten minutes covers a restart or a network partition healing,
// after which a proxy still alive has reconnected (and is known again) or is taken for gone.
inline constexpr std::chrono::minutes kForgetAfter{10};
// Ghosts kept at most (their holdouts with them): a few KB each. A node's proxies are tens;
// this is room for a fleet of reconnecting clients, and a bound on what names cost.
inline constexpr size_t kMaxGhosts = 1024;
// A longer name is no identity (its stream is anonymous): a ghost is kept per name.
inline constexpr size_t kMaxIdentityBytes = 512;
// The state file (see the top of this file): written at most this often, read at most this
// large (a full one of kMaxGhosts names is well under it; a writer stops adding names there).
inline constexpr std::chrono::milliseconds kStateWriteInterval{250};
inline constexpr size_t kMaxStateFileBytes = size_t{1} << 20;

// What one subscriber confirmed. Fed by its stream: every response sent (with the snapshot
// whose state it carries), every snapshot that changed nothing the subscriber sees, and every
// ack. acked() is the newest snapshot whose state the subscriber is known to route by: the
// snapshot it acknowledged, or a newer one that differs from it only in what it does not
// subscribe to. A subscriber starts at the snapshot current when it joined: it has been told
// nothing older, so it holds back no removal that happened before it came — unless it is
// resumed from an earlier stream of its identity (resume()).
class AckTracker {
 public:
  // Unacknowledged responses remembered; older ones can no longer be acknowledged (a newer
  // ack covers them).
  static constexpr size_t kMaxInFlight = 16;
  // Versions sent remembered, acknowledged or not, to tell a late or repeated ack (harmless)
  // from one of a version never sent (refused).
  static constexpr size_t kRememberedSends = 64;

  explicit AckTracker(model::SnapshotPtr joined) : acked_(std::move(joined)) {}

  // A response carrying `snap`'s state was sent at `now`.
  void sent(model::SnapshotPtr snap, Clock::time_point now);
  // `snap` is newer than the last response and changes nothing this subscriber receives.
  void unchanged(const model::SnapshotPtr& snap);
  // The client applied the response of `version`. false: this stream never sent that version
  // (a bogus ack: refused, nothing changes). A late or repeated ack of a version sent is
  // true and moves nothing.
  bool ack(uint64_t version);
  // The client rejected a response (an xDS NACK): nacking() until it acknowledges one.
  void nacked() { nacking_ = true; }
  bool nacking() const { return nacking_; }
  // The client's identity last acknowledged `last` on an earlier stream, and has been waited
  // on since `since`. Unless this stream already had a response acknowledged (its state is
  // newer), the client routes by `last` until it acknowledges one here: acked() goes back to
  // `last` and stays until then, and the wait counts from `since`. false: it already had.
  // `last` null (a subscriber remembered from before a restart): acked() is null until then.
  bool resume(const model::SnapshotPtr& last, Clock::time_point since);
  // Nothing is waited for: every response sent was acknowledged, and it is not resumed.
  bool caught_up() const { return in_flight_.empty() && !resumed_since_; }
  const model::SnapshotPtr& acked() const { return acked_; }
  uint64_t acked_version() const { return acked_version_; }
  uint64_t sent_version() const {
    return in_flight_.empty() ? acked_version_ : in_flight_.back().version;
  }
  // Since when the client has been waited on: the oldest response not yet acknowledged, or
  // the resumption's wait; nullopt when caught up.
  std::optional<Clock::time_point> outstanding_since() const;

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
  std::deque<uint64_t> sent_versions_;  // the last kRememberedSends, oldest first
  bool nacking_ = false;
  std::optional<Clock::time_point> resumed_since_;  // set while resumed and nothing acked
  bool at_nothing_ = false;  // resumed from a remembered subscriber and nothing acked since
};

// A row of /debug/state's feed section: a stream, or the ghost of one (connected false).
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
  bool connected = true;  // false: the ghost of a stream that went away (its last row)
  bool holding = true;    // counts toward applied(g); false once its grace passed
  std::string lapsed;     // why it stopped holding: "disconnected", "unacknowledged", "nacking"
};

class Subscriber {
 public:
  virtual ~Subscriber() = default;
  // A new snapshot; called on the sink thread, one call at a time per subscriber.
  virtual void notify(const model::SnapshotPtr& snap) = 0;
  // The snapshot this subscriber's confirmed state matches (null: none yet, or resumed from a
  // remembered subscriber and nothing acknowledged since).
  virtual model::SnapshotPtr acked() const = 0;
  // When the oldest response it has not acknowledged was sent, by the hub's clock (Hub::now);
  // nullopt when it acknowledged everything. Subscribers that never wait for acks need not
  // say.
  virtual std::optional<Clock::time_point> outstanding_since() const { return std::nullopt; }
  // Whether its client rejected a response since it last acknowledged one.
  virtual bool nacking() const { return false; }
  // AckTracker::resume on its tracker. Called by the hub, under its locks.
  virtual bool resume(const model::SnapshotPtr& last, Clock::time_point since) = 0;
  virtual SubscriberInfo info() const = 0;
};

struct HubOptions {
  size_t max_subscribers = 4096;
  // How many threads notify subscribers in publish() (0: one per core, at most
  // FanOut::kMaxThreads; 1: the caller alone).
  size_t fanout_threads = 1;
  // How long a subscriber is waited for (see the top of this file); zero or less: ghosts off
  // and no lapses.
  std::chrono::milliseconds grace = kDefaultGrace;
  std::function<Clock::time_point()> clock;  // null: Clock::now
  Metrics* metrics = nullptr;                // lapses and ghosts are counted here; may be null
  // Called with every holdout whenever the list changes (the feed sink: AckBoard::set_holdouts),
  // outside the hub's locks, one call at a time and in the order of the changes, and before the
  // applied(g) that the change lets move is reported. It must not call into the hub.
  std::function<void(std::vector<Holdout>)> holdouts;
  // The state file (see the top of this file); empty: none. Ignored when the grace is zero.
  std::string state_file;
};

class Hub {
 public:
  // Called with each new applied snapshot (the feed's applied(g)); outside the hub's locks, in
  // order. It must not call into the hub.
  using AppliedFn = std::function<void(const model::SnapshotPtr&)>;

  // Loads the state file, if any, and starts its writer.
  Hub(HubOptions opts, AppliedFn applied);
  // Stops the writer and writes the state file a last time.
  ~Hub();
  Hub(const Hub&) = delete;
  Hub& operator=(const Hub&) = delete;
  // `fanout_threads` as in HubOptions; the grace is the default.
  explicit Hub(size_t max_subscribers, AppliedFn applied = {}, size_t fanout_threads = 1)
      : Hub(default_options(max_subscribers, fanout_threads), std::move(applied)) {}

  // The sink thread: every subscriber is notified (shared among the fan-out threads), then
  // applied(g) is recomputed.
  void publish(model::SnapshotPtr snap);
  // The newest synced snapshot; null until the first one.
  model::SnapshotPtr current() const;

  // A new stream, anonymous until identify(). false when the limit is reached (the stream must
  // refuse itself).
  bool add(Subscriber* s);
  // The stream went away. Named: its ghost holds on (see the top of this file).
  void remove(Subscriber* s);
  // `s`'s client named itself `identity` (its first name counts; a later one is ignored). If a
  // ghost of that name waits, `s` takes it over (Subscriber::resume). Never call it holding a
  // subscriber's own lock. Ignored when the grace is zero or the name is longer than
  // kMaxIdentityBytes.
  void identify(Subscriber* s, const std::string& identity);
  // `s`'s acked() may have moved. Never call it holding a subscriber's own lock. Costs
  // O(log subscribers): the hub keeps a count of subscribers per acknowledged generation, so
  // 1,000 acks of one change are not 1,000 scans of 1,000 subscribers.
  void acks_changed(Subscriber* s);

  // The delta between two snapshots, computed once for all subscribers that need it.
  std::shared_ptr<const model::Delta> diff(const model::SnapshotPtr& from,
                                           const model::SnapshotPtr& to);

  size_t subscribers() const;  // streams connected
  // A row per stream, then one per ghost.
  std::vector<SubscriberInfo> infos() const;
  // The snapshot every subscriber that holds acknowledged (the current one when none holds).
  model::SnapshotPtr applied() const;
  uint64_t next_id() { return next_id_.fetch_add(1) + 1; }

  // The hub's clock: subscribers stamp the responses they send with it.
  Clock::time_point now() const { return clock_ ? clock_() : Clock::now(); }
  // Lapses the subscribers and ghosts whose grace passed (and recomputes applied(g)), counts
  // again the streams that caught up, forgets the holdouts kForgetAfter old. Must run even when
  // no ack or snapshot arrives: the feed sink's timer calls it. Returns when it should run next
  // at the latest (nullopt: nothing is waited for and no holdout is to be forgotten, or the
  // grace is zero). Subscribers that start waiting later lapse no sooner than grace from now.
  std::optional<Clock::time_point> check_graces();
  std::chrono::milliseconds grace() const { return grace_; }
  size_t lapsed_streams() const;  // streams connected that no longer hold
  size_t ghosts() const;          // holding or lapsed
  std::vector<Holdout> holdouts() const;
  // Writes the state file now (false: it failed, or there is none). The writer does it at
  // most every kStateWriteInterval after a change; the sink calls it on stop.
  bool write_state();
  // The named subscribers loaded from the state file at start.
  size_t remembered() const { return remembered_; }

 private:
  static HubOptions default_options(size_t max_subscribers, size_t fanout_threads) {
    HubOptions o;
    o.max_subscribers = max_subscribers;
    o.fanout_threads = fanout_threads;
    return o;
  }
  // What the ack arithmetic holds for one stream.
  struct Entry {
    model::SnapshotPtr recorded;  // the acknowledged snapshot last counted (or seen, if lapsed)
    std::string identity;         // empty: anonymous
    bool lapsed = false;          // excluded: recorded is not in acked_
    // It took over a remembered ghost and acknowledged nothing since: it holds at nothing
    // (counted in nothing_holding_ unless lapsed; recorded is null) and `revision` is the one
    // remembered.
    bool at_nothing = false;
    uint64_t revision = 0;
    // While lapsed: its holdout.
    Clock::time_point lapsed_at{};
    const char* reason = "";
    std::string label;  // the identity, or "stream <id> <peer>"
  };
  // What a named stream left when it went away.
  struct Ghost {
    // Its last acknowledged state; null for one remembered from the state file, which holds at
    // nothing (nothing_holding_) and has only `revision`.
    model::SnapshotPtr snapshot;
    uint64_t revision = 0;
    Clock::time_point waiting_since{};  // the grace runs from here
    Clock::time_point gone_at{};
    bool holding = true;  // in acked_; else a holdout
    Clock::time_point lapsed_at{};
    const char* reason = "";
    SubscriberInfo row;  // its stream's last row
  };
  // What to tell, outside the locks, after a change; `order` holds deliver_mu_ from the
  // change's critical section on, so that changes are told in the order they were made.
  struct Pending {
    model::SnapshotPtr moved;
    std::optional<std::vector<Holdout>> holdouts;
    std::unique_lock<std::mutex> order;
  };

  // Moves `s`'s entry in acked_ to what it reports now. Under acks_mu_.
  void refresh_locked(Subscriber* s, Entry& e);
  // Decides whether `s` lapsed at `now`; logs and counts a change. Under acks_mu_. Returns the
  // time it lapses if it holds and is waited on.
  std::optional<Clock::time_point> update_lapse_locked(Subscriber* s, Entry& e,
                                                       Clock::time_point now);
  // `s`, named, went away with `e`: its other streams take over its state, or a ghost does.
  void leave_ghost_locked(Subscriber* s, const Entry& e, Clock::time_point now);
  // Lapses the holding ghosts whose grace passed, forgets the holdouts due; the next deadline.
  std::optional<Clock::time_point> check_ghosts_locked(Clock::time_point now);
  void forget_ghost_locked(std::map<std::string, Ghost>::iterator it, bool expired);
  void count_locked(const model::SnapshotPtr& snap, int by);
  // count_locked, or nothing_holding_ for one at nothing.
  void count_entry_locked(const Entry& e, int by);
  void count_ghost_locked(const Ghost& g, int by);
  // `s`, entry `e`, now holds at nothing (it resumed a remembered ghost).
  void set_at_nothing_locked(Entry& e, uint64_t revision);
  void load_state();
  void run_state_writer();
  void mark_state_dirty();
  // applied_ from acked_; the snapshot to report when it moved. Under acks_mu_.
  model::SnapshotPtr recompute_locked();
  // recompute_locked() and the holdouts if they changed.
  Pending settle_locked();
  std::vector<Holdout> holdouts_locked() const;
  void deliver(Pending p);

  const size_t max_subscribers_;
  AppliedFn applied_fn_;
  const std::chrono::milliseconds grace_;
  const std::function<Clock::time_point()> clock_;
  Metrics* const metrics_;
  const std::function<void(std::vector<Holdout>)> holdouts_fn_;
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
  std::unordered_multimap<std::string, Subscriber*> named_;  // streams by identity
  std::map<std::string, Ghost> ghosts_;                      // by identity
  size_t lapsed_streams_ = 0;
  size_t ghosts_holding_ = 0;
  // Subscribers (remembered ghosts, streams that took one over) that hold applied(g) at
  // nothing: while any does, applied(g) does not move.
  size_t nothing_holding_ = 0;
  uint64_t ghosts_over_limit_ = 0;  // forgotten for kMaxGhosts, to log at powers of two
  bool holdouts_changed_ = false;
  // Acknowledged generation → how many subscribers that hold (streams and ghosts) are there,
  // and that snapshot.
  struct AckedAt {
    size_t count = 0;
    model::SnapshotPtr snap;
  };
  std::map<uint64_t, AckedAt> acked_;
  model::SnapshotPtr applied_;

  // Held while holdouts_fn_ and applied_fn_ are called: taken under acks_mu_ (the last of the
  // hub's locks) before it is let go, so one change is told before the next, and a lapse's
  // holdout is on the board before any applied(g) that comes after it. The callbacks must not
  // call into the hub.
  std::mutex deliver_mu_;

  std::mutex diff_mu_;
  struct CachedDiff {
    uint64_t from, to;
    std::shared_ptr<const model::Delta> delta;
  };
  std::deque<CachedDiff> diffs_;

  FanOut fanout_;  // used by publish() only, under mu_

  // The state file. state_mu_ is taken after acks_mu_ (mark_state_dirty), never before;
  // write_mu_ orders whole writes and is taken before acks_mu_.
  const std::string state_file_;
  size_t remembered_ = 0;
  std::mutex write_mu_;
  std::mutex state_mu_;
  std::condition_variable state_cv_;
  std::atomic<bool> state_dirty_{false};
  bool state_stop_ = false;
  uint64_t state_write_failures_ = 0;  // under write_mu_, to log at powers of two
  std::string last_written_;           // under write_mu_: the file's content as last written
  std::thread state_writer_;
};

}  // namespace endpointd::feed
