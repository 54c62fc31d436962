#include "drain/members.h"

namespace endpointd::drain {

Members members_of(const model::Snapshot& snap, const std::optional<model::ServiceKey>& service,
                   const std::set<std::string>* agents) {
  Members out;
  for (const auto& n : snap.nodes) {
    if (service && agents && !agents->count(n->name)) continue;
    auto ips = n->internal_ips();
    out[n->name] = ips.empty() ? std::nullopt : std::optional<model::IpAddr>(ips.front());
  }
  if (!service) return out;
  const model::ServiceState* st = snap.find(*service);
  if (!st) return out;
  // Where each node's agent listens: its endpoint in the agents' Service (the lowest address;
  // IpAddr orders IPv4 before IPv6, then by bytes). A node whose agent has no endpoint there
  // stays a member at its InternalIP: its kernel still holds the rules its agent left.
  std::map<std::string, model::IpAddr> at;
  for (const auto& ep : st->endpoints) {
    if (ep.node_name.empty()) continue;
    auto [it, inserted] = at.try_emplace(ep.node_name, ep.address);
    if (!inserted && ep.address < it->second) it->second = ep.address;
  }
  for (const auto& [node, address] : at) out[node] = address;
  return out;
}

bool learn_agents(std::set<std::string>& seen, const std::set<std::string>& excluded) {
  size_t before = seen.size();
  seen.insert(excluded.begin(), excluded.end());
  return seen.size() != before;
}

void DeletedNodes::observe(const Members& from_nodes, TimePoint now) {
  for (const auto& [name, address] : last_) {
    if (from_nodes.count(name) || held_.count(name)) continue;
    held_[name] = Held{address, now, std::nullopt};
    changed_ = true;
  }
  for (auto it = held_.begin(); it != held_.end();) {
    if (from_nodes.count(it->first)) {
      it = held_.erase(it);  // its Node is back: a member by the list again
      changed_ = true;
    } else {
      ++it;
    }
  }
  last_ = from_nodes;
}

void DeletedNodes::excluded(const std::set<std::string>& excluded, TimePoint now) {
  for (auto it = held_.begin(); it != held_.end();) {
    Held& h = it->second;
    if (!excluded.count(it->first)) {
      h.silent_since.reset();  // reporting: its kernel's state is known, it is counted
      ++it;
      continue;
    }
    if (!h.silent_since) h.silent_since = now;
    if (now - *h.silent_since >= bound_) {
      it = held_.erase(it);
      changed_ = true;
    } else {
      ++it;
    }
  }
}

void DeletedNodes::expire_unobserved(TimePoint now) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (now - it->second.deleted_at >= bound_) {
      it = held_.erase(it);
      changed_ = true;
    } else {
      ++it;
    }
  }
}

Members DeletedNodes::with_held(Members from_nodes) const {
  for (const auto& [name, h] : held_) from_nodes.emplace(name, h.address);
  return from_nodes;
}

std::optional<DeletedNodes::TimePoint> DeletedNodes::next_expiry() const {
  std::optional<TimePoint> best;
  for (const auto& [name, h] : held_) {
    if (!h.silent_since) continue;
    TimePoint t = *h.silent_since + bound_;
    if (!best || t < *best) best = t;
  }
  return best;
}

std::vector<std::string> DeletedNodes::held() const {
  std::vector<std::string> out;
  for (const auto& [name, h] : held_) out.push_back(name);
  return out;
}

}  // namespace endpointd::drain
