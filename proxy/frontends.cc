// A service's frontends (proxy/frontends.h).
#include "proxy/frontends.h"

namespace endpointd::proxy {

std::vector<Frontend> service_addresses(const model::Service& svc) {
  std::vector<Frontend> out;
  out.reserve(svc.cluster_ips.size() + svc.external_ips.size() + svc.load_balancer_ips.size());
  for (const auto& a : svc.cluster_ips) out.push_back({a, 0, FrontendKind::kClusterIp});
  for (const auto& a : svc.external_ips) out.push_back({a, 0, FrontendKind::kExternalIp});
  for (const auto& a : svc.load_balancer_ips) out.push_back({a, 0, FrontendKind::kLoadBalancerIp});
  return out;
}

std::optional<uint16_t> node_port(const model::Service& svc, const model::ServicePort& sp) {
  bool has =
      svc.type == model::ServiceType::kNodePort || svc.type == model::ServiceType::kLoadBalancer;
  if (!has || sp.node_port == 0) return std::nullopt;
  return sp.node_port;
}

std::vector<Frontend> frontends(const model::Service& svc, const model::ServicePort& sp,
                                std::span<const model::IpAddr> node_port_ips) {
  std::vector<Frontend> out = service_addresses(svc);
  for (auto& f : out) f.port = sp.port;
  if (auto np = node_port(svc, sp))
    for (const auto& a : node_port_ips) out.push_back({a, *np, FrontendKind::kNodePort});
  return out;
}

}  // namespace endpointd::proxy
