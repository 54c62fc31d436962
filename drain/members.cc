#include "drain/members.h"

namespace endpointd::drain {

Members members_of(const model::Snapshot& snap, const std::optional<model::ServiceKey>& service) {
  Members out;
  if (!service) {
    for (const auto& n : snap.nodes) {
      auto ips = n->internal_ips();
      out[n->name] = ips.empty() ? std::nullopt : std::optional<model::IpAddr>(ips.front());
    }
    return out;
  }
  const model::ServiceState* st = snap.find(*service);
  if (!st) return out;
  // IpAddr orders IPv4 before IPv6, then by bytes: the lowest is the one to take.
  for (const auto& ep : st->endpoints) {
    if (ep.node_name.empty()) continue;
    auto [it, inserted] = out.try_emplace(ep.node_name, ep.address);
    if (!inserted && ep.address < *it->second) it->second = ep.address;
  }
  return out;
}

}  // namespace endpointd::drain
