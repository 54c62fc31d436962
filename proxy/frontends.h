// A service's frontends: which address:port pairs serve one of its ports on this node. The
// planner programs them, the sink's UDP index and stale-flow sweep match them; one rule here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/objects.h"

namespace endpointd::proxy {

enum class FrontendKind { kClusterIp, kExternalIp, kLoadBalancerIp, kNodePort };

struct Frontend {
  model::IpAddr addr;
  uint16_t port = 0;
  FrontendKind kind = FrontendKind::kClusterIp;
  friend bool operator==(const Frontend&, const Frontend&) = default;
};

// The service's own addresses, with no port: its cluster IPs, external IPs and load-balancer
// IPs, in that order (`port` is 0). Not the node's addresses its NodePorts are served on.
std::vector<Frontend> service_addresses(const model::Service& svc);

// The NodePort `sp` is served on: only for NodePort and LoadBalancer services, and not 0.
std::optional<uint16_t> node_port(const model::Service& svc, const model::ServicePort& sp);

// Every address:port pair that serves `sp`: each service address on `sp.port`, then each of
// `node_port_ips` (planner.h's node_port_ips) on the NodePort, if it has one. Every family;
// unroutable addresses (unspecified, loopback) included, for the caller to skip and count.
std::vector<Frontend> frontends(const model::Service& svc, const model::ServicePort& sp,
                                std::span<const model::IpAddr> node_port_ips);

}  // namespace endpointd::proxy
