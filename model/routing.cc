// The routing rule (see routing.h); every consumer of "who receives traffic" calls these.
#include "model/routing.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace endpointd::model {

Routing routing_of(const Service& svc, const EndpointConditions& c) {
  if (c.terminating) return c.serving ? Routing::kFallback : Routing::kNone;
  if (c.ready || svc.publish_not_ready_addresses) return Routing::kReady;
  return Routing::kNone;
}

namespace {

bool equals_lower(std::string_view s, std::string_view lower) {
  if (s.size() != lower.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != lower[i]) return false;
  }
  return true;
}

bool contains(const SharedVector<std::string>& list, std::string_view v) {
  return !v.empty() && std::find(list.begin(), list.end(), v) != list.end();
}

}  // namespace

bool prefers_same_node(const Service& svc) {
  return svc.traffic_distribution == "PreferSameNode";
}

bool prefers_close(const Service& svc) {
  return svc.traffic_distribution == "PreferClose" ||
         svc.traffic_distribution == "PreferSameZone" || prefers_same_node(svc) ||
         equals_lower(svc.topology_mode, "auto");
}

std::optional<uint16_t> backend_port(const MergedEndpoint& e, const ServicePort& sp) {
  if (e.address.is_unspecified() || e.address.is_loopback()) return std::nullopt;
  auto p = e.port_for(sp);
  if (!p || *p == 0) return std::nullopt;
  return p;
}

std::vector<size_t> select_routed(const Service& svc, std::span<const MergedEndpoint* const> eps,
                                  Scope scope, const RoutingNode& node) {
  std::vector<size_t> ready, fallback;
  for (size_t i = 0; i < eps.size(); ++i) {
    const MergedEndpoint& e = *eps[i];
    if (scope == Scope::kNodeLocal && e.node_name != node.name) continue;
    switch (routing_of(svc, e.conditions)) {
      case Routing::kReady:
        ready.push_back(i);
        break;
      case Routing::kFallback:
        fallback.push_back(i);
        break;
      case Routing::kNone:
        break;
    }
  }
  if (ready.empty()) return fallback;
  if (scope != Scope::kCluster) return ready;
  // Topology hints are decided from the hints alone, as kube-proxy does (the EndpointSlice
  // controller writes them only for services that ask, by trafficDistribution or the
  // topology-mode annotation): node hints first, then zone hints, each only when every ready
  // endpoint carries them (a half-hinted slice is being rewritten by its controller) and one
  // is for this node or zone.
  auto narrowed = [&](bool by_node) {
    std::vector<size_t> near;
    std::string_view here = by_node ? node.name : node.zone;
    if (here.empty()) return near;
    for (size_t i : ready) {
      const auto& hints = by_node ? eps[i]->hint_nodes : eps[i]->hint_zones;
      if (hints.empty()) return std::vector<size_t>{};
      if (contains(hints, here)) near.push_back(i);
    }
    return near;
  };
  if (auto near = narrowed(true); !near.empty()) return near;
  if (auto near = narrowed(false); !near.empty()) return near;
  return ready;
}

bool has_proxy_rules(const Service& svc) {
  return svc.type != ServiceType::kExternalName && !svc.headless && svc.service_proxy_name.empty();
}

namespace {

// Whether `e` is chosen for some port of the service in one of `scopes`.
bool routed_in(const ServiceState& st, const MergedEndpoint& e, const RoutingNode& node,
               const std::vector<Scope>& scopes) {
  const Service& svc = st.service;
  std::vector<const MergedEndpoint*> eps;
  for (const ServicePort& sp : svc.ports) {
    if (sp.port == 0 || !backend_port(e, sp)) continue;
    eps.clear();
    size_t self = 0;
    for (const auto& o : st.endpoints) {
      if (o.address.family() != e.address.family() || !backend_port(o, sp)) continue;
      if (&o == &e) self = eps.size();
      eps.push_back(&o);
    }
    for (Scope scope : scopes) {
      auto chosen = select_routed(svc, eps, scope, node);
      if (std::binary_search(chosen.begin(), chosen.end(), self)) return true;
    }
  }
  return false;
}

}  // namespace

bool proxy_routes_to(const ServiceState& st, const MergedEndpoint& e, const RoutingNode& node) {
  const Service& svc = st.service;
  if (!has_proxy_rules(svc)) return false;
  // The scopes the service's rules use: cluster-wide unless both policies are Local, the
  // node-local maps when either is (external traffic counted even without external addresses:
  // when unsure, say "routed", which only makes a drain wait).
  bool itp_local = svc.internal_traffic_policy == TrafficPolicy::kLocal;
  bool etp_local = svc.external_traffic_policy == TrafficPolicy::kLocal;
  std::vector<Scope> scopes;
  if (!itp_local || !etp_local) scopes.push_back(Scope::kCluster);
  if (itp_local || etp_local) scopes.push_back(Scope::kNodeLocal);
  return routed_in(st, e, node, scopes);
}

bool feed_routes_to(const ServiceState& st, const MergedEndpoint& e, const RoutingNode&) {
  // The verdicts the feed sends, so that drain's view of a subscriber is what it was told.
  size_t self = 0;
  while (self < st.endpoints.size() && &st.endpoints[self] != &e) ++self;
  if (self == st.endpoints.size()) return false;  // not one of st's endpoints
  for (const ServicePort& sp : st.service.ports) {
    auto v = port_verdicts(st, sp)[self];
    if (v == PortVerdict::kRouted || v == PortVerdict::kFallback) return true;
  }
  return false;
}

namespace {
// A feed subscriber's candidate for `sp`: any endpoint with a non-zero target port. Unlike the
// kernel's NAT, a proxy in user space can connect to a loopback address (EndpointSlice
// validation keeps those out of clusters; tests on one machine use them).
bool feed_candidate(const MergedEndpoint& e, const ServicePort& sp) {
  auto p = e.port_for(sp);
  return p && *p != 0 && !e.address.is_unspecified();
}
}  // namespace

std::vector<PortVerdict> port_verdicts(const ServiceState& st, const ServicePort& sp) {
  std::vector<PortVerdict> out(st.endpoints.size(), PortVerdict::kNotRouted);
  if (sp.port == 0) return out;
  std::vector<const MergedEndpoint*> eps;
  std::vector<size_t> at;  // eps[i] is st.endpoints[at[i]]
  for (IpFamily family : {IpFamily::kV4, IpFamily::kV6}) {
    eps.clear();
    at.clear();
    for (size_t i = 0; i < st.endpoints.size(); ++i) {
      const MergedEndpoint& e = st.endpoints[i];
      if (e.address.family() != family || !feed_candidate(e, sp)) continue;
      eps.push_back(&e);
      at.push_back(i);
      if (routing_of(st.service, e.conditions) == Routing::kFallback)
        out[i] = PortVerdict::kDraining;  // unless chosen below
    }
    for (size_t i : select_routed(st.service, eps, Scope::kUnhinted, {})) {
      out[at[i]] = routing_of(st.service, eps[i]->conditions) == Routing::kReady
                       ? PortVerdict::kRouted
                       : PortVerdict::kFallback;
    }
  }
  return out;
}

bool dns_answers(const Service& svc, const MergedEndpoint& e) {
  return routing_of(svc, e.conditions) == Routing::kReady;
}

bool routes_to(RouteView view, const ServiceState& st, const IpAddr& ip, const RoutingNode& node) {
  const MergedEndpoint* e = st.find(ip);
  if (!e) return false;
  switch (view) {
    case RouteView::kDataplane:
      return proxy_routes_to(st, *e, node);
    case RouteView::kFeed:
      return feed_routes_to(st, *e, node);
    case RouteView::kDns:
      return st.service.headless && st.service.type != ServiceType::kExternalName &&
             dns_answers(st.service, *e);
  }
  return true;
}

bool routes_to(RouteView view, const Snapshot& snap, const IpAddr& ip, const RoutingNode& node) {
  if (!snap.synced) return true;
  for (const auto& st : snap.services) {
    if (routes_to(view, *st, ip, node)) return true;
  }
  return false;
}

}  // namespace endpointd::model
