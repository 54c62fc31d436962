// The drain state machine. Every step forward is taken in evaluate() or on_snapshot(); a step
// forced by a deadline or a degraded input leaves a note and a counter behind.
#include "drain/machine.h"
#include "drain/machine_internal.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string_view>

#include "drain/action.h"
#include "drain/local_marks.h"
#include "drain/members.h"
#include "model/routing.h"
#include "model/time.h"

namespace endpointd::drain {

using internal::in_any_service;
using internal::ms_since;

std::string_view to_string(Stage s) {
  switch (s) {
    case Stage::kWaitingTerminating:
      return "waiting-terminating";
    case Stage::kStopAccepting:
      return "stop-accepting";
    case Stage::kRemoved:
      return "removed";
    case Stage::kDrained:
      return "drained";
    case Stage::kReleased:
      return "released";
  }
  return "?";
}

ReleaseAfter release_after_of(const model::Pod& pod, ReleaseAfter fallback) {
  auto it = pod.annotations.find(kReleaseAfterAnnotation);
  if (it == pod.annotations.end()) return fallback;
  if (it->second == "removed") return ReleaseAfter::kRemoved;
  if (it->second == "drained") return ReleaseAfter::kDrained;
  if (it->second == "silent") return ReleaseAfter::kSilent;
  return fallback;
}

namespace {

bool is_fallback(const Holdout& h) {
  return h.client.starts_with("fallback/");
}

const std::string& fallback_client(Drain& d) {
  if (d.fallback_client.empty()) d.fallback_client = LocalMarks::fallback_client(d.ip);
  return d.fallback_client;
}

// Whether a DNS answer could have carried `ip`: it is an endpoint of a headless service.
bool dns_could_answer(const model::Snapshot& s, const model::IpAddr& ip) {
  for (const auto& st : s.services)
    if (st->service.headless && st->service.type != model::ServiceType::kExternalName &&
        st->find(ip))
      return true;
  return false;
}

}  // namespace

Machine::Machine(Options opts) : opts_(std::move(opts)) {}

const model::Pod* Machine::pod_for(const model::IpAddr& ip) const {
  return snap_ ? snap_->find_node_pod(opts_.node_name, ip) : nullptr;
}

const model::Pod* Machine::pod_of(const DrainKey& k) const {
  if (!snap_) return nullptr;
  if (k.uid.empty()) return pod_for(k.ip);
  // The endpoints' targetRef names the pod; without a name to look it up by, this node's pods.
  for (const auto& st : snap_->services) {
    const model::MergedEndpoint* e = st->find(k.ip);
    if (!e || !e->target_ref || e->target_ref->uid != k.uid) continue;
    const model::Pod* p = snap_->find_pod({e->target_ref->ns, e->target_ref->name});
    if (p && p->uid == k.uid) return p;
    break;
  }
  for (const auto& p : snap_->pods)
    if (p->uid == k.uid && p->node_name == opts_.node_name) return p.get();
  return nullptr;
}

std::string Machine::uid_of(const model::MergedEndpoint& e) const {
  if (e.target_ref && !e.target_ref->uid.empty()) return e.target_ref->uid;
  const model::Pod* p = pod_for(e.address);
  return p ? p->uid : std::string();
}

bool Machine::present(const Drain& d) const {
  for (const auto& st : snap_->services) {
    const model::MergedEndpoint* e = st->find(d.ip);
    if (e && names_pod(*e, d.pod_uid)) return true;
  }
  return false;
}

const Drain& Machine::drain(const model::IpAddr& ip) const {
  // The drain of the pod the address belongs to now: the one whose pod the snapshot still
  // lists, else the newest started.
  const Drain* best = nullptr;
  for (auto it = drains_.lower_bound(DrainKey{ip, {}}); it != drains_.end() && it->first.ip == ip;
       ++it) {
    const Drain& d = it->second;
    bool listed = snap_ && !d.pod.name.empty() && snap_->find_pod(d.pod);
    bool best_listed = best && snap_ && !best->pod.name.empty() && snap_->find_pod(best->pod);
    if (!best || (listed && !best_listed) || (listed == best_listed && d.start > best->start))
      best = &d;
  }
  if (!best) throw std::out_of_range("no drain at " + ip.str());
  return *best;
}

void Machine::set_budget(Drain& d, TimePoint now) {
  int64_t grace_s = 30;
  const model::Pod* p = pod_of(d.key());
  if (p) grace_s = std::max<int64_t>(0, p->termination_grace_period_seconds);
  milliseconds grace{grace_s * 1000};
  auto margin =
      std::max(opts_.min_margin, milliseconds(static_cast<int64_t>(
                                     static_cast<double>(grace.count()) * opts_.margin_fraction)));
  auto budget = std::max(milliseconds(0), grace - margin);
  d.start = now;
  d.budget_end = now + budget;
  if (p && !p->deletion_timestamp.empty()) {
    if (auto at = model::parse_rfc3339(p->deletion_timestamp)) {
      auto left = std::chrono::duration_cast<milliseconds>(*at - opts_.wall_clock()) - margin;
      if (left > budget) {
        // Further ahead than the grace period: the API's clock and this node's disagree.
        ++counters_.deletion_clamped;
        d.notes.push_back("deletionTimestamp " + p->deletion_timestamp + " is " +
                          std::to_string((left - budget).count()) +
                          " ms past the grace period from now (clock skew): budget clamped to "
                          "the grace period");
      } else if (left < std::min(budget, opts_.api_floor)) {
        // Already (nearly) past: an agent that restarted late, or a clock ahead of the API's.
        ++counters_.deletion_clamped;
        left = std::min(budget, opts_.api_floor);
        d.notes.push_back("deletionTimestamp " + p->deletion_timestamp +
                          " leaves no budget: " + std::to_string(left.count()) + " ms kept");
        d.budget_end = now + left;
        d.budget_from_api = true;
      } else {
        d.budget_end = now + left;
        d.budget_from_api = true;
      }
    }
  }
  d.removal_deadline = d.budget_end;
  if (opts_.removal_timeout.count() > 0)
    d.removal_deadline = std::min(d.budget_end, now + opts_.removal_timeout);
}

Drain& Machine::ensure(const DrainKey& k, TimePoint now, bool* created) {
  auto it = drains_.find(k);
  *created = it == drains_.end();
  if (!*created) return it->second;
  Drain& d = drains_[k];
  d.ip = k.ip;
  d.pod_uid = k.uid;
  const model::Pod* p = pod_of(k);
  if (p) {
    d.pod = p->key;
    d.shared_address = p->host_network;
    d.release_after = release_after_of(*p, opts_.default_release_after);
  } else {
    d.release_after = opts_.default_release_after;
  }
  // Other drains at the address: a released pod's whose address a new pod was given (reuse:
  // each pod has its own drain), or a pod that still holds it. Two pods that both still claim
  // one address, neither on the node's network, are bad input: neither drain can know whose
  // traffic a consumer's rule means, so both are released unconfirmed, naming the other.
  for (auto o = drains_.lower_bound(DrainKey{k.ip, {}}); o != drains_.end() && o->first.ip == k.ip;
       ++o) {
    Drain& other = o->second;
    if (&other == &d) continue;
    const model::Pod* op = other.pod.name.empty() || !snap_ ? nullptr : snap_->find_pod(other.pod);
    bool other_alive = op && op->uid == other.pod_uid && other.stage != Stage::kReleased;
    if (!other_alive) {
      ++counters_.address_reused;
      d.notes.push_back("address " + k.ip.str() + " was pod " +
                        (other.pod.name.empty() ? other.pod_uid : other.pod.str()) + "'s (drain " +
                        std::string(to_string(other.stage)) + "): a drain of its own");
      continue;
    }
    if (d.shared_address && other.shared_address) continue;  // hostNetwork pods beside each other
    ++counters_.address_conflicts;
    std::string me = p ? p->key.str() : k.uid;
    unconfirm(d, {opts_.node_name, "address",
                  "pod " + other.pod.str() + " claims " + k.ip.str() + " at the same time"});
    unconfirm(other, {opts_.node_name, "address",
                      "pod " + me + " claims " + k.ip.str() + " at the same time"});
    d.notes.push_back("two pods claim " + k.ip.str() + ": " + other.pod.str() + " and " + me);
  }
  set_budget(d, now);
  return d;
}

void Machine::index_service(const model::ServiceKey& key) {
  terminating_.erase(key);
  nodeless_.erase(key);
  const model::ServiceState* st = snap_->find(key);
  if (!st) return;
  std::vector<DrainKey> local;
  bool nodeless = false;
  for (const auto& e : st->endpoints) {
    nodeless |= e.node_name.empty();
    if (!e.conditions.terminating) continue;
    if (e.node_name == opts_.node_name || (e.node_name.empty() && pod_for(e.address))) {
      local.push_back({e.address, uid_of(e)});
    }
  }
  if (!local.empty()) terminating_.emplace(key, std::move(local));
  if (nodeless) nodeless_.insert(key);
}

std::vector<DrainKey> Machine::on_snapshot(model::SnapshotPtr snap, TimePoint now) {
  model::SnapshotPtr before = std::move(snap_);
  snap_ = std::move(snap);
  model::Delta delta = model::diff(before.get(), *snap_);
  for (const auto& k : delta.removed) {
    terminating_.erase(k);
    nodeless_.erase(k);
  }
  // Addresses that left a headless service's answers (a DNS answer may still carry them).
  for (const auto* keys : {&delta.changed, &delta.removed}) {
    for (const auto& k : *keys) {
      const model::ServiceState* was = before ? before->find(k) : nullptr;
      if (!was || !was->service.headless) continue;
      const model::ServiceState* st = snap_->find(k);
      for (const auto& e : was->endpoints)
        if (!st || !st->find(e.address)) left_dns_[e.address] = now;
    }
  }
  if (left_dns_.size() > 4096) {
    constexpr auto kLongestTtl = std::chrono::hours(1);
    std::erase_if(left_dns_, [&](const auto& kv) { return now - kv.second >= kLongestTtl; });
  }
  for (const auto& k : delta.added) index_service(k);
  for (const auto& k : delta.changed) index_service(k);
  if (delta.pods_changed) {
    auto keys = nodeless_;
    for (const auto& k : keys) index_service(k);
  }
  std::vector<DrainKey> started;
  std::optional<Members> members;  // computed once, when the first drain starts
  auto begin_stop_accepting = [&](Drain& d, const char* why) {
    d.stage = Stage::kStopAccepting;
    d.stop_accepting = now;
    d.revision = snap_->slice_revision;
    d.generation = snap_->generation;
    d.needs_dns = d.needs_dns || (before && dns_could_answer(*before, d.ip)) ||
                  dns_could_answer(*snap_, d.ip) || recently_in_dns(d.ip, now);
    d.routed = routed_anywhere(d);
    if (d.routed)
      d.notes.push_back(
          "still routable when it became terminating (the terminating fallback: no "
          "other endpoint of a service is ready); removal waits until it is not");
    if (why) d.notes.emplace_back(why);
    if (!members) {
      members = current_members();
    }
    for (const auto& [name, address] : *members) {
      if (name == opts_.node_name) continue;
      PeerState p;
      if (!address) {
        p.state = PeerState::State::kFailed;
        p.last_error = "node has no InternalIP";
        ++counters_.peers_unconfirmed;
        d.notes.push_back("peer " + name + ": node has no InternalIP, not asked");
      } else {
        p.address = address->str();
      }
      d.peers[name] = p;
    }
    started.push_back(d.key());
  };
  // Drains under way whose endpoint a changed service holds: routable again (the terminating
  // fallback), or no longer.
  for (auto& [key, d] : drains_) {
    const model::IpAddr& ip = key.ip;
    if (d.stage < Stage::kStopAccepting || d.stage == Stage::kReleased) continue;
    bool touched = false;
    // A service of it whose new state does not directly follow the one this agent held: the
    // states in between were never seen here (ServiceState::follows).
    bool skipped = false;
    // A service of it whose spec changed: not ordered by the EndpointSlice position.
    bool spec_changed = false;
    for (const auto* keys : {&delta.added, &delta.changed}) {
      for (const auto& k : *keys) {
        const model::ServiceState* st = snap_->find(k);
        if (!st || !st->find(ip)) continue;
        touched = true;
        const model::ServiceState* was = before ? before->find(k) : nullptr;
        if (!was || st->follows == 0 || st->follows != was->revision) skipped = true;
        if (was && was->find(ip) && !was->service.equal_spec(st->service)) spec_changed = true;
      }
    }
    if (!touched && !delta.removed.empty()) touched = d.routed;
    if (!touched) continue;
    d.needs_dns = d.needs_dns || dns_could_answer(*snap_, ip);
    bool routed = routed_anywhere(d);
    if (routed && !d.routed) {
      ++counters_.routed_again;
      // Peers that applied this state route to it too: confirmed again only once it is out.
      for (auto& [node, p] : d.peers)
        if (p.state == PeerState::State::kConfirmed) p.state = PeerState::State::kPending;
      d.notes.push_back("routable again at revision " + std::to_string(snap_->slice_revision) +
                        " (the terminating fallback: no other endpoint of a service is ready)");
      if (d.stage >= Stage::kRemoved) d.reconfirm = true;
    } else if (!routed && d.routed) {
      // Out of every consumer's selection again from this update on: the removal to confirm.
      d.revision = snap_->slice_revision;
      d.generation = snap_->generation;
      d.consumers_confirmed.clear();
      for (auto& [node, p] : d.peers) {
        if (p.state == PeerState::State::kConfirmed) p.state = PeerState::State::kPending;
      }
      if (d.stage >= Stage::kRemoved) {
        d.reconfirm = true;
        d.peers_since = now;
      }
    } else if (!routed && skipped && d.revision != 0 && snap_->slice_revision > d.confirm_at()) {
      // The service changed while the endpoint stayed out, and this agent's view skipped
      // states in between (a paused agent, a watch that fell behind and relisted, updates
      // merged into one snapshot). One of those may have routed to it by the fallback, and a
      // node that still holds it reports no holdout in facts made before it got there. So the
      // peers are confirmed again by a watermark past this update, under which every node's
      // state of the service is this one or newer (a newer one than this agent's view is no
      // agent's to judge). Only the drain's own service moves it, and only when states of it
      // were skipped: an agent that saw each state judged each one.
      d.confirm_revision = snap_->slice_revision;
      bool had_confirmed = false;
      for (auto& [node, p] : d.peers) {
        if (p.state != PeerState::State::kConfirmed) continue;
        p.state = PeerState::State::kPending;
        had_confirmed = true;
      }
      if (d.stage >= Stage::kRemoved && d.stage != Stage::kReleased && had_confirmed) {
        d.reconfirm = true;
        d.peers_since = now;
      }
    }
    d.routed = routed;
    if (spec_changed && !routed && d.revision != 0) {
      // A Service-only change while the endpoint is out (one that made it the fallback and was
      // undone, or states of it this agent never saw): a peer at the watermark may not have
      // applied it, and a node that did may route to it by the fallback before its holdout
      // arrives. Each peer is asked whether its state routes to it.
      if (!d.ask_peers)
        d.notes.push_back("its service's spec changed at revision " +
                          std::to_string(snap_->slice_revision) +
                          " (not ordered by the EndpointSlice watermark): each peer is asked");
      d.ask_peers = true;
      bool had_confirmed = false;
      for (auto& [node, p] : d.peers) {
        if (p.state != PeerState::State::kConfirmed) continue;
        p.state = PeerState::State::kPending;
        had_confirmed = true;
      }
      if (d.stage >= Stage::kRemoved && had_confirmed) {
        d.reconfirm = true;
        d.peers_since = now;
      }
      started.push_back(d.key());
    }
  }
  // A node that joins the members while a drain waits (a Node created, or created again while
  // its kernel kept old rules) is waited for too: the watermark counts it only once it reports.
  if (delta.nodes_changed) add_joined_members();
  std::set<DrainKey> seen;
  for (const auto& [_, keys] : terminating_) {
    for (const auto& k : keys) {
      if (!seen.insert(k).second) continue;
      bool created = false;
      Drain& d = ensure(k, now, &created);
      if (created) {
        // Bad input, said once per drain: an endpoint whose targetRef names no pod UID.
        for (const auto& st : snap_->services) {
          const model::MergedEndpoint* e = st->find(k.ip);
          if (!e || !e->conditions.terminating || (e->target_ref && !e->target_ref->uid.empty()))
            continue;
          ++counters_.no_pod_uid;
          d.notes.push_back("endpoint " + k.ip.str() + " of " + st->key().str() +
                            " names no pod UID in its targetRef: drained as " +
                            (k.uid.empty() ? "no known pod"
                                           : "the pod of this node there (" + d.pod.str() + ")"));
          break;
        }
      }
      if (d.stage == Stage::kWaitingTerminating) begin_stop_accepting(d, nullptr);
    }
  }
  // Endpoints that left every service before they were seen terminating are not selectable
  // any more either; drains whose endpoint is gone and that nobody waits for are history.
  for (auto it = drains_.begin(); it != drains_.end();) {
    Drain& d = it->second;
    bool present = this->present(d);
    if (!present && d.stage == Stage::kWaitingTerminating) {
      begin_stop_accepting(d, "endpoint left its slices without being seen terminating");
    }
    bool waited = false;
    for (const auto& [id, w] : waiters_)
      if (!w.verdict && !d.pod_uid.empty() && w.uid == d.pod_uid) waited = true;
    bool pod_gone = d.pod.name.empty() || !snap_->find_pod(d.pod);
    if (!present && !waited && (d.stage == Stage::kReleased || pod_gone)) {
      finished_.push_back(std::move(d));
      if (finished_.size() > opts_.history) finished_.erase(finished_.begin());
      it = drains_.erase(it);
    } else {
      ++it;
    }
  }
  return started;
}

bool Machine::routed_anywhere(const Drain& d) const {
  // The feed's rule is the widest (any node, no hints, the fallback included); this node's
  // dataplane adds its node-local scopes. A shared address counts in this pod's services only.
  const model::IpAddr& ip = d.ip;
  for (const auto& st : snap_->services) {
    const model::MergedEndpoint* e = st->find(ip);
    if (!e || (d.shared_address && !names_pod(*e, d.pod_uid))) continue;
    if (model::routes_to(model::RouteView::kFeed, *st, ip, {}) ||
        model::routes_to(model::RouteView::kDataplane, *st, ip, {opts_.node_name, {}}))
      return true;
  }
  return false;
}

bool Machine::recently_in_dns(const model::IpAddr& ip, TimePoint now) const {
  auto it = left_dns_.find(ip);
  if (it == left_dns_.end()) return false;
  milliseconds ttl = dns_ttl_.value_or(std::chrono::hours(1));
  return now - it->second < ttl;
}

void Machine::set_members(Members m) {
  members_ = std::move(m);
  if (snap_) add_joined_members();
}

void Machine::add_joined_members() {
  Members now_members = current_members();
  for (auto& [key, d] : drains_) {
    if (d.stage != Stage::kStopAccepting && !d.reconfirm) continue;
    for (const auto& [name, address] : now_members) {
      if (name == opts_.node_name || d.peers.count(name) || !address) continue;
      PeerState p;
      p.address = address->str();
      p.last_error = "joined the members during the drain";
      d.peers[name] = p;
      d.notes.push_back("peer " + name + " joined the members during the drain: waited for too");
    }
  }
}

Members Machine::current_members() const {
  return members_ ? *members_ : members_of(*snap_, opts_.members_service);
}

void Machine::unconfirm(Drain& d, Unconfirmed u) {
  if (std::find(d.unconfirmed.begin(), d.unconfirmed.end(), u) == d.unconfirmed.end())
    d.unconfirmed.push_back(std::move(u));
}

void Machine::peer_answered(const model::IpAddr& ip, const std::string& node, bool confirmed,
                            const std::string& error, TimePoint now) {
  // A peer answers for the address (AwaitRemoval): every drain there that waits for it.
  for (auto it = drains_.lower_bound(DrainKey{ip, {}}); it != drains_.end() && it->first.ip == ip;
       ++it) {
    auto pit = it->second.peers.find(node);
    if (pit == it->second.peers.end() || pit->second.state != PeerState::State::kPending) continue;
    pit->second.answered = now;
    if (confirmed) {
      pit->second.state = PeerState::State::kConfirmed;
    } else {
      pit->second.state = PeerState::State::kFailed;
      pit->second.last_error = error;
      ++counters_.peers_unconfirmed;
      it->second.notes.push_back("peer " + node + " did not confirm: " + error);
      unconfirm(it->second, {node, "agent", error});
    }
  }
}

std::vector<model::IpAddr> Machine::need_flow_counts() const {
  std::vector<model::IpAddr> out;
  for (const auto& [key, d] : drains_)
    if (d.stage == Stage::kRemoved && d.release_after == ReleaseAfter::kDrained &&
        (out.empty() || out.back() != key.ip))
      out.push_back(key.ip);
  return out;
}

bool Machine::local_removed(Drain& d, const Inputs& in) {
  bool all = true;
  for (const auto& e : in.consumers) {
    // Every consumer is asked every time, those that confirmed before too: one that routes to
    // it again (the terminating fallback) is not removed any more.
    // A consumer behind the update that took the endpoint away has not removed it yet.
    TimePoint expires = TimePoint::max();
    bool routes = (e.snapshot && e.snapshot->generation < d.generation) ||
                  consumer_routes(e, d.ip, d.shared_address ? d.pod_uid : std::string(),
                                  opts_.node_name, in.now, &expires);
    if (expires != TimePoint::max()) recheck_at(expires);
    if (e.view == model::RouteView::kDns && d.needs_dns && e.cache_ttl.count() > 0) {
      // What this process served is known; what the agent before a restart served is not:
      // its answers may live one TTL past the moment this process first saw the address out.
      if (routes) {
        d.dns_out_since.reset();
      } else {
        if (!d.dns_out_since) d.dns_out_since = in.now;
        if (in.now < *d.dns_out_since + e.cache_ttl) {
          routes = true;
          recheck_at(*d.dns_out_since + e.cache_ttl);
        }
      }
    }
    if (routes) {
      all = false;
      d.consumers_confirmed.erase(e.consumer);
    } else if (d.consumers_confirmed.emplace(e.consumer, in.now).second) {
      d.last_confirmation = in.now;
    }
  }
  // A consumer's applied state is the oldest it may hold; a newer one (a feed subscriber ahead
  // of the slowest) may route to it by the fallback although the oldest does not.
  if (in.local_fallback.count(d.ip)) all = false;
  return all;
}

void Machine::judge_peers(Drain& d, const Inputs& in) {
  // While the endpoint is routable in the newest state (the fallback), a peer that applied it
  // routes to it too: no peer is confirmed until an update takes it out (revision moves then).
  if (!in.cluster || d.revision == 0 || d.routed || d.ask_peers) return;
  const ClusterFacts& c = *in.cluster;
  const uint64_t mark = d.needs_dns ? c.dns : c.routing;
  // Nodes whose applied state routes to it by the terminating fallback, and whether the list
  // overflowed its bound (then any node may).
  const std::string& fallback = fallback_client(d);
  std::set<std::string> falls_back;
  bool overflow = false;
  for (const auto& h : c.holdouts) {
    if (h.client == fallback) falls_back.insert(h.node);
    if (h.node == "*" && h.revision == 0) overflow = true;
  }
  bool keep_holdouts = false;
  for (auto& [node, p] : d.peers) {
    // A node confirmed before that now routes to it by the fallback is not confirmed any more.
    if (p.state == PeerState::State::kConfirmed && (falls_back.count(node) || overflow)) {
      p.state = PeerState::State::kPending;
      d.notes.push_back("peer " + node + " routes to it again by the terminating fallback");
    }
    if (p.state != PeerState::State::kPending) continue;
    if (auto why = c.uncounted(node)) {
      p.last_error = *why;
    } else if (falls_back.count(node) || overflow) {
      p.last_error = "its state routes to it by the terminating fallback";
    } else if (mark >= d.confirm_at()) {
      p.state = PeerState::State::kConfirmed;
      p.answered = in.now;
      p.last_error.clear();
      keep_holdouts = true;
    } else {
      p.last_error =
          std::string(d.needs_dns ? "the cluster DNS watermark " : "the cluster watermark ") +
          std::to_string(mark) + " is below " +
          (d.confirm_at() > d.revision
               ? "its service's last change " + std::to_string(d.confirm_at()) + " (the removal " +
                     std::to_string(d.revision) + ")"
               : "the removal's revision " + std::to_string(d.revision));
    }
  }
  if (!keep_holdouts) return;
  for (const auto& h : c.holdouts) {
    if (h.node == opts_.node_name || h.revision >= d.revision || is_fallback(h)) continue;
    bool known = false;
    for (const auto& k : d.confirmed_with)
      if (k.node == h.node && k.client == h.client) known = true;
    if (!known && d.confirmed_with.size() < kMaxHoldouts) d.confirmed_with.push_back(h);
  }
}

void Machine::settle_removal(Drain& d, const Inputs& in) {
  // Clients that stopped holding a consumer back (disconnected, silent past their grace) but
  // whose last accepted state routes to the endpoint: here, asked of that state; elsewhere,
  // known by the revision of that state, which is older than the removal.
  for (const auto& e : in.consumers) {
    for (const auto& h : e.holdouts) {
      // Without its state (known from before a restart): it may route to anything terminating
      // since its revision.
      if (!h.snapshot) {
        if (d.revision == 0 || h.revision < d.revision)
          unconfirm(
              d, {opts_.node_name, e.consumer + "/" + h.client,
                  h.reason + ": its last accepted state (revision " + std::to_string(h.revision) +
                      ", from before this agent's restart) may route to it"});
        continue;
      }
      pipeline::AckBoard::Entry held;
      held.view = e.view;
      held.snapshot = h.snapshot;
      if (!consumer_routes(held, d.ip, d.shared_address ? d.pod_uid : std::string(),
                           opts_.node_name, in.now))
        continue;
      unconfirm(d, {opts_.node_name, e.consumer + "/" + h.client,
                    h.reason + ": its last accepted state routes to it"});
    }
  }
  if (in.cluster && d.revision > 0) {
    auto held = [&](const Holdout& h) {
      if (h.node == opts_.node_name || h.revision >= d.revision) return;
      if (is_fallback(h)) return;  // held peers (judge_peers), not this
      unconfirm(d, {h.node, h.client,
                    h.reason + ": its last accepted state (revision " + std::to_string(h.revision) +
                        ") is older than the removal (" + std::to_string(d.revision) + ")"});
    };
    for (const auto& h : in.cluster->holdouts) held(h);
    for (const auto& h : d.confirmed_with) held(h);
  }
}

bool Machine::peers_done(Drain& d, const Inputs& in) {
  const TimePoint now = in.now;
  judge_peers(d, in);
  // Under kWait a silent peer holds stage 2 until the removal deadline (handled there).
  bool may_time_out = opts_.peer_policy == PeerPolicy::kProceed;
  // A pod DNS could have handed out waits the answers' TTL besides: that much is known, not
  // a peer being late.
  milliseconds dns_ttl{0};
  if (d.needs_dns)
    for (const auto& e : in.consumers)
      if (e.view == model::RouteView::kDns) dns_ttl = std::max(dns_ttl, e.cache_ttl);
  d.peer_deadline = std::max(d.start, d.peers_since) + opts_.peer_timeout + dns_ttl;
  TimePoint peer_deadline = d.peer_deadline;
  bool done = true;
  for (auto& [node, p] : d.peers) {
    if (p.state == PeerState::State::kConfirmed) {
      if (p.answered && (!d.last_confirmation || *p.answered > *d.last_confirmation))
        d.last_confirmation = p.answered;
      continue;
    }
    if (p.state == PeerState::State::kFailed) continue;
    if (may_time_out && now >= peer_deadline) {
      p.state = PeerState::State::kFailed;
      std::string why = "no confirmation by the peer deadline" +
                        (p.last_error.empty() ? std::string() : " (" + p.last_error + ")");
      p.last_error = why;
      p.answered = now;
      ++counters_.peers_unconfirmed;
      d.notes.push_back("peer " + node +
                        " did not confirm by its deadline; proceeding by policy: " + why);
      unconfirm(d, {node, "agent", why});
      continue;
    }
    done = false;
  }
  return done;
}

void Machine::move(Drain& d, Stage to, TimePoint at, std::vector<Transition>& out) {
  std::optional<TimePoint> entered;
  switch (d.stage) {
    case Stage::kWaitingTerminating:
      entered = d.start;
      break;
    case Stage::kStopAccepting:
      entered = d.stop_accepting;
      break;
    case Stage::kRemoved:
      entered = d.removed;
      break;
    case Stage::kDrained:
      entered = d.drained;
      break;
    case Stage::kReleased:
      entered = d.released;
      break;
  }
  d.stage = to;
  switch (to) {
    case Stage::kStopAccepting:
      d.stop_accepting = at;
      break;
    case Stage::kRemoved:
      d.removed = at;
      break;
    case Stage::kDrained:
      d.drained = at;
      break;
    case Stage::kReleased:
      d.released = at;
      break;
    default:
      break;
  }
  out.push_back({d.ip, d.pod_uid, to, at, entered ? at - *entered : std::chrono::nanoseconds(0)});
}

void Machine::advance(Drain& d, const Inputs& in, std::vector<Transition>& out) {
  if (d.stage >= Stage::kRemoved && d.stage != Stage::kReleased && !in.late.empty()) {
    // New connections after the removal was confirmed: someone this agent does not know still
    // routes to the pod. Named at the release (one entry, its counts kept current).
    if (auto it = in.late.find(d.key()); it != in.late.end()) {
      d.late_last = it->second.last;
      std::string why = "new connections after the removal from " + it->second.senders;
      auto u = std::find_if(d.unconfirmed.begin(), d.unconfirmed.end(), [&](const auto& x) {
        return x.node == opts_.node_name && x.consumer == "late traffic";
      });
      if (u == d.unconfirmed.end())
        d.unconfirmed.push_back({opts_.node_name, "late traffic", std::move(why)});
      else
        u->reason = std::move(why);
    }
  }
  if ((d.stage == Stage::kRemoved || d.stage == Stage::kDrained) && !d.reconfirm && in.cluster) {
    // Removed, not released: a node that routes to it again by the fallback takes the removal
    // back until it is confirmed anew.
    const std::string& fallback = fallback_client(d);
    for (const auto& h : in.cluster->holdouts) {
      if (h.client != fallback || !d.peers.count(h.node)) continue;
      d.reconfirm = true;
      d.notes.push_back("peer " + h.node + " routes to it again by the terminating fallback");
      for (auto& [node, p] : d.peers)
        if (p.state == PeerState::State::kConfirmed) p.state = PeerState::State::kPending;
      break;
    }
  }
  if (d.stage == Stage::kStopAccepting || d.reconfirm) {
    bool local = local_removed(d, in);
    bool peers = peers_done(d, in);
    TimePoint deadline = d.stage == Stage::kStopAccepting ? d.removal_deadline : d.budget_end;
    if (local && peers) {
      settle_removal(d, in);
      if (d.stage == Stage::kStopAccepting) {
        move(d, Stage::kRemoved, in.now, out);
      } else {
        d.reconfirm = false;
        d.notes.emplace_back("removal confirmed again after it was routable again");
      }
    } else if (in.now >= deadline) {
      std::string missing;
      for (const auto& e : in.consumers) {
        if (d.consumers_confirmed.count(e.consumer)) continue;
        missing += " " + e.consumer;
        unconfirm(d, {opts_.node_name, e.consumer, "still routes to it at the removal deadline"});
      }
      for (auto& [node, p] : d.peers) {
        if (p.state != PeerState::State::kPending) continue;
        p.state = PeerState::State::kFailed;
        std::string why = "no confirmation by the removal deadline" +
                          (p.last_error.empty() ? std::string() : " (" + p.last_error + ")");
        p.last_error = why;
        ++counters_.peers_unconfirmed;
        missing += " peer:" + node;
        unconfirm(d, {node, "agent", why});
      }
      if (d.routed)
        unconfirm(d, {opts_.node_name, "cluster",
                      "routable at the removal deadline (the terminating fallback)"});
      settle_removal(d, in);
      d.removal_forced = true;
      ++counters_.removal_deadlines;
      d.notes.push_back("removal deadline passed; still routing or unconfirmed:" + missing);
      if (d.stage == Stage::kStopAccepting)
        move(d, Stage::kRemoved, in.now, out);
      else
        d.reconfirm = false;
    }
  }
  if (d.stage == Stage::kRemoved && d.release_after == ReleaseAfter::kDrained) {
    auto it = in.flows.find(d.ip);
    if (it != in.flows.end()) {
      if (it->second.ok()) {
        d.flows = it->second.value();
        d.conntrack_failed_since.reset();
        if (d.flows->live() == 0) {
          d.last_confirmation = in.now;
          move(d, Stage::kDrained, in.now, out);
          return;
        }
      } else if (!d.conntrack_failed_since) {
        d.conntrack_failed_since = in.now;
        ++counters_.conntrack_unavailable;
        d.notes.push_back("conntrack unavailable (" + it->second.error() + "); waiting " +
                          std::to_string(opts_.conntrack_unavailable_wait.count()) + " ms");
      }
    }
    if (d.conntrack_failed_since &&
        in.now >=
            std::min(d.budget_end, *d.conntrack_failed_since + opts_.conntrack_unavailable_wait)) {
      d.drain_forced = true;
      d.notes.emplace_back("drained without a conntrack count");
      move(d, Stage::kDrained, in.now, out);
    } else if (in.now >= d.budget_end) {
      d.drain_forced = true;
      ++counters_.drain_deadlines;
      d.notes.push_back("drain deadline passed with " +
                        std::to_string(d.flows ? d.flows->live() : 0) + " live connections");
      move(d, Stage::kDrained, in.now, out);
    }
  }
  if (d.stage == Stage::kRemoved && d.release_after == ReleaseAfter::kSilent && !d.reconfirm) {
    // Silent: no new connection for `quiet` since the removal or the newest late one.
    if (in.now >= quiet_end(d)) {
      d.last_confirmation = in.now;
      d.notes.push_back("no new connection for " + std::to_string(opts_.quiet.count()) +
                        " ms after the removal" + (d.late_last ? " and the last late one" : ""));
      move(d, Stage::kDrained, in.now, out);
    } else if (in.now >= d.budget_end) {
      d.drain_forced = true;
      ++counters_.drain_deadlines;
      d.notes.emplace_back("drain deadline passed while new connections still arrived");
      move(d, Stage::kDrained, in.now, out);
    }
  }
}

TimePoint Machine::quiet_end(const Drain& d) const {
  TimePoint from = d.removed.value_or(TimePoint{});
  if (d.late_last) from = std::max(from, *d.late_last);
  return from + opts_.quiet;
}

std::vector<Transition> Machine::evaluate(const Inputs& in) {
  std::vector<Transition> out;
  recheck_at_.reset();
  for (const auto& e : in.consumers)
    if (e.view == model::RouteView::kDns)
      dns_ttl_ = std::chrono::duration_cast<milliseconds>(e.cache_ttl);
  for (auto& [key, d] : drains_) advance(d, in, out);
  for (auto& [id, w] : waiters_) settle_waiter(w, in, out);
  return out;
}

namespace {
bool pending_peer(const Drain& d) {
  for (const auto& [node, p] : d.peers)
    if (p.state == PeerState::State::kPending) return true;
  return false;
}
}  // namespace

std::optional<TimePoint> Machine::next_deadline() const {
  std::optional<TimePoint> best;
  auto consider = [&](TimePoint t) {
    if (!best || t < *best) best = t;
  };
  for (const auto& [key, d] : drains_) {
    switch (d.stage) {
      case Stage::kWaitingTerminating:
        consider(d.budget_end);
        break;
      case Stage::kStopAccepting:
        consider(d.removal_deadline);
        // The peer deadline while a peer is still pending (past it, none is: they failed).
        if (opts_.peer_policy == PeerPolicy::kProceed && pending_peer(d))
          consider(std::max(d.peer_deadline, d.start + opts_.peer_timeout));
        break;
      case Stage::kDrained:
        // Drained, waiting for its prestop call (or the pod to go): only a reconfirmation
        // has deadlines (its budget, and under proceed the peers').
        if (!d.reconfirm) break;
        consider(d.budget_end);
        if (opts_.peer_policy == PeerPolicy::kProceed && pending_peer(d))
          consider(
              std::max(d.peer_deadline, std::max(d.start, d.peers_since) + opts_.peer_timeout));
        break;
      case Stage::kRemoved:
        // Its budget ends the drain of its connections, or a reconfirmation; a drain released
        // after removal waits here for its prestop call (or the pod to go) with no deadline.
        if (d.release_after == ReleaseAfter::kDrained || d.reconfirm) consider(d.budget_end);
        if (d.release_after == ReleaseAfter::kSilent && !d.reconfirm)
          consider(std::min(d.budget_end, quiet_end(d)));
        if (d.reconfirm && opts_.peer_policy == PeerPolicy::kProceed && pending_peer(d))
          consider(
              std::max(d.peer_deadline, std::max(d.start, d.peers_since) + opts_.peer_timeout));
        if (d.conntrack_failed_since && d.release_after == ReleaseAfter::kDrained)
          consider(*d.conntrack_failed_since + opts_.conntrack_unavailable_wait);
        break;
      default:
        break;
    }
  }
  // Only a waiter whose pod the API has not shown terminating yet has that deadline: past it
  // (its drains under way) it would wake the loop for nothing, again and again.
  for (const auto& [id, w] : waiters_)
    if (!w.verdict && !w.terminating_seen) consider(w.called + opts_.terminating_wait);
  if (recheck_at_) consider(*recheck_at_);
  return best;
}

}  // namespace endpointd::drain
