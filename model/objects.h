// The Kubernetes objects endpointd reads, reduced to the fields it acts on. Values only:
// the watcher decodes into these, the Store keeps them, snapshots are built from them.
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/ip.h"
#include "model/shared.h"

namespace endpointd::model {

enum class Protocol : uint8_t { kTCP, kUDP, kSCTP };
std::string_view to_string(Protocol p);
std::optional<Protocol> parse_protocol(std::string_view s);

// namespace/name of a namespaced object.
struct ObjectKey {
  std::string ns;
  std::string name;
  std::string str() const { return ns + "/" + name; }
  friend auto operator<=>(const ObjectKey&, const ObjectKey&) = default;
  friend bool operator==(const ObjectKey&, const ObjectKey&) = default;
};
using ServiceKey = ObjectKey;

enum class ServiceType : uint8_t { kClusterIP, kNodePort, kLoadBalancer, kExternalName };
std::string_view to_string(ServiceType t);

enum class TrafficPolicy : uint8_t { kCluster, kLocal };
std::string_view to_string(TrafficPolicy t);

struct ServicePort {
  std::string name;
  Protocol protocol = Protocol::kTCP;
  uint16_t port = 0;
  // targetPort: a number, or a container port name resolved through the EndpointSlice.
  uint16_t target_port_number = 0;
  std::string target_port_name;
  uint16_t node_port = 0;
  std::string app_protocol;
  friend bool operator==(const ServicePort&, const ServicePort&) = default;
};

struct Service {
  ObjectKey key;
  std::string uid;
  std::string resource_version;  // not part of equality: it changes on every write
  ServiceType type = ServiceType::kClusterIP;
  bool headless = false;            // clusterIP: None
  std::vector<IpAddr> cluster_ips;  // primary first, as spec.clusterIPs
  std::vector<ServicePort> ports;
  std::vector<IpAddr> external_ips;
  std::vector<IpAddr> load_balancer_ips;  // status.loadBalancer.ingress[].ip
  std::vector<IpPrefix> load_balancer_source_ranges;
  bool session_affinity_client_ip = false;
  uint32_t session_affinity_timeout_seconds = 10800;
  TrafficPolicy internal_traffic_policy = TrafficPolicy::kCluster;
  TrafficPolicy external_traffic_policy = TrafficPolicy::kCluster;
  uint16_t health_check_node_port = 0;
  bool publish_not_ready_addresses = false;
  std::string external_name;
  std::string traffic_distribution;  // spec.trafficDistribution, e.g. "PreferClose"
  std::string topology_mode;         // service.kubernetes.io/topology-mode annotation
  std::string service_proxy_name;    // service.kubernetes.io/service-proxy-name label
  bool allocate_load_balancer_node_ports = true;

  bool equal_spec(const Service& o) const;
};

struct EndpointConditions {
  bool ready = true;  // nil ready means ready
  bool serving = true;
  bool terminating = false;
  friend bool operator==(const EndpointConditions&, const EndpointConditions&) = default;
};

struct ObjectRef {
  std::string kind;
  std::string ns;
  std::string name;
  std::string uid;
  friend bool operator==(const ObjectRef&, const ObjectRef&) = default;
};

struct Endpoint {
  std::vector<IpAddr> addresses;
  EndpointConditions conditions;
  std::string hostname;
  std::string node_name;
  std::string zone;
  // These three are shared with the merged endpoints built from this one.
  SharedVector<std::string> hint_zones;
  SharedVector<std::string> hint_nodes;
  Shared<ObjectRef> target_ref;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

struct EndpointPort {
  std::string name;
  Protocol protocol = Protocol::kTCP;
  uint16_t port = 0;
  std::string app_protocol;
  friend bool operator==(const EndpointPort&, const EndpointPort&) = default;
};

enum class AddressType : uint8_t { kIPv4, kIPv6, kFQDN };

struct EndpointSlice {
  ObjectKey key;
  std::string resource_version;
  std::string service_name;  // kubernetes.io/service-name label
  AddressType address_type = AddressType::kIPv4;
  std::vector<EndpointPort> ports;
  std::vector<Endpoint> endpoints;
  std::string service_proxy_name;
  // endpoints.kubernetes.io/last-change-trigger-time: when the change this slice carries was
  // triggered (a pod or service update); zero when absent. Not content: equal_content ignores it.
  std::chrono::system_clock::time_point trigger_time{};

  ServiceKey service_key() const { return {key.ns, service_name}; }
  bool equal_content(const EndpointSlice& o) const;
};

struct NodeAddress {
  std::string type;  // InternalIP, ExternalIP, Hostname, ...
  std::string address;
  friend bool operator==(const NodeAddress&, const NodeAddress&) = default;
};

struct Node {
  std::string name;
  std::string resource_version;
  std::vector<NodeAddress> addresses;
  std::map<std::string, std::string> labels;
  std::string zone;  // topology.kubernetes.io/zone
  std::vector<IpPrefix> pod_cidrs;
  bool deleting = false;                // metadata.deletionTimestamp set
  std::vector<std::string> taint_keys;  // spec.taints[].key
  bool equal_content(const Node& o) const;
  // Whether load balancers should keep sending to this node (kube-proxy's "node eligible",
  // KEP-3836): not when it is being deleted or the cluster autoscaler marked it for deletion.
  bool eligible() const;
  // The first InternalIP of each family, the address peers reach this node's agent at.
  std::vector<IpAddr> internal_ips() const;
};

struct Pod {
  ObjectKey key;
  std::string uid;
  std::string resource_version;
  std::string node_name;
  std::vector<IpAddr> pod_ips;
  bool host_network = false;
  std::string phase;
  bool terminating = false;  // metadata.deletionTimestamp set
  std::string deletion_timestamp;
  int64_t termination_grace_period_seconds = 30;
  std::map<std::string, std::string> annotations;
  std::map<std::string, std::string> labels;
  bool equal_content(const Pod& o) const;
};

}  // namespace endpointd::model
