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

}  // namespace endpointd::drain
