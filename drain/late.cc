// Late senders: who still opens connections to a pod after its removal (late.h).
#include "drain/late.h"
#include "drain/late_inputs.h"

#include <algorithm>

#include "model/json.h"

namespace endpointd::drain {

const char* Source::kind_label() const {
  switch (kind) {
    case Kind::kPod:
      return "pod";
    case Kind::kNode:
      return "node";
    case Kind::kExternal:
      break;
  }
  return "external";
}

std::string Source::str() const {
  const std::string at = " (" + address.str() + ")";
  switch (kind) {
    case Kind::kPod:
      if (name.empty()) return "a pod of node " + node + at;
      return "pod " + name + (node.empty() ? "" : " on " + node) + at;
    case Kind::kNode:
      return "node " + name + at;
    case Kind::kExternal:
      break;
  }
  return "outside the cluster" + at;
}

Source attribute(const model::Snapshot& snap, const model::IpAddr& src) {
  Source s;
  s.address = src;
  for (const auto& n : snap.nodes) {
    for (const auto& a : n->addresses) {
      if (a.type == "Hostname") continue;
      auto ip = model::IpAddr::parse(a.address);
      if (ip && *ip == src) {
        s.kind = Source::Kind::kNode;
        s.name = n->name;
        return s;
      }
    }
  }
  // Two pods may hold one address for a moment (one terminating, its successor given the
  // address): the one not terminating is the one sending new connections.
  const model::Pod* pod = nullptr;
  for (const auto& p : snap.pods) {
    if (p->host_network) continue;
    if (std::find(p->pod_ips.begin(), p->pod_ips.end(), src) == p->pod_ips.end()) continue;
    if (!pod || (pod->terminating && !p->terminating)) pod = p.get();
  }
  if (pod) {
    s.kind = Source::Kind::kPod;
    s.name = pod->key.str();
    s.node = pod->node_name;
    return s;
  }
  for (const auto& n : snap.nodes) {
    for (const auto& cidr : n->pod_cidrs) {
      if (cidr.contains(src)) {
        s.kind = Source::Kind::kPod;
        s.node = n->name;
        return s;
      }
    }
  }
  return s;
}

Source::Kind LateSenders::add(const model::IpAddr& src, TimePoint at,
                              const std::function<Source()>& who) {
  ++total_;
  last_ = std::max(last_, at);
  for (auto& e : entries_) {
    if (e.source.address != src) continue;
    ++e.count;
    e.last = std::max(e.last, at);
    return e.source.kind;
  }
  if (entries_.size() >= kMaxSources) {
    ++others_;
    return who().kind;
  }
  entries_.push_back(Entry{who(), 1, at, at});
  return entries_.back().source.kind;
}

std::string LateSenders::summary() const {
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry* a, const Entry* b) { return a->count > b->count; });
  std::string out;
  for (const Entry* e : order) {
    if (!out.empty()) out += ", ";
    out += e->source.str() + ": " + std::to_string(e->count);
  }
  if (others_) {
    if (!out.empty()) out += ", ";
    out += std::to_string(others_) + " more from sources past the bound";
  }
  return out;
}

void LateWatch::update(const std::vector<Pod>& pods, const std::string& node,
                       const model::Snapshot* snap, TimePoint now) {
  for (const auto& p : pods) {
    auto [it, fresh] = records_.try_emplace(p.uid);
    Record& r = it->second;
    r.pod = p;
    if (p.released && r.until == TimePoint::max()) r.until = *p.released + window_;
  }
  // A drain gone from the list without a release (the pod deleted, the agent's drain erased):
  // its window starts now.
  for (auto& entry : records_) {
    Record& r = entry.second;
    if (r.until != TimePoint::max()) continue;
    const std::string& uid = entry.first;
    bool listed = std::any_of(pods.begin(), pods.end(), [&](const Pod& p) { return p.uid == uid; });
    if (!listed) r.until = now + window_;
  }
  // An address another pod of this node now holds is that pod's: the watch of the old one ends.
  if (!snap) return;
  for (auto& [uid, r] : records_) {
    if (r.until <= now) continue;
    for (const auto& p : snap->pods) {
      if (p->node_name != node || p->host_network || p->uid == uid || p->terminating) continue;
      if (std::find(p->pod_ips.begin(), p->pod_ips.end(), r.pod.ip) == p->pod_ips.end()) continue;
      r.until = now;
      break;
    }
  }
}

std::set<model::IpAddr> LateWatch::addresses() const {
  std::set<model::IpAddr> out;
  for (const auto& [uid, r] : records_) out.insert(r.pod.ip);
  return out;
}

void LateWatch::observe(const std::vector<SeenFlow>& flows, const model::Snapshot* snap) {
  for (const auto& f : flows) {
    ++stats_.flows;
    // The record watching the address at the connection's time: a drain still under way
    // first (the newest, if a pod never released left one behind), then the one that ended
    // last. (A drain gone without a release — erased when a new pod took its address — ends
    // when its window starts: ranked by that, never as one under way, or it would take the new
    // pod's connections.)
    Record* to = nullptr;
    auto rank = [&](const Record& r) {
      if (r.until == TimePoint::max() && !r.pod.released) return std::pair(1, r.pod.start);
      return std::pair(0, r.pod.released.value_or(r.until - window_));
    };
    for (auto& [uid, r] : records_) {
      if (r.pod.ip != f.dst || f.at >= r.until) continue;
      if (!to || rank(r) > rank(*to)) to = &r;
    }
    if (!to) {
      ++stats_.unwatched;
      continue;
    }
    auto who = [&] {
      if (snap) return attribute(*snap, f.src);
      Source s;
      s.address = f.src;
      return s;
    };
    if (!to->pod.removed || f.at < *to->pod.removed)
      ++to->before_removal;
    else if (!to->pod.released || f.at < *to->pod.released)
      ++stats_.late[static_cast<int>(to->late.add(f.src, f.at, who))];
    else
      ++stats_.after_release[static_cast<int>(to->after_release.add(f.src, f.at, who))];
  }
}

const LateWatch::Record* LateWatch::record(const std::string& uid) const {
  auto it = records_.find(uid);
  return it == records_.end() ? nullptr : &it->second;
}

std::vector<LateWatch::Pod> late_watch_pods(const std::map<DrainKey, Drain>& drains) {
  std::vector<LateWatch::Pod> out;
  for (const auto& [key, d] : drains)
    if (!d.shared_address && !d.pod_uid.empty())
      out.push_back({d.ip, d.pod_uid, d.pod.str(), d.removed, d.released, d.start});
  return out;
}

std::map<DrainKey, Machine::Inputs::Late> late_inputs(const LateWatch& watch,
                                                      const std::map<DrainKey, Drain>& drains) {
  std::map<DrainKey, Machine::Inputs::Late> out;
  for (const auto& [key, d] : drains)
    if (const auto* r = watch.record(d.pod_uid); r && !r->late.empty())
      out[key] = {r->late.summary(), r->late.last()};
  return out;
}

std::vector<LateWatch::Record> LateWatch::take_finished(TimePoint now) {
  std::vector<Record> out;
  for (auto it = records_.begin(); it != records_.end();) {
    if (it->second.until <= now) {
      out.push_back(std::move(it->second));
      it = records_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

namespace {

std::string senders_json(const LateSenders& l) {
  std::string j = "{\"total\":" + std::to_string(l.total()) +
                  ",\"others\":" + std::to_string(l.others()) + ",\"senders\":[";
  bool first = true;
  for (const auto& e : l.entries()) {
    j += std::string(first ? "" : ",") + "{\"source\":\"" + e.source.kind_label() +
         "\",\"name\":" + model::json_string(e.source.name) +
         ",\"node\":" + model::json_string(e.source.node) +
         ",\"address\":" + model::json_string(e.source.address.str()) +
         ",\"count\":" + std::to_string(e.count) + "}";
    first = false;
  }
  return j + "]}";
}

}  // namespace

std::string late_json(const LateWatch::Record& r) {
  return "{\"before_removal\":" + std::to_string(r.before_removal) +
         ",\"after_removal\":" + senders_json(r.late) +
         ",\"after_release\":" + senders_json(r.after_release) + "}";
}

}  // namespace endpointd::drain
