// The drain machine's waiters: prestop calls waiting for their pod's verdict, and the drain
// action each may run (drain/machine.h). Pure, as the rest of the machine.
#include <string>
#include <vector>

#include "drain/action.h"
#include "drain/machine.h"
#include "drain/machine_internal.h"

namespace endpointd::drain {

using internal::in_any_service;
using internal::ms_since;

uint64_t Machine::add_waiter(const model::ObjectKey& pod, const std::string& uid, TimePoint now,
                             std::string action) {
  uint64_t id = next_waiter_++;
  Waiter w;
  w.pod = pod;
  w.uid = uid;
  w.called = now;
  w.client_action = std::move(action);
  waiters_[id] = std::move(w);
  return id;
}

std::optional<std::string> Machine::take_due_action(uint64_t id, TimePoint now,
                                                    TimePoint* deadline) {
  auto it = waiters_.find(id);
  if (it == waiters_.end() || it->second.action_state != Waiter::ActionState::kDue)
    return std::nullopt;
  Waiter& w = it->second;
  w.action_state = Waiter::ActionState::kRunning;
  *deadline = now + opts_.peer_timeout;
  bool first = true;
  for (auto& [ip, d] : drains_) {
    if (d.pod_uid != w.uid) continue;
    d.action_started = now;
    if (first || d.budget_end < *deadline) *deadline = d.budget_end;
    first = false;
  }
  return w.action;
}

void Machine::action_finished(uint64_t id, const Result<std::string>& outcome, TimePoint now) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  Waiter& w = it->second;
  w.action_state = Waiter::ActionState::kDone;
  if (outcome) {
    w.action_note = "drain action " + *outcome;
  } else {
    ++counters_.action_failures;
    w.action_failed = true;
    w.action_note = "drain action failed: " + outcome.error() +
                    "; released after removal (SIGTERM is the application's drain)";
  }
  for (auto& [ip, d] : drains_) {
    if (d.pod_uid != w.uid) continue;
    d.action_done = now;
    d.notes.push_back(w.action_note);
    if (w.action_failed) d.release_after = ReleaseAfter::kRemoved;
  }
}

void Machine::remove_waiter(uint64_t id) {
  waiters_.erase(id);
}

std::optional<Verdict> Machine::verdict(uint64_t id) const {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return Verdict{false, "unknown prestop call"};
  return it->second.verdict;
}

std::vector<model::IpAddr> Machine::pod_endpoints(const model::Pod& pod) const {
  std::vector<model::IpAddr> out;
  for (const auto& ip : pod.pod_ips)
    if (drains_.count({ip, pod.uid}) || drains_.count({ip, {}}) ||
        (snap_ && in_any_service(*snap_, ip)))
      out.push_back(ip);
  return out;
}

void Machine::settle_waiter(Waiter& w, const Inputs& in, std::vector<Transition>& out) {
  if (w.verdict) return;
  const model::Pod* pod = snap_ ? snap_->find_pod(w.pod) : nullptr;
  std::vector<model::IpAddr> ips;
  if (pod) {
    if (pod->terminating) w.terminating_seen = true;
    if (!pod->terminating) {
      if (in.now >= w.called + opts_.terminating_wait) {
        ++counters_.not_terminating_in_api;
        w.verdict = Verdict{
            false, "the API did not show pod " + w.pod.str() + " terminating within " +
                       std::to_string(opts_.terminating_wait.count()) + " ms; nothing was drained"};
      }
      return;
    }
    ips = pod_endpoints(*pod);
    if (!w.action_resolved) {
      // The client's flag wins over the annotation; a spec that does not parse is no action.
      w.action_resolved = true;
      std::string spec = w.client_action, source = "--drain-action";
      if (spec.empty())
        if (auto a = pod->annotations.find(kDrainActionAnnotation); a != pod->annotations.end()) {
          spec = a->second;
          source = std::string("annotation ") + kDrainActionAnnotation;
        }
      if (!spec.empty()) {
        if (auto parsed = parse_drain_action(spec)) {
          w.action = spec;
        } else {
          ++counters_.bad_actions;
          w.action_note = source + ": " + parsed.error() + "; no drain action";
        }
      }
    }
  } else {
    for (const auto& [key, d] : drains_)
      if (d.pod_uid == w.uid) ips.push_back(key.ip);
    if (!ips.empty()) w.terminating_seen = true;  // gone from the API: past terminating
    if (ips.empty() && !w.terminating_seen) {
      // A pod this agent's view has never shown (its watch is behind): not "no endpoints".
      if (in.now >= w.called + opts_.terminating_wait) {
        ++counters_.not_terminating_in_api;
        w.verdict = Verdict{false, "the API did not show pod " + w.pod.str() + " within " +
                                       std::to_string(opts_.terminating_wait.count()) +
                                       " ms; nothing was drained"};
      }
      return;
    }
  }
  if (ips.empty()) {
    ++counters_.no_endpoints;
    w.verdict =
        Verdict{true, "pod " + w.pod.str() + " has no endpoints: nothing to remove or drain"};
    return;
  }
  bool all_ready = true, removed_all = true;
  std::string forced;
  std::vector<DrainKey> keys;  // the pod's drains, one per address
  for (const auto& ip : ips) {
    bool created = false;
    // A drain at the address that names no pod (its endpoint's targetRef had no UID and no pod
    // of this node was found then) is this pod's: the kernel identified the caller.
    // And a caller whose pod names no UID (a manifest without one) is the drain of its pod.
    DrainKey key{ip, w.uid};
    if (!drains_.count(key) && !w.uid.empty() && drains_.count({ip, {}})) {
      auto node = drains_.extract(DrainKey{ip, {}});
      node.key().uid = w.uid;
      node.mapped().pod_uid = w.uid;
      drains_.insert(std::move(node));
    } else if (!drains_.count(key) && w.uid.empty()) {
      for (auto it = drains_.lower_bound(DrainKey{ip, {}});
           it != drains_.end() && it->first.ip == ip; ++it)
        if (it->second.pod == w.pod) key = it->first;
    }
    Drain& d = ensure(key, in.now, &created);
    keys.push_back(key);
    if (created) d.pod_uid = w.uid;
    if (d.pod.name.empty()) d.pod = w.pod;
    if (!d.prestop_called || w.called < *d.prestop_called) d.prestop_called = w.called;
    if (!w.action.empty() && !w.action_failed && d.action != w.action) {
      d.action = w.action;
      d.release_after = ReleaseAfter::kDrained;
    }
    if (!w.action_note.empty() && w.action.empty() &&
        std::find(d.notes.begin(), d.notes.end(), w.action_note) == d.notes.end())
      d.notes.push_back(w.action_note);
    if (d.stage == Stage::kWaitingTerminating) {
      if (in.now >= d.budget_end) {
        ++counters_.never_terminating;
        d.notes.emplace_back("endpoint never became terminating within the budget");
        w.verdict = Verdict{false, "endpoint " + ip.str() + " of pod " + w.pod.str() +
                                       " never became terminating in its EndpointSlices; "
                                       "removal was not confirmed"};
        return;
      }
      all_ready = removed_all = false;
      continue;
    }
    bool ready =
        !d.reconfirm && (d.stage >= Stage::kDrained ||
                         (d.stage == Stage::kRemoved && d.release_after == ReleaseAfter::kRemoved));
    if (!ready) all_ready = false;
    if (d.stage < Stage::kRemoved) removed_all = false;
    if (d.removal_forced || d.drain_forced)
      for (const auto& n : d.notes) forced += "; " + n;
  }
  // The drain action runs once the pod is removed everywhere, and the release waits for it.
  using AS = Waiter::ActionState;
  if (!w.action.empty() && w.action_state == AS::kNone && removed_all) w.action_state = AS::kDue;
  if (!w.action.empty() && w.action_state != AS::kDone) all_ready = false;
  if (!all_ready) return;
  std::string summary, unconfirmed;
  for (const auto& key : keys) {
    const model::IpAddr& ip = key.ip;
    Drain& d = drains_.at(key);
    if (d.stage != Stage::kReleased) {
      move(d, Stage::kReleased, in.now, out);
      ++(d.unconfirmed.empty() ? counters_.released_confirmed : counters_.released_unconfirmed);
    }
    for (const auto& u : d.unconfirmed)
      unconfirmed +=
          (unconfirmed.empty() ? "" : "; ") + u.node + "/" + u.consumer + ": " + u.reason;
    ++counters_.released;
    summary += (summary.empty() ? "" : ", ") + ip.str() + ": removed after " +
               ms_since(d.start, d.removed.value_or(in.now)) + " ms" +
               (d.drained ? ", drained after " + ms_since(d.start, *d.drained) + " ms" : "");
  }
  if (!w.action_note.empty()) summary += "; " + w.action_note;
  w.verdict = Verdict{
      true, "released " + w.pod.str() + " (" + summary + "), " +
                (unconfirmed.empty() ? "confirmed" : "unconfirmed: " + unconfirmed) + forced};
}

}  // namespace endpointd::drain
