// The feed hub: subscriber registry, ack arithmetic and the feed's applied(g).
#include "feed/hub.h"

#include <algorithm>

namespace endpointd::feed {

void AckTracker::sent(model::SnapshotPtr snap) {
  const uint64_t v = snap->generation;
  in_flight_.push_back({v, std::move(snap)});
  if (in_flight_.size() > kMaxInFlight) in_flight_.pop_front();
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
    for (auto& [s, recorded] : recorded_) refresh_locked(s, recorded);
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
      if (rec->second) {
        auto at = acked_.find(rec->second->generation);
        if (at != acked_.end() && --at->second.count == 0) acked_.erase(at);
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
      moved = recompute_locked();
    }
  }
  report(moved);
}

void Hub::refresh_locked(Subscriber* s, model::SnapshotPtr& recorded) {
  model::SnapshotPtr now = s->acked();
  if (now == recorded) return;
  if (now && recorded && now->generation == recorded->generation) return;
  if (recorded) {
    auto at = acked_.find(recorded->generation);
    if (at != acked_.end() && --at->second.count == 0) acked_.erase(at);
  }
  if (now) {
    AckedAt& at = acked_[now->generation];
    if (at.count++ == 0) at.snap = now;
  }
  recorded = std::move(now);
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
  std::lock_guard lock(mu_);
  std::vector<SubscriberInfo> out;
  for (Subscriber* s : subscribers_) out.push_back(s->info());
  return out;
}

model::SnapshotPtr Hub::applied() const {
  std::lock_guard lock(acks_mu_);
  return applied_;
}

}  // namespace endpointd::feed
