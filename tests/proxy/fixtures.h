// Snapshots that exercise every rule shape and map of the proxy's layout.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/snapshot.h"
#include "proxy/planner.h"

namespace endpointd::proxy::testing {

inline model::IpAddr ip(const char* s) {
  return *model::IpAddr::parse(s);
}
inline model::IpPrefix prefix(const char* s) {
  return *model::IpPrefix::parse(s);
}

inline model::MergedEndpoint endpoint(const char* addr, uint16_t port,
                                      const std::string& node = "node-a", bool ready = true,
                                      bool terminating = false, bool serving = true,
                                      model::Protocol proto = model::Protocol::kTCP) {
  model::MergedEndpoint e;
  e.address = ip(addr);
  e.conditions.ready = ready;
  e.conditions.terminating = terminating;
  e.conditions.serving = serving;
  e.node_name = node;
  model::EndpointPort p;
  p.name = "http";
  p.port = port;
  p.protocol = proto;
  e.ports.push_back(p);
  return e;
}

inline model::Service service(const std::string& name, std::vector<model::IpAddr> cluster_ips,
                              uint16_t port, model::Protocol proto = model::Protocol::kTCP) {
  model::Service s;
  s.key = {"default", name};
  s.cluster_ips = std::move(cluster_ips);
  model::ServicePort sp;
  sp.name = "http";
  sp.protocol = proto;
  sp.port = port;
  sp.target_port_number = 8080;
  s.ports.push_back(sp);
  return s;
}

inline model::ServiceStatePtr state(model::Service svc, std::vector<model::MergedEndpoint> eps) {
  auto st = std::make_shared<model::ServiceState>();
  st->service = std::move(svc);
  std::sort(eps.begin(), eps.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  st->endpoints = std::move(eps);
  return st;
}

inline model::SnapshotPtr snapshot(uint64_t g, std::vector<model::ServiceStatePtr> services) {
  auto s = std::make_shared<model::Snapshot>();
  s->generation = g;
  s->synced = true;
  std::sort(services.begin(), services.end(),
            [](const auto& a, const auto& b) { return a->key() < b->key(); });
  s->services = std::move(services);
  return s;
}

inline NodeContext node_context() {
  NodeContext c;
  c.node_name = "node-a";
  c.zone = "zone-a";
  c.node_ips = {ip("192.168.50.1"), ip("fd50::1")};
  c.cluster_cidrs = {prefix("10.244.0.0/16"), prefix("fd44::/64")};
  return c;
}

// One service of every kind the layout distinguishes.
inline model::SnapshotPtr every_shape(uint64_t g = 1) {
  using model::Protocol;
  std::vector<model::ServiceStatePtr> v;
  // ClusterIP, dual stack, two endpoints per family.
  v.push_back(state(service("web", {ip("10.96.0.10"), ip("fd96::10")}, 80),
                    {endpoint("10.244.1.2", 8080), endpoint("10.244.1.3", 8080),
                     endpoint("fd44::2", 8080), endpoint("fd44::3", 8080)}));
  // No endpoints: reject.
  v.push_back(state(service("empty", {ip("10.96.0.11"), ip("fd96::11")}, 80), {}));
  // UDP with ClientIP affinity and three endpoints.
  auto dns = service("dns", {ip("10.96.0.12")}, 53, Protocol::kUDP);
  dns.session_affinity_client_ip = true;
  auto udp = [](const char* a, const char* node) {
    return endpoint(a, 53, node, true, false, true, Protocol::kUDP);
  };
  v.push_back(state(dns, {udp("10.244.1.4", "node-a"), udp("10.244.2.4", "node-b"),
                          udp("10.244.3.4", "node-c")}));
  // NodePort + LoadBalancer with source ranges and externalTrafficPolicy Local.
  auto lb = service("lb", {ip("10.96.0.13"), ip("fd96::13")}, 443);
  lb.type = model::ServiceType::kLoadBalancer;
  lb.ports[0].node_port = 30443;
  lb.load_balancer_ips = {ip("203.0.113.7"), ip("2001:db8::7")};
  lb.load_balancer_source_ranges = {prefix("198.51.100.0/24"), prefix("2001:db8:1::/48")};
  lb.external_traffic_policy = model::TrafficPolicy::kLocal;
  lb.external_ips = {ip("203.0.113.8")};
  v.push_back(state(lb, {endpoint("10.244.1.5", 8443), endpoint("10.244.2.5", 8443, "node-b"),
                         endpoint("fd44::5", 8443, "node-b")}));
  // SCTP NodePort, internalTrafficPolicy Local without a local endpoint.
  auto sctp = service("sctp", {ip("10.96.0.14")}, 9000, Protocol::kSCTP);
  sctp.type = model::ServiceType::kNodePort;
  sctp.ports[0].node_port = 30900;
  sctp.internal_traffic_policy = model::TrafficPolicy::kLocal;
  v.push_back(
      state(sctp, {endpoint("10.244.2.6", 9000, "node-b", true, false, true, Protocol::kSCTP)}));
  // Only a terminating, serving endpoint: used as the fallback.
  v.push_back(state(service("term", {ip("10.96.0.15")}, 80),
                    {endpoint("10.244.1.7", 8080, "node-a", false, true, true)}));
  return snapshot(g, std::move(v));
}

}  // namespace endpointd::proxy::testing
