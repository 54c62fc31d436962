// Selection rules per consumer, mirroring proxy/planner.cc, dns/zone.cc and feed/resources.cc.
#include "drain/selection.h"

namespace endpointd::drain {

namespace {

bool ready_like(const model::Service& svc, const model::MergedEndpoint& e) {
  const auto& c = e.conditions;
  if (c.ready && !c.terminating) return true;
  if (c.serving && c.terminating) return false;  // the fallback list, not the ready one
  return svc.publish_not_ready_addresses;
}

// The proxy's rule: chosen if ready-like, or a serving+terminating fallback for a port where
// no other endpoint of its family is ready-like.
bool proxy_selects(const model::ServiceState& st, const model::MergedEndpoint& e) {
  const model::Service& svc = st.service;
  if (ready_like(svc, e)) return true;
  if (!(e.conditions.serving && e.conditions.terminating)) return false;
  if (svc.ports.empty()) return true;  // conservative: nothing to tell the ports apart by
  for (const auto& sp : svc.ports) {
    if (!e.port_for(sp)) continue;
    bool other_ready = false;
    for (const auto& o : st.endpoints) {
      if (&o == &e || o.address.family() != e.address.family()) continue;
      if (ready_like(svc, o) && o.port_for(sp)) {
        other_ready = true;
        break;
      }
    }
    if (!other_ready) return true;
  }
  return false;
}

}  // namespace

bool selectable_in(std::string_view consumer, const model::ServiceState& st,
                   const model::IpAddr& ip) {
  const model::MergedEndpoint* e = st.find(ip);
  if (!e) return false;
  const model::Service& svc = st.service;
  if (consumer == "dns") {
    if (!svc.headless || svc.type == model::ServiceType::kExternalName) return false;
    if (e->conditions.terminating) return false;
    return e->conditions.ready || svc.publish_not_ready_addresses;
  }
  if (consumer != "feed") {
    if (svc.type == model::ServiceType::kExternalName || svc.headless) return false;
    if (!svc.service_proxy_name.empty()) return false;
  }
  return proxy_selects(st, *e);
}

bool selectable(std::string_view consumer, const model::Snapshot& snap, const model::IpAddr& ip) {
  if (!snap.synced) return true;
  for (const auto& st : snap.services) {
    if (selectable_in(consumer, *st, ip)) return true;
  }
  return false;
}

}  // namespace endpointd::drain
