// The feed hub: subscriber registry, ghosts, ack arithmetic and the feed's applied(g).
#include "feed/hub.h"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>
#include <tuple>
#include <variant>

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

// The state file: a header line, then one line per named subscriber:
//   endpointd-feed-subscribers 1
//   <revision> <caught up: 0|1> <identity, percent-encoded>
// The identity's bytes up to ' ', '%' and from 0x7f on are written %XX.
namespace {

constexpr std::string_view kStateHeader = "endpointd-feed-subscribers 1";

void escape_to(std::string& out, std::string_view name) {
  static const char kHex[] = "0123456789ABCDEF";
  for (unsigned char c : name) {
    if (c <= ' ' || c >= 0x7f || c == '%') {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<std::string> unescape(std::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(in[i]);
    if (c <= ' ' || c >= 0x7f) return std::nullopt;
    if (c != '%') {
      out += static_cast<char>(c);
      continue;
    }
    const int hi = i + 1 < in.size() ? hex_digit(in[i + 1]) : -1;
    const int lo = i + 2 < in.size() ? hex_digit(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

struct Remembered {
  uint64_t revision = 0;
  bool caught_up = false;
};

// The file's names, or why it is not taken.
std::variant<std::map<std::string, Remembered>, std::string> parse_state(std::string_view text) {
  std::map<std::string, Remembered> out;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return "line " + std::to_string(line_no + 1) + " is cut off";
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    ++line_no;
    if (line_no == 1) {
      if (line != kStateHeader)
        return std::string("no \"") + std::string(kStateHeader) + "\" header";
      continue;
    }
    const std::string where = "line " + std::to_string(line_no);
    const size_t a = line.find(' ');
    const size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
    if (b == std::string_view::npos) return where + ": not <revision> <0|1> <name>";
    const std::string_view rev = line.substr(0, a), caught = line.substr(a + 1, b - a - 1);
    uint64_t revision = 0;
    auto [end, ec] = std::from_chars(rev.data(), rev.data() + rev.size(), revision);
    if (rev.empty() || ec != std::errc() || end != rev.data() + rev.size())
      return where + ": bad revision";
    if (caught != "0" && caught != "1") return where + ": bad caught-up flag";
    auto name = unescape(line.substr(b + 1));
    if (!name || name->empty() || name->size() > kMaxIdentityBytes) return where + ": bad name";
    if (out.size() >= kMaxGhosts && !out.contains(*name))
      return "more than " + std::to_string(kMaxGhosts) + " names";
    auto [it, fresh] = out.try_emplace(std::move(*name), Remembered{revision, caught == "1"});
    if (!fresh) {
      it->second.revision = std::min(it->second.revision, revision);
      it->second.caught_up = it->second.caught_up && caught == "1";
    }
  }
  if (line_no == 0) return "empty";
  return out;
}

}  // namespace

void Hub::load_state() {
  auto fail = [&](Metrics::StateLoad why, const std::string& what) {
    if (metrics_) metrics_->state_load_error(why);
    spdlog::warn("feed: ignoring the subscriber state file {}: {}; no subscriber is remembered",
                 state_file_, what);
  };
  const int fd = ::open(state_file_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      spdlog::info("feed: 0 subscribers remembered from {} (no such file yet)", state_file_);
      return;
    }
    return fail(Metrics::StateLoad::kUnreadable, std::strerror(errno));
  }
  std::string text;
  char buf[65536];
  bool too_large = false, read_error = false;
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      read_error = true;
      err = errno;
      break;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxStateFileBytes) {
      too_large = true;
      break;
    }
  }
  ::close(fd);
  if (read_error) return fail(Metrics::StateLoad::kUnreadable, std::strerror(err));
  if (too_large) {
    return fail(Metrics::StateLoad::kTooLarge,
                "larger than " + std::to_string(kMaxStateFileBytes) + " bytes");
  }
  auto parsed = parse_state(text);
  if (auto* why = std::get_if<std::string>(&parsed))
    return fail(Metrics::StateLoad::kMalformed, *why);
  auto& names = std::get<0>(parsed);

  std::lock_guard acks(acks_mu_);
  const Clock::time_point t = now();
  for (auto& [name, r] : names) {
    // A subscriber caught up then is taken the same as one behind: this process does not have
    // the state it acknowledged either way.
    Ghost g;
    g.revision = r.revision;
    g.waiting_since = t;
    g.gone_at = t;
    g.row.client = name;
    g.row.connected = false;
    g.row.acked_version = 0;
    ghosts_.emplace(name, std::move(g));
    ++nothing_holding_;
    ++ghosts_holding_;
  }
  remembered_ = names.size();
  if (metrics_) {
    metrics_->remembered(names.size());
    metrics_->ghosts_holding(ghosts_holding_);
  }
  spdlog::info(
      "feed: {} subscribers remembered from {}; each holds the feed's applied generation until "
      "it reconnects and acknowledges, for {} ms at most",
      names.size(), state_file_, grace_.count());
}

void Hub::mark_state_dirty() {
  if (state_file_.empty() || state_dirty_.exchange(true)) return;
  { std::lock_guard lock(state_mu_); }  // the writer is waiting or will see the flag
  state_cv_.notify_one();
}

void Hub::run_state_writer() {
  std::unique_lock lock(state_mu_);
  for (;;) {
    state_cv_.wait(lock, [&] { return state_stop_ || state_dirty_.load(); });
    if (state_stop_) return;
    lock.unlock();
    write_state();
    lock.lock();
    // At most every kStateWriteInterval: changes meanwhile are written together.
    state_cv_.wait_for(lock, kStateWriteInterval, [&] { return state_stop_; });
  }
}

bool Hub::write_state() {
  if (state_file_.empty()) return false;
  std::lock_guard order(write_mu_);
  state_dirty_ = false;
  std::map<std::string, Remembered> rows;
  {
    std::lock_guard acks(acks_mu_);
    const uint64_t current = generation(acks_current_);
    auto add = [&](const std::string& name, uint64_t revision, bool caught_up) {
      auto [it, fresh] = rows.try_emplace(name, Remembered{revision, caught_up});
      if (!fresh) {
        it->second.revision = std::min(it->second.revision, revision);
        it->second.caught_up = it->second.caught_up && caught_up;
      }
    };
    // Connected streams first, then ghosts, at most kMaxGhosts names.
    for (const auto& [s, e] : recorded_) {
      if (e.identity.empty() || (!e.recorded && !e.at_nothing)) continue;
      if (rows.size() >= kMaxGhosts && !rows.contains(e.identity)) continue;
      if (e.at_nothing) {
        add(e.identity, e.revision, false);
      } else {
        add(e.identity, e.recorded->slice_revision, !e.lapsed && e.recorded->generation >= current);
      }
    }
    for (const auto& [name, g] : ghosts_) {
      if (rows.size() >= kMaxGhosts && !rows.contains(name)) continue;
      if (g.snapshot) {
        add(name, g.snapshot->slice_revision, g.snapshot->generation >= current);
      } else {
        add(name, g.revision, false);
      }
    }
  }
  std::string text(kStateHeader);
  text += '\n';
  for (const auto& [name, r] : rows) {
    std::string line = std::to_string(r.revision);
    line += r.caught_up ? " 1 " : " 0 ";
    escape_to(line, name);
    line += '\n';
    if (text.size() + line.size() > kMaxStateFileBytes) break;
    text += line;
  }
  if (text == last_written_) return true;  // nothing changed since the last write

  auto fail = [&](Metrics::StateWrite why, const char* what, int err) {
    if (metrics_) metrics_->state_write_error(why);
    if (uint64_t k = ++state_write_failures_; (k & (k - 1)) == 0) {
      spdlog::warn("feed: cannot write the subscriber state file {}: {}: {} ({} failures so far)",
                   state_file_, what, std::strerror(err), k);
    }
    return false;
  };
  const std::string tmp = state_file_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(Metrics::StateWrite::kOpen, "open", errno);
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fail(Metrics::StateWrite::kWrite, "write", err);
    }
    off += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  int err = synced ? 0 : errno;
  if (::close(fd) != 0 && synced) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return fail(Metrics::StateWrite::kWrite, "write", err);
  }
  if (::rename(tmp.c_str(), state_file_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return fail(Metrics::StateWrite::kRename, "rename", err);
  }
  last_written_ = std::move(text);
  return true;
}

}  // namespace endpointd::feed
