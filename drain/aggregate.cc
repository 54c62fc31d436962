#include "drain/aggregate.h"

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <utility>

namespace endpointd::drain {
namespace {

std::vector<std::string> sorted(const std::set<std::string>& s) {
  return {s.begin(), s.end()};
}

// An order on exclusion lists that every agent computes alike (names in order, FNV-1a).
uint64_t list_digest(const std::set<std::string>& names) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& n : names) {
    for (unsigned char c : n) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  }
  return h;
}

bool same(const UpReport& a, const UpReport& b) {
  return a.watermark == b.watermark && a.dns_watermark == b.dns_watermark &&
         a.covered == b.covered && a.silent == b.silent && a.returning == b.returning &&
         a.epoch == b.epoch && a.excluded == b.excluded && a.holdouts == b.holdouts &&
         a.decision == b.decision;
}

}  // namespace

HoldoutList HoldoutList::of(std::vector<Holdout> raw) {
  if (raw.empty()) return {};
  uint64_t more_count = 0;
  uint64_t more_rev = UINT64_MAX;
  std::vector<Holdout> all;
  all.reserve(raw.size());
  for (auto& h : raw) {
    if (h.client.starts_with("+")) {
      // A summary entry: "+N more".
      more_count += std::strtoull(h.client.c_str() + 1, nullptr, 10);
      more_rev = std::min(more_rev, h.revision);
    } else {
      all.push_back(std::move(h));
    }
  }
  // One per (node, client): the lowest revision, the one that holds the most drains.
  std::sort(all.begin(), all.end(), [](const Holdout& a, const Holdout& b) {
    return std::tie(a.node, a.client, a.revision) < std::tie(b.node, b.client, b.revision);
  });
  all.erase(std::unique(all.begin(), all.end(),
                        [](const Holdout& a, const Holdout& b) {
                          return a.node == b.node && a.client == b.client;
                        }),
            all.end());
  std::sort(all.begin(), all.end(), [](const Holdout& a, const Holdout& b) {
    return std::tie(a.revision, a.node, a.client) < std::tie(b.revision, b.node, b.client);
  });
  const size_t keep = kMaxHoldouts - 1;
  if (all.size() > keep + (more_count ? 0 : 1)) {
    for (size_t i = keep; i < all.size(); ++i) {
      ++more_count;
      more_rev = std::min(more_rev, all[i].revision);
    }
    all.resize(keep);
  }
  if (more_count)
    all.push_back(Holdout{"*", "+" + std::to_string(more_count) + " more", more_rev,
                          "holdouts past the report's bound"});
  return HoldoutList(std::make_shared<const std::vector<Holdout>>(std::move(all)));
}

HoldoutList HoldoutList::merge(const std::vector<const HoldoutList*>& lists) {
  const HoldoutList* only = nullptr;
  size_t total = 0;
  for (const auto* l : lists) {
    if (l->empty()) continue;
    if (!only) only = l;
    total += l->size();
  }
  if (!only) return {};
  if (total == only->size()) return *only;
  std::vector<Holdout> all;
  all.reserve(total);
  for (const auto* l : lists) all.insert(all.end(), l->begin(), l->end());
  return of(std::move(all));
}

const std::vector<Holdout>& HoldoutList::items() const {
  static const std::vector<Holdout> kNone;
  return list_ ? *list_ : kNone;
}

Aggregator::Aggregator(std::string self, AggregatorOptions opts)
    : self_(std::move(self)), opts_(opts) {}

void Aggregator::set_members(const std::vector<std::string>& members, TimePoint now) {
  std::set<std::string> m(members.begin(), members.end());
  if (m == *members_) return;
  members_ = std::make_shared<const std::set<std::string>>(std::move(m));
  recount();
  // The exclusion decision is not changed here: only the root changes it, under a new epoch
  // (below, in poll). An agent that dropped a departed node from its list at the same epoch as
  // one that had not seen it leave would disagree with it for good once the node came back.
  std::erase_if(suspects_, [&](const auto& kv) { return !members_->count(kv.first); });
  std::erase_if(asked_, [&](const auto& kv) { return !members_->count(kv.first); });
  std::erase_if(returning_, [&](const std::string& n) { return !members_->count(n); });
  relayout(now);
}

void Aggregator::set_local(uint64_t watermark) {
  set_local(watermark, watermark, {});
}

void Aggregator::set_local(uint64_t watermark, uint64_t dns_watermark, HoldoutList holdouts) {
  local_ = watermark;
  local_dns_ = std::min(watermark, dns_watermark);
  local_holdouts_ = std::move(holdouts);
}

void Aggregator::recount() {
  live_coverage_ = root_want_ = Coverage{};
  for (const auto& m : *members_) {
    bool out = excluded_.count(m) > 0;
    if (!out) live_coverage_.add(m);
    if (m == self_ || !out) root_want_.add(m);
  }
}

bool Aggregator::coverage_current() const {
  return live_coverage_ == cluster_covered_;
}

bool Aggregator::counts(std::string_view node) const {
  auto it = members_->find(std::string(node));
  return it != members_->end() && !excluded_.count(*it) && coverage_current();
}

ClusterFacts Aggregator::facts() const {
  ClusterFacts f;
  f.routing = cluster_;
  f.dns = cluster_dns_;
  f.coverage_current = coverage_current();
  f.members = members_;
  f.excluded = excluded_;
  f.holdouts = cluster_holdouts_;
  return f;
}

std::optional<std::string> ClusterFacts::uncounted(const std::string& node) const {
  if (!members || !members->count(node))
    return "not a member of the cluster watermark (its Node left, or its agent never joined)";
  if (excluded.count(node)) return "its agent is excluded: silent past the liveness deadline";
  if (!coverage_current)
    return "the cluster watermark was made before the last membership change; waiting for one "
           "that counts every member";
  return std::nullopt;
}

void Aggregator::take_cluster(const DownReport& d) {
  cluster_ = bounded_cluster(d.from, d.watermark);
  cluster_dns_ = std::min(cluster_, d.dns_watermark);
  cluster_covered_ = d.covered;
  cluster_holdouts_ = d.holdouts;
}

void Aggregator::relayout(TimePoint now) {
  layout_dirty_ = false;
  ++stats_.relayouts;
  std::vector<std::string> live;
  for (const auto& m : *members_) {
    if (excluded_.count(m) || suspects_.count(m)) continue;
    live.push_back(m);
  }
  tree_ = Tree(std::move(live), opts_.fan_in);
  // An agent the root excluded (it learnt so from a down report, or from a peer that left it)
  // is outside the tree: it reports to the root, which hears from it and takes it back. Were it
  // to lay itself out, a former root would still find itself first and, as a root of one,
  // publish a watermark that covers nobody else.
  std::string parent;
  if (const std::string* p = tree_.parent(self_))
    parent = *p;
  else if (!tree_.contains(self_) && tree_.size() > 0)
    parent = tree_.root();
  if (parent != parent_) {
    if (!parent_.empty()) leave_.insert(parent_);
    parent_ = std::move(parent);
    parent_since_ = now;
    // Asked already, while the one before it was found silent: its deadline runs from then.
    if (auto it = asked_.find(parent_); it != asked_.end())
      parent_since_ = std::min(now, it->second);
    parent_answered_ = false;
    last_up_.reset();  // the new parent has heard nothing yet
  }
  leave_.erase(parent_);  // heard from again and the parent once more: it is not left
  auto children = tree_.children(self_);
  std::map<std::string, TimePoint> since;
  for (const auto& c : children) {
    auto it = child_since_.find(c);
    since[c] = it != child_since_.end() ? it->second : now;
  }
  child_since_ = std::move(since);
  child_cover_.clear();
  for (const auto& c : children) child_cover_.emplace(c, tree_.subtree(c));
  children_ = std::move(children);
  // The watch ring: the next member in the layout's order (wrapping), unless the tree already
  // links the two. Its silence counts from when it became the one watched.
  std::string next;
  const auto& order = tree_.members();
  if (order.size() > 2) {
    auto self = std::find(order.begin(), order.end(), self_);
    if (self != order.end()) {
      ++self;
      next = self == order.end() ? order.front() : *self;
      const std::string* its_parent = tree_.parent(next);
      if (next == parent_ || (its_parent && *its_parent == self_)) next.clear();
    }
  }
  if (next != ring_next_) {
    ring_next_ = std::move(next);
    ring_heard_ = now;
  }
  // Reports of agents that are no longer children stay until they lapse or the agent says it
  // left: while layouts differ, it may still count this one as its parent.
  last_down_.reset();
}

bool Aggregator::adopt(const std::vector<std::string>& excluded, uint64_t epoch,
                       const std::string& from, Source source, TimePoint now) {
  const bool from_parent = source == Source::kParent;
  if (epoch < epoch_) return false;
  // Names this agent does not list (yet) are kept: its member list may be behind the root's.
  std::set<std::string> ex(excluded.begin(), excluded.end());
  if (epoch == epoch_ && ex == excluded_) return false;  // the one it holds: nothing new
  // Decisions are numbered one past the newest seen: a number beyond the cap, or a jump far
  // past this agent's own, is no root's (a forged UINT64_MAX would wrap the root's next
  // number to a small one that every agent ignores from then on). A new process (epoch 0)
  // takes any number under the cap: it cannot tell how long the cluster has been deciding.
  const uint64_t counter = epoch >> 16;
  const uint64_t own = epoch_ >> 16;
  if (counter >= kMaxEpochCounter || (epoch_ != 0 && counter > own + kMaxEpochStep)) {
    ++stats_.refused_epoch;
    note("epoch", from, epoch, epoch_);
    return false;
  }
  if (!from_parent) {
    // A decision that excludes this agent or one of its ancestors is the root's word down the
    // tree, so it is taken from this agent's parent in its layout. From one other member (a
    // child passing it up, an agent it asked, the ring neighbour it watches) it is refused: one
    // member would cut this agent off from its own parent, its coverage no longer current and
    // its drains unconfirmed until a later decision. An agent that really is excluded, or
    // whose parent is, learns it from its parent, or suspects the silent parent itself, which
    // takes that parent out of its line. One case has no parent to learn from: an agent that
    // was stopped while the cluster excluded it and its line believes on resuming that it is
    // the root, or that its parent is the resumed root; its word is then as old as its own,
    // and nobody above it can say otherwise. The same decision from a second member (the
    // answers and reports of the running agents around it, each speaking with its own
    // credentials) is taken: one member alone cannot make it.
    bool names_own_line = ex.count(self_) > 0;
    for (const auto& a : tree_.ancestors(self_)) names_own_line = names_own_line || ex.count(a);
    if (names_own_line) {
      const uint64_t digest = list_digest(ex);
      const bool seconded = line_offer_ && line_offer_->epoch == epoch &&
                            line_offer_->digest == digest && line_offer_->from != from;
      // A new process, whose coverage has never been current, has no confirmations to lose
      // and no word of its own: it takes the newest decision from an agent it asked, as it
      // takes any number, or a member that alone holds the cluster's newest decision (the
      // others restarted) could never pass it on.
      const bool fresh = !ever_current_ && source == Source::kAsked;
      if (!seconded && !fresh) {
        line_offer_ = LineOffer{epoch, digest, from};
        ++stats_.refused_decision;
        note("decision", from, epoch, epoch_);
        return false;
      }
    }
    // Everyone but the parent together moves this agent's number by at most one step per
    // `silence` window: a member that forges decisions (in up reports, which any member may
    // send, or in its answers to this agent's probes) cannot walk the cluster's number to the
    // cap, and relaying through other members gains it nothing here, since the bound is this
    // agent's, not each sender's. `silence` because it is the tree's round: within it a silent
    // agent is reported, excluded and the layouts agree again, each decision one number past
    // the last, so the numbers the cluster really moves by in a window stay far below a step
    // (a restarted root catching up is a new process and takes any). The parent is not bound
    // per window: its word is the root's, already bounded at every hop above, and a window
    // spent by a forgery taken elsewhere must not make this agent refuse the root's next
    // decision (its coverage would stop being current, the harm this guards against).
    if (epoch_ != 0 && counter > own) {
      if (!window_open_ || now - window_start_ >= opts_.silence) {
        window_open_ = true;
        window_start_ = now;
        window_base_ = own;
      }
      if (counter > window_base_ + kMaxEpochStep) {
        ++stats_.refused_epoch;
        ++stats_.refused_epoch_rate;
        note("epoch", from, epoch, window_base_ << 16);
        return false;
      }
    }
  }
  // Two decisions under one number: a root that restarted (its epoch back to 0) and decided
  // again before it heard the number it had given its last decision. Neither is newer by the
  // number, so every agent takes the one whose list digests higher: all agree on one list,
  // and an agent that list excludes wrongly is heard from and taken back under a new number.
  // (An exclusion only makes a node unknown: never a confirmation.)
  if (epoch == epoch_ && list_digest(ex) <= list_digest(excluded_)) return false;
  if (epoch_ == 0 && !from_parent) {
    // A new process's first number: the window starts from it.
    window_open_ = true;
    window_start_ = now;
    window_base_ = counter;
  }
  take_decision(std::move(ex), epoch);
  return true;
}

void Aggregator::take_decision(std::set<std::string> ex, uint64_t epoch) {
  bool readmits = false;
  for (const auto& n : excluded_)
    if (!ex.count(n)) readmits = true;
  epoch_ = epoch;
  std::erase_if(returning_, [&](const std::string& n) { return !ex.count(n); });
  // What the root excluded is its business now: this agent's own evidence is spent.
  std::erase_if(lapsed_, [&](const std::string& n) { return ex.count(n) > 0; });
  std::erase_if(suspects_, [&](const auto& kv) { return ex.count(kv.first) > 0; });
  std::erase_if(asked_, [&](const auto& kv) { return ex.count(kv.first) > 0; });
  if (ex != excluded_) {
    excluded_ = std::move(ex);
    recount();
    layout_dirty_ = true;
  }
  // A decision that took agents back: the watermark held so far did not cover them.
  if (readmits) cluster_ = cluster_dns_ = 0;
}

void Aggregator::receive(const Message& m, TimePoint now) {
  const std::string& from =
      std::visit([](const auto& r) -> const std::string& { return r.from; }, m);
  if (from == self_ || !members_->count(from)) {
    ++stats_.ignored;
    return;
  }
  // An answer to this agent's probe, when it comes from an agent it asked.
  const bool asked = suspects_.count(from) > 0 || asked_.count(from) > 0 || (from == ring_next_);
  if (from == ring_next_) ring_heard_ = now;
  if (suspects_.erase(from)) layout_dirty_ = true;  // heard from: not silent after all
  asked_.erase(from);
  lapsed_.erase(from);
  // Whatever an excluded agent says, it is alive: the root takes it back.
  if (excluded_.count(from)) returning_.insert(from);
  if (const auto* up = std::get_if<UpReport>(&m)) {
    if (up->probe) {
      answer_.insert(from);
      return;
    }
    // A child (or a former one) that holds a newer exclusion decision than this agent passes
    // it up with its list: the newest decision spreads over every link until all agree.
    // (An empty list at a newer epoch is a decision too: a restarted root, at epoch 0, learns
    // it so, or every agent ignores its down reports from then on.)
    if (up->decision || !up->excluded.empty() || up->leaving)
      adopt(up->excluded, up->epoch, from, Source::kBelow, now);
    if (up->leaving) {
      reports_.erase(from);
      if (auto it = child_since_.find(from); it != child_since_.end()) it->second = now;
      return;
    }
    // Watermarks only grow, so a report below the last one over the same agents is a restart
    // or a lie; either way the lower value is the one that cannot release a drain too soon.
    if (auto prev = reports_.find(from); prev != reports_.end() &&
                                         up->watermark < prev->second.report.watermark &&
                                         up->covered == prev->second.report.covered) {
      ++stats_.backwards;
      note("backwards", from, up->watermark, up->watermark);
    }
    if (up->dns_watermark > up->watermark) {
      // No agent's DNS watermark passes its routing one (set_local takes the lower).
      ++stats_.malformed;
      note("malformed", from, up->dns_watermark, up->watermark);
      return;
    }
    // Only a child's report over exactly its subtree in this agent's layout counts in the
    // minimum (aggregate, below): an agent vouches for no one it does not hear from, so a
    // member cannot make another count agents it claims to cover. Kept either way: its silent
    // and returning names travel on, and it is answered.
    if (!excluded_.count(from) && !counts_report(from, up->covered)) {
      ++stats_.refused_coverage;
      note("coverage", from, up->covered.count,
           child_cover_.count(from) ? child_cover_.find(from)->second.count : 0);
    }
    // An excluded agent's report is kept only to answer it (so that it does not find this
    // agent silent); it is not counted until the root takes it back.
    reports_[from] = ChildReport{*up, now};
    return;
  }
  const auto& down = std::get<DownReport>(m);
  if (from != parent_) {
    // Only this agent's parent in its layout speaks for the cluster to it: another member's
    // watermark, coverage and holdouts are never taken, so one member cannot make it believe
    // a watermark. A newer decision counts (bounded, in adopt) only in an answer to this
    // agent's own probe (a suspect, a next parent asked ahead, the ring): the way it learns
    // the newest one across layouts that differ; never one that excludes this agent or its
    // ancestors, which only its parent's word changes. Anything else — a former parent, one by
    // another layout — is told that this agent is not its child, and a report it could not
    // have been asked for that claims more than this agent holds is counted.
    if (sample_ && from == sample_->node) {
      take_sample(down);
      adopt(down.excluded, down.epoch, from, Source::kAsked, now);
      return;
    }
    if (asked) {
      adopt(down.excluded, down.epoch, from, Source::kAsked, now);
      return;
    }
    leave_.insert(from);
    if (down.watermark > cluster_ || down.epoch > epoch_) {
      ++stats_.not_parent;
      note("not-parent", from, down.watermark, cluster_);
    }
    return;
  }
  parent_since_ = now;
  parent_answered_ = true;
  parent_epoch_ = down.epoch;
  parent_excluded_ = std::set<std::string>(down.excluded.begin(), down.excluded.end());
  adopt(down.excluded, down.epoch, from, Source::kParent, now);
  if (down.epoch == epoch_ && parent_excluded_ == excluded_) {
    parent_behind_since_.reset();
  } else if (!parent_behind_since_ || parent_behind_from_ != from) {
    parent_behind_since_ = now;
    parent_behind_from_ = from;
  } else if (now - *parent_behind_since_ > opts_.silence) {
    // The parent has spoken under another decision for a whole `silence` window, so it does
    // not take the one this agent holds (passed up with every report): that one cuts the
    // parent's own line and no second member offers it, or the parent's numbers are bounded
    // for the window. The tree's word is the parent's: this agent takes its decision, older or
    // not, instead of holding one that nobody above it takes (its coverage never current
    // again, its drains never confirmed). The newest decision still spreads through the
    // agents whose line it does not cut, and comes down from the parent once it takes it.
    ++stats_.yielded;
    take_decision(std::set<std::string>(parent_excluded_), down.epoch);
    line_offer_.reset();
    parent_behind_since_.reset();
  }
  // The parent's watermark holds under the decision it was made with; one made under an older
  // decision than this agent's (the parent has not heard of the newer one yet) waits.
  if (down.epoch == epoch_ && parent_excluded_ == excluded_) take_cluster(down);
  ever_current_ = ever_current_ || coverage_current();
}

void Aggregator::ask(const std::string& to, std::vector<Send>& out) {
  UpReport probe;
  probe.from = self_;
  probe.probe = true;
  out.push_back({to, std::move(probe)});
  ++stats_.up_sent;
}

void Aggregator::ask_ahead(TimePoint now, std::vector<Send>& out) {
  // The parents this agent would try after the new one, should it be silent too, asked now: a
  // run of stopped agents ahead of this one in the layout (a stopped root and its stopped
  // children) then costs one probe deadline, not one each.
  std::vector<std::string> live;
  for (const auto& m : *members_)
    if (!excluded_.count(m) && !suspects_.count(m)) live.push_back(m);
  std::vector<std::string> order = Tree(std::move(live), opts_.fan_in).members();
  std::string p = parent_;
  for (size_t i = 0; i < opts_.fan_in && !p.empty(); ++i) {
    std::erase(order, p);
    auto self = std::find(order.begin(), order.end(), self_);
    std::string next;
    if (self == order.end()) {
      if (!order.empty()) next = order.front();
    } else if (self != order.begin()) {
      next = order[(static_cast<size_t>(self - order.begin()) - 1) / opts_.fan_in];
    }
    if (next.empty()) break;
    if (asked_.emplace(next, now).second) ask(next, out);
    p = std::move(next);
  }
}

uint64_t Aggregator::bounded_cluster(const std::string& from, uint64_t watermark) {
  // The root's minimum counts this agent unless it is excluded, and this agent's own watermark
  // only grows: a cluster watermark above it is false, whoever sent it.
  if (excluded_.count(self_) || watermark <= local_) return watermark;
  ++stats_.clamped_ahead;
  note("ahead", from, watermark, local_);
  return local_;
}

bool Aggregator::counts_report(const std::string& from, const Coverage& covered) const {
  auto it = child_cover_.find(from);
  return it != child_cover_.end() && it->second == covered;
}

void Aggregator::sample(TimePoint now, std::vector<Send>& out) {
  if (tree_.size() < 2 || now - last_sample_at_ < opts_.heartbeat) return;
  last_sample_at_ = now;
  // The one asked last has its `silence` to answer (an answer after that is any unasked down
  // report); one unanswered sample is no evidence of anything.
  if (sample_ && now - sample_->at <= opts_.silence) return;
  // One agent a heartbeat, in an order no agent can foresee from the layout alone (the root's
  // hash and a turn count), the one under a ceiling every time until it is lifted.
  std::string node;
  if (ceiling_ && tree_.contains(ceiling_->node)) {
    node = ceiling_->node;
  } else {
    ceiling_.reset();
    const auto& order = tree_.members();
    size_t i = static_cast<size_t>(member_hash(self_ + "/" + std::to_string(sample_turn_++)) %
                                   (order.size() - 1));
    node = order[i + 1];  // order[0] is this agent, the root
  }
  Sample s;
  s.node = node;
  s.at = now;
  // What the tree claimed for it: the minimum as aggregated (before any ceiling), when the
  // published coverage counts it.
  if (counts(node)) {
    s.published = agg_watermark_;
    s.published_dns = agg_dns_;
  }
  sample_ = std::move(s);
  ++stats_.samples;
  ask(node, out);
}

void Aggregator::take_sample(const DownReport& d) {
  const Sample s = *sample_;
  sample_.reset();
  // An agent's own watermarks only grow, so every minimum made before it answered counted it
  // at or below what it says now. Anything higher was not its: an agent on the way up raised
  // it (or this one restarted and starts again from 0). Either way the published minimum may
  // claim no more than it.
  if (d.own < s.published || d.own_dns < s.published_dns) {
    ++stats_.sample_below;
    note("sample-below", s.node, s.published, d.own);
    ceiling_ = Ceiling{s.node, d.own, std::min(d.own, d.own_dns)};
    cluster_ = std::min(cluster_, ceiling_->watermark);
    cluster_dns_ = std::min(cluster_dns_, ceiling_->dns);
  } else if (ceiling_ && ceiling_->node == s.node) {
    ceiling_.reset();
  }
}

DownReport Aggregator::down_report() const {
  DownReport d;
  d.from = self_;
  d.watermark = cluster_;
  d.excluded = sorted(excluded_);
  d.epoch = epoch_;
  d.covered = cluster_covered_;
  d.dns_watermark = cluster_dns_;
  d.holdouts = cluster_holdouts_;
  d.own = local_;
  d.own_dns = local_dns_;
  return d;
}

void Aggregator::note(const char* kind, const std::string& from, uint64_t reported, uint64_t kept) {
  if (anomalies_.size() < kMaxAnomalies) anomalies_.push_back({kind, from, reported, kept});
}

UpReport Aggregator::aggregate(TimePoint now) {
  UpReport up;
  up.from = self_;
  up.watermark = local_;
  up.dns_watermark = local_dns_;
  std::vector<const HoldoutList*> holdouts{&local_holdouts_};
  up.covered.add(self_);
  std::set<std::string> silent;
  for (const auto& [p, since] : suspects_)
    if (now - since > opts_.silence) silent.insert(p);
  std::set<std::string> returning = returning_;
  auto include = [&](const std::string& name, const UpReport& r) {
    // Silences, returns and holdouts travel from every report (they can only keep a drain
    // unconfirmed); the minimum and its coverage only from a child over its own subtree.
    holdouts.push_back(&r.holdouts);
    silent.insert(r.silent.begin(), r.silent.end());
    returning.insert(r.returning.begin(), r.returning.end());
    if (!counts_report(name, r.covered)) return;
    up.watermark = std::min(up.watermark, r.watermark);
    up.dns_watermark = std::min(up.dns_watermark, r.dns_watermark);
    up.covered.add(r.covered);
  };
  for (auto it = reports_.begin(); it != reports_.end();) {
    if (now - it->second.at > opts_.silence) {
      lapsed_.insert(it->first);
      it = reports_.erase(it);
      continue;
    }
    if (!excluded_.count(it->first)) include(it->first, it->second.report);
    ++it;
  }
  if (holdouts.size() != merged_from_.size() ||
      !std::equal(holdouts.begin(), holdouts.end(), merged_from_.begin(),
                  [](const HoldoutList* a, const HoldoutList& b) { return a->is(b); })) {
    merged_ = HoldoutList::merge(holdouts);
    merged_from_.clear();
    for (const auto* l : holdouts) merged_from_.push_back(*l);
  }
  up.holdouts = merged_;
  silent.insert(lapsed_.begin(), lapsed_.end());
  if (!ring_next_.empty() && now - ring_heard_ > opts_.silence) silent.insert(ring_next_);
  for (const auto& c : children_)
    if (!reports_.count(c) && now - child_since_[c] > opts_.silence) silent.insert(c);
  up.silent = sorted(silent);
  up.returning = sorted(returning);
  up.epoch = epoch_;
  if (epoch_ > parent_epoch_ || (epoch_ == parent_epoch_ && excluded_ != parent_excluded_)) {
    up.excluded = sorted(excluded_);
    up.decision = true;
  }
  return up;
}

std::vector<Aggregator::Send> Aggregator::poll(TimePoint now) {
  std::vector<Send> out;
  if (!members_->count(self_)) return out;
  if (last_poll_ && now - *last_poll_ > opts_.silence) {
    // This agent was the one not running (stopped, starved): nobody else's silence is
    // evidence now. Every deadline starts again.
    parent_since_ = now;
    for (auto& [c, since] : child_since_) since = now;
    for (auto& [n, r] : reports_) r.at = now;
    for (auto& [p, since] : suspects_) since = now;
    for (auto& [n, since] : asked_) since = now;
    ring_heard_ = now;
  }
  last_poll_ = now;
  std::erase_if(asked_, [&](const auto& kv) { return now - kv.second > 2 * opts_.silence; });
  if (layout_dirty_) relayout(now);
  // A parent silent past the deadline is suspected at once; the next one in the layout is
  // tried, with a deadline from when it was first asked. The parents ahead are asked when one
  // that had answered fell silent (it died, and others around it may have too); not when a new
  // parent never answered (a DaemonSet still rolling out: those ahead are not up either).
  bool fell_silent = false;
  while (!parent_.empty() &&
         now - parent_since_ > (parent_answered_ ? opts_.silence : opts_.probe)) {
    fell_silent = fell_silent || parent_answered_;
    suspects_.emplace(parent_, parent_since_);
    relayout(now);
  }
  if (fell_silent) ask_ahead(now, out);

  for (const auto& to : leave_) {
    UpReport bye;
    bye.from = self_;
    bye.leaving = true;
    bye.excluded = sorted(excluded_);
    bye.epoch = epoch_;
    bye.decision = true;
    out.push_back({to, std::move(bye)});
  }
  leave_.clear();
  for (const auto& to : answer_) {
    out.push_back({to, down_report()});
    ++stats_.down_sent;
  }
  answer_.clear();
  if (!suspects_.empty() && now - last_suspect_probe_at_ >= opts_.heartbeat) {
    last_suspect_probe_at_ = now;
    for (const auto& [p, since] : suspects_) {
      // Reported silent already: the root's decision settles it (an agent that runs after all
      // is heard from and taken back), no more asking.
      if (now - since <= opts_.silence) ask(p, out);
    }
  }
  // The ring's next member is asked every heartbeat: it answers, or its silence is seen here
  // whatever the tree around it (its parent may be stopped too).
  if (!ring_next_.empty() && now - last_ring_probe_at_ >= opts_.heartbeat) {
    last_ring_probe_at_ = now;
    ask(ring_next_, out);
  }
  UpReport agg = aggregate(now);
  if (parent_.empty()) {
    // The root: what is reported silent (by others or, for its own former parents, by itself)
    // becomes its decision.
    std::set<std::string> ex = excluded_;
    ex.erase(self_);
    // A node that left the members leaves the decision too, under a new epoch.
    std::erase_if(ex, [&](const std::string& n) { return !members_->count(n); });
    for (const auto& n : agg.silent)
      if (members_->count(n) && n != self_) ex.insert(n);
    bool readmitted = false;
    for (const auto& n : agg.returning) readmitted = ex.erase(n) > 0 || readmitted;
    // A readmitted agent applied nothing while it was out: the watermark published without it
    // no longer holds, and the next one must cover it (a lower watermark only delays).
    if (readmitted) cluster_ = cluster_dns_ = 0;
    if (ex != excluded_) {
      excluded_ = std::move(ex);
      recount();
      // A new decision: numbered past every one this agent has seen, ties broken by the
      // deciding agent's hash, so that every agent can tell the newest of two.
      epoch_ = (((epoch_ >> 16) + 1) << 16) | (member_hash(self_) >> 48);
      std::erase_if(suspects_, [&](const auto& kv) { return excluded_.count(kv.first) > 0; });
      std::erase_if(returning_, [&](const std::string& n) { return !excluded_.count(n); });
      std::erase_if(lapsed_, [&](const std::string& n) { return excluded_.count(n) > 0; });
      relayout(now);
      agg = aggregate(now);
    }
    // Every member not excluded must be covered, suspects too: a parent that did not answer a
    // probe may only be slow.
    const Coverage& want = root_want_;
    if (agg.covered == want) {
      agg_watermark_ = agg.watermark;
      agg_dns_ = std::min(agg.watermark, agg.dns_watermark);
      cluster_ = agg_watermark_;
      cluster_dns_ = agg_dns_;
      if (ceiling_) {
        cluster_ = std::min(cluster_, ceiling_->watermark);
        cluster_dns_ = std::min(cluster_dns_, ceiling_->dns);
      }
      cluster_covered_ = want;
      cluster_holdouts_ = agg.holdouts;
      ever_current_ = ever_current_ || coverage_current();
    } else {
      // The old minimum stays published with the coverage it was made with: an agent whose
      // members differ from it counts it for nobody.
      ++stats_.coverage_mismatches;
    }
    sample(now, out);
    // Probe the excluded, a few each heartbeat: one that answers (it leaves this agent, whose
    // down report it did not expect) is alive and comes back.
    if (!excluded_.empty() && now - last_probe_at_ >= opts_.heartbeat) {
      last_probe_at_ = now;
      std::vector<std::string> ex(excluded_.begin(), excluded_.end());
      for (size_t i = 0; i < std::min<size_t>(kProbesPerHeartbeat, ex.size()); ++i) {
        out.push_back({ex[probe_next_++ % ex.size()], down_report()});
        ++stats_.down_sent;
      }
    }
  } else if (!last_up_ || !same(*last_up_, agg) || now - last_up_at_ >= opts_.heartbeat) {
    out.push_back({parent_, agg});
    last_up_ = std::move(agg);
    last_up_at_ = now;
    ++stats_.up_sent;
  }

  DownReport down = down_report();
  bool changed = !last_down_ || last_down_->watermark != down.watermark ||
                 last_down_->excluded != down.excluded || last_down_->epoch != down.epoch ||
                 last_down_->dns_watermark != down.dns_watermark ||
                 !(last_down_->covered == down.covered) || last_down_->holdouts != down.holdouts;
  // Children, and adopted agents that still count this one as their parent; one that has not
  // had a down report yet gets one now (it is probing this agent).
  std::set<std::string> to(children_.begin(), children_.end());
  for (const auto& [n, r] : reports_) to.insert(n);
  bool all = changed || now - last_down_at_ >= opts_.heartbeat;
  for (const auto& n : to) {
    if (!all && down_sent_to_.count(n)) continue;
    out.push_back({n, down});
    ++stats_.down_sent;
  }
  if (all) {
    last_down_ = std::move(down);
    last_down_at_ = now;
  }
  down_sent_to_ = std::move(to);
  return out;
}

Aggregator::TimePoint Aggregator::next_deadline() const {
  if (layout_dirty_ || !leave_.empty() || !answer_.empty()) return TimePoint::min();
  // Deadlines the last poll already saw pass were acted on then (a silent child stays reported
  // until the root's word comes back): only those still ahead wake the agent.
  const TimePoint after = last_poll_ ? *last_poll_ : TimePoint::min();
  TimePoint t = TimePoint::max();
  auto consider = [&](TimePoint d) {
    if (d > after) t = std::min(t, d);
  };
  if (!parent_.empty()) {
    consider(last_up_at_ + opts_.heartbeat);
    consider(parent_since_ + (parent_answered_ ? opts_.silence : opts_.probe));
  }
  for (const auto& [p, since] : suspects_) consider(since + opts_.silence);
  if (!suspects_.empty()) consider(last_suspect_probe_at_ + opts_.heartbeat);
  if (!ring_next_.empty()) {
    consider(last_ring_probe_at_ + opts_.heartbeat);
    consider(ring_heard_ + opts_.silence);
  }
  for (const auto& [c, since] : child_since_)
    if (!reports_.count(c)) consider(since + opts_.silence);
  consider(last_down_at_ + opts_.heartbeat);
  if (!excluded_.empty() && parent_.empty()) consider(last_probe_at_ + opts_.heartbeat);
  if (parent_.empty() && tree_.size() > 1) consider(last_sample_at_ + opts_.heartbeat);
  for (const auto& [n, r] : reports_) consider(r.at + opts_.silence);
  return t;
}

}  // namespace endpointd::drain
