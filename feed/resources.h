// Model → wire: the UpstreamFeed's messages and the xDS resources built from a snapshot.
// Pure functions over protobuf messages; no gRPC, no threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "endpointd/v1/feed.pb.h"
#include "google/protobuf/any.pb.h"
#include "model/result.h"
#include "model/snapshot.h"

namespace endpointd::feed {

// ---- UpstreamFeed ----

// A Subscribe, validated. A service matches when any selector matches it; the ports it
// carries are those of the selectors that matched (all of them when one has port 0).
struct Selection {
  struct Selector {
    std::string ns;
    std::string name;  // empty: the whole namespace
    uint16_t port = 0;
  };
  bool all = false;
  std::vector<Selector> selectors;

  // Parses a Subscribe; an error for a selector without a namespace or a bad port.
  static Result<Selection> from(const v1::Subscribe& s);
  // Only exact ns/name selectors: changes can be found without a diff.
  bool exact_only() const;
  bool matches(const model::ServiceKey& k) const;
  // Whether service port `p` of a matching service is carried.
  bool carries_port(const model::ServiceKey& k, uint16_t p) const;
  std::string str() const;
};

void fill_service(const model::ServiceState& st, const Selection& sel, v1::ServiceEndpoints* out);

// ---- xDS ----

enum class XdsType { kListener, kRoute, kCluster, kEndpoint, kUnknown };
inline constexpr std::string_view kListenerType =
    "type.googleapis.com/envoy.config.listener.v3.Listener";
inline constexpr std::string_view kRouteType =
    "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
inline constexpr std::string_view kClusterType =
    "type.googleapis.com/envoy.config.cluster.v3.Cluster";
inline constexpr std::string_view kEndpointType =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
XdsType xds_type(std::string_view type_url);
std::string_view type_url(XdsType t);
std::string_view short_name(XdsType t);  // "lds", "rds", "cds", "eds"

// A service port as xDS names it. Listener and route configuration:
// "<svc>.<ns>.svc.<zone>:<port>"; cluster and ClusterLoadAssignment:
// "outbound|<port>||<svc>.<ns>.svc.<zone>".
struct ServicePortName {
  model::ServiceKey key;
  uint16_t port = 0;
};
std::string listener_name(const model::ServiceKey& k, uint16_t port, std::string_view zone);
std::string cluster_name(const model::ServiceKey& k, uint16_t port, std::string_view zone);
std::optional<ServicePortName> parse_resource_name(XdsType t, std::string_view name,
                                                   std::string_view zone);

// Service ports that get xDS resources: TCP ports of services that are not ExternalName.
bool has_xds_port(const model::ServiceState& st, uint16_t port);
std::vector<uint16_t> xds_ports(const model::ServiceState& st);

struct XdsContext {
  std::string zone = "cluster.local";
  std::string client_zone;  // the client's Node.locality.zone; empty when unknown
};

// The resource of type `t` for one service port, packed in an Any. `st` is the service, or
// null for a ClusterLoadAssignment of one that does not exist (sent with no endpoints).
google::protobuf::Any build_resource(XdsType t, const ServicePortName& name,
                                     const model::ServiceState* st, const XdsContext& ctx);

}  // namespace endpointd::feed
