// The feed hub: subscriber registry, ghosts, ack arithmetic and the feed's applied(g). The state
// file the named subscribers are kept in across a restart is hub_state.cc.
#include "feed/hub.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>

#include "feed/metrics.h"

namespace endpointd::feed {

namespace {

constexpr const char* kDisconnected = "disconnected";
constexpr const char* kUnacknowledged = "unacknowledged";
constexpr const char* kNacking = "nacking";

Metrics::Lapse lapse_of(const char* reason) {
  if (reason == kDisconnected) return Metrics::Lapse::kDisconnected;
  if (reason == kNacking) return Metrics::Lapse::kNacking;
  return Metrics::Lapse::kUnacknowledged;
}

int64_t ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

uint64_t generation(const model::SnapshotPtr& s) {
  return s ? s->generation : 0;
}

// The older of two acknowledged states (a null one is no state).
model::SnapshotPtr older(const model::SnapshotPtr& a, const model::SnapshotPtr& b) {
  if (!a) return b;
  if (!b) return a;
  return b->generation < a->generation ? b : a;
}

}  // namespace

void AckTracker::sent(model::SnapshotPtr snap, Clock::time_point now) {
  const uint64_t v = snap->generation;
  in_flight_.push_back({v, std::move(snap), now});
  if (in_flight_.size() > kMaxInFlight) {
    // Forgotten, not acknowledged: the client has been waited on since then.
    const Clock::time_point oldest = in_flight_.front().sent_at;
    in_flight_.pop_front();
    in_flight_.front().sent_at = oldest;
  }
  sent_versions_.push_back(v);
  if (sent_versions_.size() > kRememberedSends) sent_versions_.pop_front();
}

void AckTracker::unchanged(const model::SnapshotPtr& snap) {
  if (in_flight_.empty()) {
    // Everything sent was acknowledged, and this snapshot changes none of it. A resumed client
    // still routes by what its earlier stream left until it acknowledges something here.
    if (resumed_since_) return;
    if (!acked_ || snap->generation > acked_->generation) acked_ = snap;
  } else if (snap->generation > in_flight_.back().equivalent->generation) {
    in_flight_.back().equivalent = snap;
  }
}

bool AckTracker::ack(uint64_t version) {
  // The newest response of that version: an xDS stream may send one version twice (a
  // subscription change), and the ack of the second covers the first.
  auto rit = std::find_if(in_flight_.rbegin(), in_flight_.rend(),
                          [&](const InFlight& f) { return f.version == version; });
  if (rit == in_flight_.rend()) {
    if (version == 0 || sent_versions_.empty()) return false;
    // Late or repeated: it was sent and moves nothing. Older than anything remembered: it
    // cannot be told apart, and it moves nothing either.
    if (version < sent_versions_.front()) return true;
    return std::binary_search(sent_versions_.begin(), sent_versions_.end(), version);
  }
  auto it = std::prev(rit.base());
  if (!acked_ || it->equivalent->generation > acked_->generation) acked_ = it->equivalent;
  acked_version_ = std::max(acked_version_, version);
  in_flight_.erase(in_flight_.begin(), it + 1);
  nacking_ = false;
  resumed_since_.reset();
  at_nothing_ = false;
  return true;
}

bool AckTracker::resume(const model::SnapshotPtr& last, Clock::time_point since) {
  if (acked_version_ != 0) return false;  // acknowledged here: newer than anything before
  if (!last) at_nothing_ = true;          // older than anything this process has
  if (at_nothing_) {
    acked_ = nullptr;
  } else if (!acked_ || last->generation < acked_->generation) {
    acked_ = last;
  }
  if (!resumed_since_ || since < *resumed_since_) resumed_since_ = since;
  return true;
}

std::optional<Clock::time_point> AckTracker::outstanding_since() const {
  std::optional<Clock::time_point> t = resumed_since_;
  if (!in_flight_.empty() && (!t || in_flight_.front().sent_at < *t))
    t = in_flight_.front().sent_at;
  return t;
}

Hub::Hub(HubOptions opts, AppliedFn applied)
    : max_subscribers_(opts.max_subscribers),
      applied_fn_(std::move(applied)),
      grace_(opts.grace),
      clock_(std::move(opts.clock)),
      metrics_(opts.metrics),
      holdouts_fn_(std::move(opts.holdouts)),
      fanout_(opts.fanout_threads),
      state_file_(grace_.count() > 0 ? std::move(opts.state_file) : std::string()) {
  if (grace_.count() <= 0 && !opts.state_file.empty())
    spdlog::warn("feed: the subscriber grace is 0 (no ghosts): state file {} is not used",
                 opts.state_file);
  if (state_file_.empty()) return;
  load_state();
  state_writer_ = std::thread([this] { run_state_writer(); });
}

Hub::~Hub() {
  if (!state_writer_.joinable()) return;
  {
    std::lock_guard lock(state_mu_);
    state_stop_ = true;
  }
  state_cv_.notify_all();
  state_writer_.join();
  write_state();
}

void Hub::publish(model::SnapshotPtr snap) {
  if (!snap->synced) return;  // subscribers see nothing until the first full sync
  Pending p;
  {
    std::lock_guard lock(mu_);
    if (current_ && snap->generation <= current_->generation) return;  // never backwards
    current_ = snap;
    fanout_.run(subscribers_.size(), [&](size_t i) { subscribers_[i]->notify(snap); });
    std::lock_guard acks(acks_mu_);
    acks_current_ = snap;
    // A change a subscriber does not see moved its ack at once.
    for (auto& [s, e] : recorded_) refresh_locked(s, e);
    p = settle_locked();
  }
  deliver(std::move(p));
}

model::SnapshotPtr Hub::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

bool Hub::add(Subscriber* s) {
  std::lock_guard lock(mu_);
  if (subscribers_.size() >= max_subscribers_) return false;
  subscribers_.push_back(s);
  std::lock_guard acks(acks_mu_);
  refresh_locked(s, recorded_[s]);
  return true;
}

void Hub::remove(Subscriber* s) {
  Pending p;
  {
    std::lock_guard lock(mu_);
    auto it = std::find(subscribers_.begin(), subscribers_.end(), s);
    if (it == subscribers_.end()) return;
    *it = subscribers_.back();  // order does not matter
    subscribers_.pop_back();
    std::lock_guard acks(acks_mu_);
    auto rec = recorded_.find(s);
    if (rec != recorded_.end()) {
      const Entry e = std::move(rec->second);
      recorded_.erase(rec);
      if (e.lapsed) {
        --lapsed_streams_;
        if (metrics_) metrics_->stale_left();
        holdouts_changed_ = true;
      } else {
        count_entry_locked(e, -1);
      }
      if (!e.identity.empty()) {
        auto [first, last] = named_.equal_range(e.identity);
        for (auto n = first; n != last; ++n) {
          if (n->second == s) {
            named_.erase(n);
            break;
          }
        }
        leave_ghost_locked(s, e, now());
      }
    }
    // An anonymous stream that went away stops holding back applied(g).
    p = settle_locked();
  }
  deliver(std::move(p));
}

void Hub::leave_ghost_locked(Subscriber* s, const Entry& e, Clock::time_point now) {
  // It acknowledged nothing (it came before the first snapshot): it routes by nothing we sent.
  // (One at nothing routes by what an earlier process sent.)
  if (!e.recorded && !e.at_nothing) return;
  const auto waiting = s->outstanding_since();
  const Clock::time_point since = waiting ? std::min(*waiting, now) : now;
  // Another stream of the same name (the proxy reconnected before this one ended): it routes
  // by what this one confirmed until it acknowledges something of its own.
  auto [first, last] = named_.equal_range(e.identity);
  if (first != last) {
    for (auto n = first; n != last; ++n) {
      Subscriber* other = n->second;
      if (!other->resume(e.recorded, since)) continue;  // it acknowledged newer: superseded
      auto o = recorded_.find(other);
      if (o == recorded_.end()) continue;
      if (e.at_nothing) set_at_nothing_locked(o->second, e.revision);
      refresh_locked(other, o->second);
      update_lapse_locked(other, o->second, now);
    }
    return;
  }

  const SubscriberInfo row = s->info();
  Ghost g;
  g.snapshot = e.recorded;
  g.revision = e.revision;
  g.waiting_since = since;
  g.gone_at = now;
  g.holding = !e.lapsed;
  if (e.lapsed) {
    g.lapsed_at = e.lapsed_at;
    g.reason = e.reason;
  }
  g.row = row;
  g.row.connected = false;

  auto [it, fresh] = ghosts_.try_emplace(e.identity);
  Ghost& slot = it->second;
  if (!fresh) {
    // Two streams of one name that both went away: the older state, held if either held,
    // so that what one of them still routes by is never let go early.
    if (slot.holding) {
      count_ghost_locked(slot, -1);
      --ghosts_holding_;
    }
    if (!slot.snapshot || !g.snapshot) {
      // One is at nothing: so is the other, at the older revision remembered.
      g.revision = !slot.snapshot && !g.snapshot ? std::min(slot.revision, g.revision)
                   : !slot.snapshot              ? slot.revision
                                                 : g.revision;
      g.snapshot = nullptr;
    } else {
      g.snapshot = older(slot.snapshot, g.snapshot);
    }
    if (slot.holding && g.holding) {
      g.waiting_since = std::min(slot.waiting_since, g.waiting_since);
    } else if (slot.holding) {
      g.holding = true;
      g.waiting_since = slot.waiting_since;
    } else if (!g.holding) {
      g.lapsed_at = std::min(slot.lapsed_at, g.lapsed_at);
      g.reason = slot.reason;
    }
    holdouts_changed_ = true;  // the lapsed one's snapshot or place may have changed
  }
  slot = std::move(g);
  if (slot.holding) {
    count_ghost_locked(slot, +1);
    ++ghosts_holding_;
    spdlog::info(
        "feed: subscriber {} ({} stream, client '{}', peer {}) went away having acknowledged "
        "generation {}; it holds the feed's applied generation until a stream of that name "
        "acknowledges a newer one, for {} ms at most",
        row.id, row.api, e.identity, row.peer, generation(slot.snapshot),
        std::max<int64_t>(0, ms(slot.waiting_since + grace_ - now)));
  } else {
    holdouts_changed_ = true;
  }

  if (ghosts_.size() > kMaxGhosts) {
    // The one gone longest goes first (never the one just left).
    auto oldest = ghosts_.end();
    for (auto g2 = ghosts_.begin(); g2 != ghosts_.end(); ++g2) {
      if (g2 == it) continue;
      if (oldest == ghosts_.end() || g2->second.gone_at < oldest->second.gone_at) oldest = g2;
    }
    if (oldest != ghosts_.end()) forget_ghost_locked(oldest, false);
  }
}

void Hub::forget_ghost_locked(std::map<std::string, Ghost>::iterator it, bool expired) {
  Ghost& g = it->second;
  if (g.holding) {
    count_ghost_locked(g, -1);
    --ghosts_holding_;
  } else {
    holdouts_changed_ = true;
  }
  if (metrics_) metrics_->forgotten(expired ? Metrics::Forget::kExpired : Metrics::Forget::kLimit);
  if (expired) {
    spdlog::info(
        "feed: forgetting subscriber '{}' (gone {} ms, lapsed at generation {}): it is no "
        "longer a holdout",
        it->first, ms(now() - g.gone_at), generation(g.snapshot));
  } else if (uint64_t k = ++ghosts_over_limit_; (k & (k - 1)) == 0) {
    spdlog::warn(
        "feed: more than {} subscribers gone: forgot '{}' ({}, at generation {}), the one "
        "gone longest ({} so far)",
        kMaxGhosts, it->first, g.holding ? "still holding" : "a holdout", generation(g.snapshot),
        k);
  }
  ghosts_.erase(it);
}

void Hub::identify(Subscriber* s, const std::string& identity) {
  if (grace_.count() <= 0 || identity.empty() || identity.size() > kMaxIdentityBytes) return;
  Pending p;
  {
    std::lock_guard acks(acks_mu_);
    auto rec = recorded_.find(s);
    if (rec == recorded_.end() || !rec->second.identity.empty()) return;
    Entry& e = rec->second;
    e.identity = identity;
    if (e.lapsed) e.label = identity;
    named_.emplace(identity, s);
    auto it = ghosts_.find(identity);
    if (it != ghosts_.end()) {
      Ghost g = std::move(it->second);
      ghosts_.erase(it);
      if (g.holding) {
        count_ghost_locked(g, -1);
        --ghosts_holding_;
      } else {
        holdouts_changed_ = true;
      }
      const Clock::time_point t = now();
      if (s->resume(g.snapshot, g.waiting_since)) {
        // This stream carries the ghost now: from its snapshot (from nothing for one
        // remembered from before a restart), and lapsed if it was.
        if (!g.snapshot) set_at_nothing_locked(e, g.revision);
        if (!g.holding && !e.lapsed) {
          count_entry_locked(e, -1);
          e.lapsed = true;
          e.lapsed_at = g.lapsed_at;
          e.reason = g.reason;
          e.label = identity;
          ++lapsed_streams_;
          if (metrics_) metrics_->stale_entered(false);
        }
        refresh_locked(s, e);
        update_lapse_locked(s, e, t);
        if (g.snapshot) {
          spdlog::info(
              "feed: subscriber '{}' is back (stream {}); it holds from generation {}, what it "
              "acknowledged before, until it acknowledges a newer one",
              identity, s->info().id, generation(g.snapshot));
        } else {
          spdlog::info(
              "feed: subscriber '{}', remembered from before this process started (EndpointSlice "
              "revision {}), is back (stream {}); it holds at nothing until it acknowledges a "
              "response of this process",
              identity, g.revision, s->info().id);
        }
      }
      // Otherwise it already acknowledged a newer state on this stream: the ghost is done.
    }
    p = settle_locked();
  }
  deliver(std::move(p));
}

void Hub::acks_changed(Subscriber* s) {
  Pending p;
  {
    std::lock_guard acks(acks_mu_);
    auto it = recorded_.find(s);
    if (it == recorded_.end()) return;
    refresh_locked(s, it->second);
    // An ack may be the one that brings a lapsed subscriber back.
    if (it->second.lapsed && grace_.count() > 0) update_lapse_locked(s, it->second, now());
    p = settle_locked();
  }
  deliver(std::move(p));
}

void Hub::count_locked(const model::SnapshotPtr& snap, int by) {
  if (!snap) return;
  if (by > 0) {
    AckedAt& at = acked_[snap->generation];
    if (at.count++ == 0) at.snap = snap;
    return;
  }
  auto at = acked_.find(snap->generation);
  if (at != acked_.end() && --at->second.count == 0) acked_.erase(at);
}

void Hub::count_entry_locked(const Entry& e, int by) {
  if (!e.at_nothing) return count_locked(e.recorded, by);
  if (by > 0) {
    ++nothing_holding_;
  } else {
    --nothing_holding_;
  }
}

void Hub::count_ghost_locked(const Ghost& g, int by) {
  if (g.snapshot) return count_locked(g.snapshot, by);
  if (by > 0) {
    ++nothing_holding_;
  } else {
    --nothing_holding_;
  }
}

void Hub::set_at_nothing_locked(Entry& e, uint64_t revision) {
  if (e.at_nothing) {
    e.revision = std::min(e.revision, revision);
    return;
  }
  if (!e.lapsed) {
    count_locked(e.recorded, -1);
    ++nothing_holding_;
  } else {
    holdouts_changed_ = true;
  }
  e.recorded = nullptr;
  e.at_nothing = true;
  e.revision = revision;
}

void Hub::refresh_locked(Subscriber* s, Entry& e) {
  model::SnapshotPtr now = s->acked();
  if (e.at_nothing) {
    if (!now) return;
    // It acknowledged a response sent on this stream: it holds from there.
    e.at_nothing = false;
    if (!e.lapsed) {
      --nothing_holding_;
      count_locked(now, +1);
    } else {
      holdouts_changed_ = true;
    }
    e.recorded = std::move(now);
    return;
  }
  if (now == e.recorded) return;
  if (now && e.recorded && now->generation == e.recorded->generation) return;
  if (!e.lapsed) {
    count_locked(e.recorded, -1);
    count_locked(now, +1);
  } else {
    holdouts_changed_ = true;  // its holdout's snapshot moved
  }
  e.recorded = std::move(now);
}

std::optional<Clock::time_point> Hub::update_lapse_locked(Subscriber* s, Entry& e,
                                                          Clock::time_point now) {
  const auto since = s->outstanding_since();
  const bool overdue = since && now - *since >= grace_;
  if (overdue == e.lapsed) {
    if (!e.lapsed && since) return *since + grace_;
    return std::nullopt;
  }
  // Identity for the log line; under acks_mu_, as the subscriber may go away once it is left.
  const SubscriberInfo i = s->info();
  holdouts_changed_ = true;
  if (overdue) {
    count_entry_locked(e, -1);
    e.lapsed = true;
    e.lapsed_at = now;
    e.reason = s->nacking() ? kNacking : kUnacknowledged;
    e.label = !e.identity.empty() ? e.identity : "stream " + std::to_string(i.id) + " " + i.peer;
    ++lapsed_streams_;
    if (metrics_) {
      metrics_->stale_entered(true);
      metrics_->lapsed(lapse_of(e.reason));
    }
    spdlog::warn(
        "feed: subscriber {} ({} stream, client '{}', peer {}) has left a response "
        "unacknowledged for {} ms (sent version {}, acknowledged {}{}); it no longer holds the "
        "feed's applied generation and is a holdout at generation {}: drains that it may still "
        "route to are unconfirmed",
        i.id, i.api, i.client, i.peer, ms(now - *since), i.sent_version, i.acked_version,
        e.reason == kNacking ? ", then rejected one" : "", generation(e.recorded));
  } else {
    e.lapsed = false;
    count_entry_locked(e, +1);
    --lapsed_streams_;
    if (metrics_) metrics_->stale_left();
    spdlog::info(
        "feed: subscriber {} ({} stream, client '{}', peer {}) acknowledged version {}; it "
        "holds the feed's applied generation again",
        i.id, i.api, i.client, i.peer, i.acked_version);
  }
  return std::nullopt;
}

std::optional<Clock::time_point> Hub::check_ghosts_locked(Clock::time_point now) {
  std::optional<Clock::time_point> next;
  auto sooner = [&](Clock::time_point t) {
    if (!next || t < *next) next = t;
  };
  for (auto it = ghosts_.begin(); it != ghosts_.end();) {
    Ghost& g = it->second;
    if (g.holding) {
      const Clock::time_point due = g.waiting_since + grace_;
      if (now < due) {
        sooner(due);
        ++it;
        continue;
      }
      count_ghost_locked(g, -1);
      --ghosts_holding_;
      g.holding = false;
      g.lapsed_at = now;
      g.reason = kDisconnected;
      holdouts_changed_ = true;
      if (metrics_) metrics_->lapsed(Metrics::Lapse::kDisconnected);
      if (!g.snapshot) {
        spdlog::warn(
            "feed: subscriber '{}', remembered from before this process started, has not come "
            "back for {} ms; it no longer holds the feed's applied generation and is a holdout "
            "at EndpointSlice revision {}: drains of endpoints terminating since are "
            "unconfirmed",
            it->first, ms(now - g.gone_at), g.revision);
      } else {
        spdlog::warn(
            "feed: subscriber '{}' (last {} stream {}, peer {}) has not come back for {} ms; it no "
            "longer holds the feed's applied generation and is a holdout at generation {}: drains "
            "that it may still route to are unconfirmed",
            it->first, g.row.api, g.row.id, g.row.peer, ms(now - g.gone_at),
            generation(g.snapshot));
      }
    }
    const Clock::time_point forget = std::max(g.lapsed_at, g.gone_at) + kForgetAfter;
    if (now >= forget) {
      auto gone = it++;
      forget_ghost_locked(gone, true);
      continue;
    }
    sooner(forget);
    ++it;
  }
  return next;
}

std::optional<Clock::time_point> Hub::check_graces() {
  if (grace_.count() <= 0) return std::nullopt;
  Pending p;
  std::optional<Clock::time_point> next;
  {
    std::lock_guard acks(acks_mu_);
    const Clock::time_point t = now();
    for (auto& [s, e] : recorded_) {
      // A lapsed subscriber's ack may have moved without acks_changed (a snapshot it does
      // not see); keep what it reports current before it counts again.
      refresh_locked(s, e);
      auto due = update_lapse_locked(s, e, t);
      if (due && (!next || *due < *next)) next = due;
    }
    auto ghosts_due = check_ghosts_locked(t);
    if (ghosts_due && (!next || *ghosts_due < *next)) next = ghosts_due;
    p = settle_locked();
  }
  deliver(std::move(p));
  return next;
}

size_t Hub::lapsed_streams() const {
  std::lock_guard lock(acks_mu_);
  return lapsed_streams_;
}

size_t Hub::ghosts() const {
  std::lock_guard lock(acks_mu_);
  return ghosts_.size();
}

std::vector<Holdout> Hub::holdouts() const {
  std::lock_guard lock(acks_mu_);
  return holdouts_locked();
}

std::vector<Holdout> Hub::holdouts_locked() const {
  std::vector<Holdout> out;
  if (lapsed_streams_ > 0) {
    for (const auto& [s, e] : recorded_) {
      if (e.lapsed && (e.recorded || e.at_nothing))
        out.push_back({e.label, e.recorded, e.lapsed_at, e.reason, e.at_nothing ? e.revision : 0});
    }
  }
  // A ghost without a snapshot was remembered from before a restart: only its revision.
  for (const auto& [name, g] : ghosts_) {
    if (!g.holding)
      out.push_back({name, g.snapshot, g.lapsed_at, g.reason, g.snapshot ? 0 : g.revision});
  }
  std::sort(out.begin(), out.end(), [](const Holdout& a, const Holdout& b) {
    return std::tie(a.since, a.client) < std::tie(b.since, b.client);
  });
  return out;
}

model::SnapshotPtr Hub::recompute_locked() {
  if (!acks_current_) return nullptr;
  // A subscriber remembered from before a restart may route by anything older than what this
  // process has: nothing moves until it is back or lapsed.
  if (nothing_holding_ > 0) return nullptr;
  model::SnapshotPtr low = acks_current_;
  if (!acked_.empty() && acked_.begin()->first < low->generation) low = acked_.begin()->second.snap;
  // Generations only grow: a subscriber that joins starts at the current snapshot or at what
  // its name held (never older than applied_), so the minimum never moves back; guard anyway.
  if (applied_ && low->generation <= applied_->generation) return nullptr;
  applied_ = low;
  return low;
}

Hub::Pending Hub::settle_locked() {
  Pending p;
  p.moved = recompute_locked();
  if (holdouts_changed_) {
    holdouts_changed_ = false;
    p.holdouts = holdouts_locked();
    if (metrics_) metrics_->holdouts(p.holdouts->size());
  }
  if (metrics_) metrics_->ghosts_holding(ghosts_holding_);
  mark_state_dirty();
  // Taken before acks_mu_ is let go: the next change waits for this one to be told.
  if (p.moved || p.holdouts) p.order = std::unique_lock(deliver_mu_);
  return p;
}

void Hub::deliver(Pending p) {
  // The holdouts first: a subscriber that stops holding is on the board before the applied(g)
  // its lapse lets move, so no reader sees the one without the other.
  if (p.holdouts && holdouts_fn_) holdouts_fn_(std::move(*p.holdouts));
  if (p.moved && applied_fn_) applied_fn_(p.moved);
}  // p.order: the next change may be told

std::shared_ptr<const model::Delta> Hub::diff(const model::SnapshotPtr& from,
                                              const model::SnapshotPtr& to) {
  std::lock_guard lock(diff_mu_);
  for (const auto& d : diffs_)
    if (d.from == from->generation && d.to == to->generation) return d.delta;
  auto delta = std::make_shared<const model::Delta>(model::diff(from.get(), *to));
  diffs_.push_back({from->generation, to->generation, delta});
  if (diffs_.size() > 8) diffs_.pop_front();
  return delta;
}

size_t Hub::subscribers() const {
  std::lock_guard lock(mu_);
  return subscribers_.size();
}

std::vector<SubscriberInfo> Hub::infos() const {
  std::lock_guard lock(mu_);  // keeps every subscriber alive
  struct Flags {
    bool holding;
    const char* reason;
  };
  std::unordered_map<const Subscriber*, Flags> flags;
  std::vector<SubscriberInfo> ghost_rows;
  {
    // Only the flags and the ghosts under acks_mu_: acks do not wait while every row is built.
    std::lock_guard acks(acks_mu_);
    for (const auto& [s, e] : recorded_)
      if (e.lapsed) flags[s] = {false, e.reason};
    for (const auto& [name, g] : ghosts_) {
      ghost_rows.push_back(g.row);
      SubscriberInfo& r = ghost_rows.back();
      r.client = name;
      r.acked_generation = generation(g.snapshot);
      r.holding = g.holding;
      r.lapsed = g.holding ? "" : g.reason;
    }
  }
  std::vector<SubscriberInfo> out;
  out.reserve(subscribers_.size() + ghost_rows.size());
  for (Subscriber* s : subscribers_) {
    out.push_back(s->info());
    if (auto f = flags.find(s); f != flags.end()) {
      out.back().holding = false;
      out.back().lapsed = f->second.reason;
    }
  }
  for (auto& r : ghost_rows) out.push_back(std::move(r));
  return out;
}

model::SnapshotPtr Hub::applied() const {
  std::lock_guard lock(acks_mu_);
  return applied_;
}

}  // namespace endpointd::feed
