#include "drain/members.h"

namespace endpointd::drain {

Members members_of(const model::Snapshot& snap, const std::optional<model::ServiceKey>& service) {
  Members out;
  for (const auto& n : snap.nodes) {
    auto ips = n->internal_ips();
    out[n->name] = ips.empty() ? std::nullopt : std::optional<model::IpAddr>(ips.front());
  }
  if (!service) return out;
  const model::ServiceState* st = snap.find(*service);
  if (!st) return out;
  // Where each node's agent listens: its endpoint in the agents' Service (the lowest address;
  // IpAddr orders IPv4 before IPv6, then by bytes). A node whose agent has no endpoint there
  // stays a member at its InternalIP: its kernel still holds the rules its agent left.
  std::map<std::string, model::IpAddr> agents;
  for (const auto& ep : st->endpoints) {
    if (ep.node_name.empty()) continue;
    auto [it, inserted] = agents.try_emplace(ep.node_name, ep.address);
    if (!inserted && ep.address < it->second) it->second = ep.address;
  }
  for (const auto& [node, address] : agents) out[node] = address;
  return out;
}

}  // namespace endpointd::drain
