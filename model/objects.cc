// Names and equality for the model's object types.
#include "model/objects.h"

#include <tuple>

namespace endpointd::model {

std::string_view to_string(Protocol p) {
  switch (p) {
    case Protocol::kTCP:
      return "TCP";
    case Protocol::kUDP:
      return "UDP";
    case Protocol::kSCTP:
      return "SCTP";
  }
  return "?";
}

std::optional<Protocol> parse_protocol(std::string_view s) {
  if (s.empty() || s == "TCP") return Protocol::kTCP;  // the API defaults to TCP
  if (s == "UDP") return Protocol::kUDP;
  if (s == "SCTP") return Protocol::kSCTP;
  return std::nullopt;
}

std::string_view to_string(ServiceType t) {
  switch (t) {
    case ServiceType::kClusterIP:
      return "ClusterIP";
    case ServiceType::kNodePort:
      return "NodePort";
    case ServiceType::kLoadBalancer:
      return "LoadBalancer";
    case ServiceType::kExternalName:
      return "ExternalName";
  }
  return "?";
}

std::string_view to_string(TrafficPolicy t) {
  return t == TrafficPolicy::kLocal ? "Local" : "Cluster";
}

namespace {
auto spec_tie(const Service& s) {
  return std::tie(s.key, s.uid, s.type, s.headless, s.cluster_ips, s.ports, s.external_ips,
                  s.load_balancer_ips, s.load_balancer_source_ranges, s.session_affinity_client_ip,
                  s.session_affinity_timeout_seconds, s.internal_traffic_policy,
                  s.external_traffic_policy, s.health_check_node_port,
                  s.publish_not_ready_addresses, s.external_name, s.traffic_distribution,
                  s.topology_mode, s.service_proxy_name, s.allocate_load_balancer_node_ports);
}
}  // namespace

bool Service::equal_spec(const Service& o) const {
  return spec_tie(*this) == spec_tie(o);
}

bool EndpointSlice::equal_content(const EndpointSlice& o) const {
  return std::tie(key, service_name, address_type, ports, endpoints, service_proxy_name) ==
         std::tie(o.key, o.service_name, o.address_type, o.ports, o.endpoints,
                  o.service_proxy_name);
}

bool Node::equal_content(const Node& o) const {
  return std::tie(name, addresses, labels, zone, pod_cidrs, deleting, taint_keys) ==
         std::tie(o.name, o.addresses, o.labels, o.zone, o.pod_cidrs, o.deleting, o.taint_keys);
}

std::vector<IpAddr> Node::internal_ips() const {
  std::vector<IpAddr> out;
  bool have4 = false, have6 = false;
  for (const auto& a : addresses) {
    if (a.type != "InternalIP") continue;
    auto ip = IpAddr::parse(a.address);
    if (!ip) continue;
    bool& have = ip->is_v4() ? have4 : have6;
    if (have) continue;
    have = true;
    out.push_back(*ip);
  }
  return out;
}

bool Node::eligible() const {
  if (deleting) return false;
  for (const auto& k : taint_keys)
    if (k == "ToBeDeletedByClusterAutoscaler") return false;
  return true;
}

bool Pod::equal_content(const Pod& o) const {
  return std::tie(key, uid, node_name, pod_ips, host_network, phase, terminating,
                  deletion_timestamp, termination_grace_period_seconds, annotations,
                  labels) == std::tie(o.key, o.uid, o.node_name, o.pod_ips, o.host_network, o.phase,
                                      o.terminating, o.deletion_timestamp,
                                      o.termination_grace_period_seconds, o.annotations, o.labels);
}

}  // namespace endpointd::model
