// The feed hub: subscriber registry, ack arithmetic and the feed's applied(g).
#include "feed/hub.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <unordered_set>

#include "feed/metrics.h"

namespace endpointd::feed {

void AckTracker::sent(model::SnapshotPtr snap, Clock::time_point now) {
  const uint64_t v = snap->generation;
  in_flight_.push_back({v, std::move(snap), now});
  if (in_flight_.size() > kMaxInFlight) {
    // Forgotten, not acknowledged: the client has been waited on since then.
    const Clock::time_point oldest = in_flight_.front().sent_at;
    in_flight_.pop_front();
    in_flight_.front().sent_at = oldest;
  }
}

void AckTracker::unchanged(const model::SnapshotPtr& snap) {
  if (in_flight_.empty()) {
    // Everything sent was acknowledged, and this snapshot changes none of it.
    if (!acked_ || snap->generation > acked_->generation) acked_ = snap;
  } else if (snap->generation > in_flight_.back().equivalent->generation) {
    in_flight_.back().equivalent = snap;
  }
}

bool AckTracker::ack(uint64_t version) {
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(),
                         [&](const InFlight& f) { return f.version == version; });
  if (it == in_flight_.end()) return version <= acked_version_ && version != 0;
  if (!acked_ || it->equivalent->generation > acked_->generation) acked_ = it->equivalent;
  acked_version_ = std::max(acked_version_, version);
  in_flight_.erase(in_flight_.begin(), it + 1);
  return true;
}

Hub::Hub(HubOptions opts, AppliedFn applied)
    : max_subscribers_(opts.max_subscribers),
      applied_fn_(std::move(applied)),
      stale_after_(opts.stale_after),
      clock_(std::move(opts.clock)),
      metrics_(opts.metrics),
      fanout_(opts.fanout_threads) {}

void Hub::publish(model::SnapshotPtr snap) {
  if (!snap->synced) return;  // subscribers see nothing until the first full sync
  model::SnapshotPtr moved;
  {
    std::lock_guard lock(mu_);
    if (current_ && snap->generation <= current_->generation) return;  // never backwards
    current_ = snap;
    fanout_.run(subscribers_.size(), [&](size_t i) { subscribers_[i]->notify(snap); });
    std::lock_guard acks(acks_mu_);
    acks_current_ = snap;
    // A change a subscriber does not see moved its ack at once.
    for (auto& [s, e] : recorded_) refresh_locked(s, e);
    moved = recompute_locked();
  }
  report(moved);
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
  model::SnapshotPtr moved;
  {
    std::lock_guard lock(mu_);
    auto it = std::find(subscribers_.begin(), subscribers_.end(), s);
    if (it == subscribers_.end()) return;
    *it = subscribers_.back();  // order does not matter
    subscribers_.pop_back();
    std::lock_guard acks(acks_mu_);
    auto rec = recorded_.find(s);
    if (rec != recorded_.end()) {
      if (rec->second.stale) {
        --stale_count_;
        if (metrics_) metrics_->stale_left();
      } else {
        count_locked(rec->second.recorded, -1);
      }
      recorded_.erase(rec);
    }
    moved = recompute_locked();  // a subscriber that went away stops holding back applied(g)
  }
  report(moved);
}

void Hub::acks_changed(Subscriber* s) {
  model::SnapshotPtr moved;
  {
    std::lock_guard acks(acks_mu_);
    auto it = recorded_.find(s);
    if (it != recorded_.end()) {
      refresh_locked(s, it->second);
      // An ack may be the one that brings a stale subscriber back.
      if (it->second.stale && stale_after_.count() > 0) update_stale_locked(s, it->second, now());
      moved = recompute_locked();
    }
  }
  report(moved);
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

void Hub::refresh_locked(Subscriber* s, Entry& e) {
  model::SnapshotPtr now = s->acked();
  if (now == e.recorded) return;
  if (now && e.recorded && now->generation == e.recorded->generation) return;
  if (!e.stale) {
    count_locked(e.recorded, -1);
    count_locked(now, +1);
  }
  e.recorded = std::move(now);
}

std::optional<Clock::time_point> Hub::update_stale_locked(Subscriber* s, Entry& e,
                                                          Clock::time_point now) {
  const auto since = s->outstanding_since();
  const bool overdue = since && now - *since >= stale_after_;
  if (overdue == e.stale) {
    if (!e.stale && since) return *since + stale_after_;
    return std::nullopt;
  }
  // Identity for the log line; under acks_mu_, as the subscriber may go away once it is left.
  const SubscriberInfo i = s->info();
  if (overdue) {
    count_locked(e.recorded, -1);
    e.stale = true;
    ++stale_count_;
    if (metrics_) metrics_->stale_entered();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - *since);
    spdlog::warn(
        "feed: subscriber {} ({} stream, client '{}', peer {}) has left a response "
        "unacknowledged for {} ms (sent version {}, acknowledged {}); stale: the feed's applied "
        "generation no longer waits for it, so drains proceed while it may still route to "
        "removed endpoints",
        i.id, i.api, i.client, i.peer, waited.count(), i.sent_version, i.acked_version);
  } else {
    e.stale = false;
    count_locked(e.recorded, +1);
    --stale_count_;
    if (metrics_) metrics_->stale_left();
    spdlog::info(
        "feed: subscriber {} ({} stream, client '{}', peer {}) acknowledged version {}; no "
        "longer stale, it counts toward the feed's applied generation again",
        i.id, i.api, i.client, i.peer, i.acked_version);
  }
  return std::nullopt;
}

std::optional<Clock::time_point> Hub::check_stale() {
  if (stale_after_.count() <= 0) return std::nullopt;
  model::SnapshotPtr moved;
  std::optional<Clock::time_point> next;
  {
    std::lock_guard acks(acks_mu_);
    const Clock::time_point t = now();
    for (auto& [s, e] : recorded_) {
      // A stale subscriber's ack may have moved without acks_changed (a snapshot it does
      // not see); keep what it reports current before it counts again.
      refresh_locked(s, e);
      auto due = update_stale_locked(s, e, t);
      if (due && (!next || *due < *next)) next = due;
    }
    moved = recompute_locked();
  }
  report(moved);
  return next;
}

size_t Hub::stale_subscribers() const {
  std::lock_guard lock(acks_mu_);
  return stale_count_;
}

model::SnapshotPtr Hub::recompute_locked() {
  if (!acks_current_) return nullptr;
  model::SnapshotPtr low = acks_current_;
  if (!acked_.empty() && acked_.begin()->first < low->generation) low = acked_.begin()->second.snap;
  // Generations only grow: a subscriber that joins starts at the current snapshot, so the
  // minimum never moves back; guard anyway.
  if (applied_ && low->generation <= applied_->generation) return nullptr;
  applied_ = low;
  return low;
}

void Hub::report(const model::SnapshotPtr& snap) {
  if (snap && applied_fn_) applied_fn_(snap);
}

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
  std::unordered_set<const Subscriber*> stale;
  {
    // Only the flags under acks_mu_: acks do not wait while every row is built.
    std::lock_guard acks(acks_mu_);
    for (const auto& [s, e] : recorded_)
      if (e.stale) stale.insert(s);
  }
  std::vector<SubscriberInfo> out;
  for (Subscriber* s : subscribers_) {
    out.push_back(s->info());
    out.back().stale = stale.count(s) > 0;
  }
  return out;
}

model::SnapshotPtr Hub::applied() const {
  std::lock_guard lock(acks_mu_);
  return applied_;
}

}  // namespace endpointd::feed
