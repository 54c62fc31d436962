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
  {
    std::lock_guard lock(mu_);
    current_ = snap;
    for (Subscriber* s : subscribers_) s->notify(snap);
  }
  recompute();
}

model::SnapshotPtr Hub::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

bool Hub::add(Subscriber* s) {
  std::lock_guard lock(mu_);
  if (subscribers_.size() >= max_subscribers_) return false;
  subscribers_.push_back(s);
  return true;
}

void Hub::remove(Subscriber* s) {
  {
    std::lock_guard lock(mu_);
    std::erase(subscribers_, s);
  }
  recompute();  // a subscriber that went away stops holding back applied(g)
}

void Hub::acks_changed() {
  recompute();
}

void Hub::recompute() {
  model::SnapshotPtr report;
  {
    std::lock_guard lock(mu_);
    if (!current_) return;
    model::SnapshotPtr low = current_;
    for (Subscriber* s : subscribers_) {
      model::SnapshotPtr a = s->acked();
      if (a && a->generation < low->generation) low = std::move(a);
    }
    // Generations only grow: a subscriber that joins starts at the current snapshot, so the
    // minimum never moves back; guard anyway.
    if (!applied_ || low->generation > applied_->generation) {
      applied_ = low;
      report = low;
    }
  }
  if (report && applied_fn_) applied_fn_(report);
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
  std::lock_guard lock(mu_);
  return applied_;
}

}  // namespace endpointd::feed
