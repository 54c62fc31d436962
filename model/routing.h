// Which endpoints of a service receive new connections: the one rule that the proxy's planner,
// the DNS zone, the feed's health statuses and the drain's "is it still routed?" all call.
// A change to the rule is an edit here and nowhere else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "model/snapshot.h"

namespace endpointd::model {

// How one endpoint stands for new connections, by its conditions alone.
enum class Routing {
  kNone,      // never chosen (not ready, not serving)
  kReady,     // chosen
  kFallback,  // serving but terminating: chosen only when no endpoint in scope is kReady
};

// A terminating endpoint is never kReady (stop-accepting is the first step of every drain): it
// is kFallback while serving (kube-proxy's terminating fallback), else kNone. Any other
// endpoint is kReady when ready, or when the service publishes not-ready addresses.
Routing routing_of(const Service& svc, const EndpointConditions& c);

// The view of the node that routes: its name (for node-local policies and node hints) and
// its zone (for zone hints). Empty strings mean unknown.
struct RoutingNode {
  std::string_view name;
  std::string_view zone;
};

enum class Scope {
  kCluster,    // every endpoint, narrowed by topology hints when the service asks for them
  kNodeLocal,  // only endpoints on this node (internal/externalTrafficPolicy: Local)
  kUnhinted,   // every endpoint, no hints: what a feed subscriber, which weighs localities
               // itself, may pick from
};

// Whether the service asks to keep traffic close (trafficDistribution PreferClose or
// PreferSameZone, or the topology-mode annotation "Auto"), and whether it prefers this node.
bool prefers_close(const Service& svc);
bool prefers_same_node(const Service& svc);

// The target port of `e` for service port `sp` when `e` can be a backend of it at all: a
// routable address (not unspecified, not loopback) and a non-zero port.
std::optional<uint16_t> backend_port(const MergedEndpoint& e, const ServicePort& sp);

// From the candidate endpoints of one service port and one address family (each one with a
// backend_port), those that receive new connections in `scope`, as indexes into `eps` in
// ascending order:
//  - the kReady ones; none ready: the kFallback ones;
//  - kNodeLocal keeps only endpoints whose node name is `node`'s;
//  - kCluster with ready endpoints keeps those hinted for this node (when every ready
//    endpoint has node hints), else those hinted for this zone (when every ready endpoint has
//    zone hints), else all of them: decided from the hints alone, as kube-proxy does.
std::vector<size_t> select_routed(const Service& svc, std::span<const MergedEndpoint* const> eps,
                                  Scope scope, const RoutingNode& node);

// Whether the nftables dataplane programs the service at all: not headless, not
// ExternalName, and not left to another proxy by the service-proxy-name label.
bool has_proxy_rules(const Service& svc);

// Whether the nftables dataplane of `node` routes new connections to `e`, an endpoint of `st`,
// for any port and family, in the scopes its traffic policies use (the planner's rule applied
// to one endpoint).
bool proxy_routes_to(const ServiceState& st, const MergedEndpoint& e, const RoutingNode& node);

// Whether a feed subscriber (ingress, mesh proxy) may send new connections to `e`, an endpoint
// of `st`: its port_verdicts for some port are kRouted or kFallback, so a fallback (DRAINING)
// endpoint counts as routed while its port has no ready endpoint of its family.
bool feed_routes_to(const ServiceState& st, const MergedEndpoint& e, const RoutingNode& node);

// How one endpoint of one service port stands for a feed subscriber (ingress, mesh proxy),
// which weighs localities itself: the verdict the feed sends (endpointd.v1.Routing).
enum class PortVerdict {
  kNotRouted,  // no traffic (kNone, or no backend_port)
  kRouted,     // kReady, chosen
  kFallback,   // kFallback, chosen: no kReady endpoint of its family on the port
  kDraining,   // kFallback, not chosen: others are ready; its connections finish
};

// The verdict of each endpoint of `st` (in `st.endpoints`' order) for service port `sp`:
// select_routed in kUnhinted scope over the port's endpoints of each address family that have
// a non-zero target port and a specified address (a subscriber, a proxy in user space, may
// connect to a loopback one, which the dataplane never routes to). All kNotRouted for port 0.
std::vector<PortVerdict> port_verdicts(const ServiceState& st, const ServicePort& sp);

// Whether DNS answers `e` among a headless service's records: the kReady endpoints only (a
// name has no last resort; a terminating endpoint leaves the answers at stop-accepting).
bool dns_answers(const Service& svc, const MergedEndpoint& e);

// How a consumer turns a snapshot into routing: the question drain asks of each consumer on the
// acknowledgement board ("does your applied state still send new connections to E?").
enum class RouteView {
  kDataplane,  // the nftables rules (proxy_routes_to)
  kFeed,       // feed and xDS subscribers (feed_routes_to)
  kDns,        // headless services' answers (dns_answers)
};

// Whether a consumer that applied `snap` may send a new connection to `ip` through `view` on
// `node`, in any service. An unsynced snapshot may be missing what it shows, so it counts as
// routing to everything.
bool routes_to(RouteView view, const Snapshot& snap, const IpAddr& ip, const RoutingNode& node);

// The same for one service.
bool routes_to(RouteView view, const ServiceState& st, const IpAddr& ip, const RoutingNode& node);

}  // namespace endpointd::model
