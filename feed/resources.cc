// Model → UpstreamFeed messages and xDS resources.
#include "feed/resources.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "envoy/config/cluster/v3/cluster.pb.h"
#include "envoy/config/endpoint/v3/endpoint.pb.h"
#include "envoy/config/listener/v3/listener.pb.h"
#include "envoy/config/route/v3/route.pb.h"
#include "envoy/extensions/filters/http/router/v3/router.pb.h"
#include "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.pb.h"
#include "model/routing.h"

namespace endpointd::feed {

namespace {

v1::Protocol to_proto(model::Protocol p) {
  switch (p) {
    case model::Protocol::kTCP:
      return v1::TCP;
    case model::Protocol::kUDP:
      return v1::UDP;
    case model::Protocol::kSCTP:
      return v1::SCTP;
  }
  return v1::TCP;
}

v1::Routing to_proto(model::PortVerdict v) {
  switch (v) {
    case model::PortVerdict::kRouted:
      return v1::ROUTED;
    case model::PortVerdict::kFallback:
      return v1::ROUTED_FALLBACK;
    case model::PortVerdict::kDraining:
      return v1::DRAINING;
    case model::PortVerdict::kNotRouted:
      return v1::NOT_ROUTED;
  }
  return v1::NOT_ROUTED;
}

std::optional<uint16_t> parse_port(std::string_view s) {
  unsigned v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v == 0 || v > 65535) return std::nullopt;
  return static_cast<uint16_t>(v);
}

// "<svc>.<ns>.svc.<zone>" → key.
std::optional<model::ServiceKey> parse_host(std::string_view host, std::string_view zone) {
  const std::string suffix = ".svc." + std::string(zone);
  if (host.size() <= suffix.size() || host.substr(host.size() - suffix.size()) != suffix)
    return std::nullopt;
  host.remove_suffix(suffix.size());
  auto dot = host.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == host.size()) return std::nullopt;
  std::string_view name = host.substr(0, dot), ns = host.substr(dot + 1);
  if (ns.find('.') != std::string_view::npos) return std::nullopt;
  return model::ServiceKey{std::string(ns), std::string(name)};
}

const model::ServicePort* find_port(const model::ServiceState& st, uint16_t port) {
  for (const auto& sp : st.service.ports)
    if (sp.port == port && sp.protocol == model::Protocol::kTCP) return &sp;
  return nullptr;
}

envoy::config::core::v3::ConfigSource ads_source() {
  envoy::config::core::v3::ConfigSource cs;
  cs.mutable_ads();
  cs.set_resource_api_version(envoy::config::core::v3::V3);
  return cs;
}

google::protobuf::Any pack(const google::protobuf::Message& m) {
  google::protobuf::Any any;
  any.PackFrom(m);
  return any;
}

google::protobuf::Any build_cla(const model::ServiceState* st, uint16_t port, const XdsContext& ctx,
                                const std::string& name) {
  namespace ep = envoy::config::endpoint::v3;
  namespace core = envoy::config::core::v3;
  ep::ClusterLoadAssignment cla;
  cla.set_cluster_name(name);
  const model::ServicePort* sp = st ? find_port(*st, port) : nullptr;
  if (sp) {
    struct Locality {
      std::vector<ep::LbEndpoint> endpoints;
      uint32_t healthy = 0;
    };
    std::map<std::string, Locality> by_zone;
    for (const auto& e : st->endpoints) {
      auto target = e.port_for(*sp);
      if (!target) continue;
      ep::LbEndpoint lb;
      auto* sa = lb.mutable_endpoint()->mutable_address()->mutable_socket_address();
      sa->set_address(e.address.str());
      sa->set_port_value(*target);
      if (!e.hostname.empty()) lb.mutable_endpoint()->set_hostname(e.hostname);
      auto& loc = by_zone[e.zone];
      switch (model::routing_of(st->service, e.conditions)) {
        case model::Routing::kReady:
          lb.set_health_status(core::HEALTHY);
          ++loc.healthy;
          break;
        case model::Routing::kFallback:
          lb.set_health_status(core::DRAINING);
          break;
        case model::Routing::kNone:
          lb.set_health_status(core::UNHEALTHY);
          break;
      }
      loc.endpoints.push_back(std::move(lb));
    }
    bool local_first = false;
    if (model::prefers_close(st->service) && !ctx.client_zone.empty()) {
      auto it = by_zone.find(ctx.client_zone);
      local_first = it != by_zone.end() && it->second.healthy > 0 && by_zone.size() > 1;
    }
    for (auto& [zone, loc] : by_zone) {
      auto* l = cla.add_endpoints();
      l->mutable_locality()->set_zone(zone);
      // Weighted by healthy endpoints so each endpoint gets an equal share across zones; a
      // weight of 0 would make proxyless gRPC ignore the locality.
      l->mutable_load_balancing_weight()->set_value(std::max<uint32_t>(loc.healthy, 1));
      l->set_priority(local_first && zone != ctx.client_zone ? 1 : 0);
      for (auto& lb : loc.endpoints) *l->add_lb_endpoints() = std::move(lb);
    }
  }
  return pack(cla);
}

}  // namespace

// ---- UpstreamFeed ----

Result<Selection> Selection::from(const v1::Subscribe& s) {
  Selection sel;
  sel.all = s.all();
  if (sel.all) return sel;
  for (const auto& x : s.selectors()) {
    if (x.namespace_().empty()) return Error{"selector without a namespace"};
    if (x.port() > 65535) return Error{"selector port out of range"};
    sel.selectors.push_back({x.namespace_(), x.name(), static_cast<uint16_t>(x.port())});
  }
  return sel;
}

bool Selection::exact_only() const {
  if (all) return false;
  return std::all_of(selectors.begin(), selectors.end(),
                     [](const Selector& s) { return !s.name.empty(); });
}

bool Selection::matches(const model::ServiceKey& k) const {
  if (all) return true;
  for (const auto& s : selectors)
    if (s.ns == k.ns && (s.name.empty() || s.name == k.name)) return true;
  return false;
}

bool Selection::carries_port(const model::ServiceKey& k, uint16_t p) const {
  if (all) return true;
  for (const auto& s : selectors)
    if (s.ns == k.ns && (s.name.empty() || s.name == k.name) && (s.port == 0 || s.port == p))
      return true;
  return false;
}

std::string Selection::str() const {
  if (all) return "*";
  std::string out;
  for (const auto& s : selectors) {
    if (!out.empty()) out += ",";
    out += s.ns + "/" + (s.name.empty() ? "*" : s.name);
    if (s.port) out += ":" + std::to_string(s.port);
  }
  return out;
}

void fill_service(const model::ServiceState& st, const Selection& sel, v1::ServiceEndpoints* out) {
  const auto& svc = st.service;
  out->set_namespace_(svc.key.ns);
  out->set_name(svc.key.name);
  out->set_headless(svc.headless);
  for (const auto& ip : svc.cluster_ips) out->add_cluster_ips(ip.str());
  for (const auto& sp : svc.ports) {
    if (!sel.carries_port(svc.key, sp.port)) continue;
    auto* p = out->add_ports();
    p->set_name(sp.name);
    p->set_protocol(to_proto(sp.protocol));
    p->set_port(sp.port);
    p->set_app_protocol(sp.app_protocol);
    const std::vector<model::PortVerdict> verdicts = model::port_verdicts(st, sp);
    for (size_t i = 0; i < st.endpoints.size(); ++i) {
      const model::MergedEndpoint& e = st.endpoints[i];
      auto target = e.port_for(sp);
      if (!target) continue;
      auto* ep = p->add_endpoints();
      ep->set_address(e.address.str());
      ep->set_port(*target);
      ep->set_ready(e.conditions.ready);
      ep->set_serving(e.conditions.serving);
      ep->set_terminating(e.conditions.terminating);
      ep->set_routing(to_proto(verdicts[i]));
      ep->set_zone(e.zone);
      ep->set_node(e.node_name);
      ep->set_hostname(e.hostname);
      if (e.target_ref) {
        auto* t = ep->mutable_target();
        t->set_kind(e.target_ref->kind);
        t->set_namespace_(e.target_ref->ns);
        t->set_name(e.target_ref->name);
        t->set_uid(e.target_ref->uid);
      }
    }
  }
}

// ---- xDS ----

XdsType xds_type(std::string_view url) {
  if (url == kListenerType) return XdsType::kListener;
  if (url == kRouteType) return XdsType::kRoute;
  if (url == kClusterType) return XdsType::kCluster;
  if (url == kEndpointType) return XdsType::kEndpoint;
  return XdsType::kUnknown;
}

std::string_view type_url(XdsType t) {
  switch (t) {
    case XdsType::kListener:
      return kListenerType;
    case XdsType::kRoute:
      return kRouteType;
    case XdsType::kCluster:
      return kClusterType;
    case XdsType::kEndpoint:
      return kEndpointType;
    case XdsType::kUnknown:
      break;
  }
  return "";
}

std::string_view short_name(XdsType t) {
  switch (t) {
    case XdsType::kListener:
      return "lds";
    case XdsType::kRoute:
      return "rds";
    case XdsType::kCluster:
      return "cds";
    case XdsType::kEndpoint:
      return "eds";
    case XdsType::kUnknown:
      break;
  }
  return "unknown";
}

std::string listener_name(const model::ServiceKey& k, uint16_t port, std::string_view zone) {
  return k.name + "." + k.ns + ".svc." + std::string(zone) + ":" + std::to_string(port);
}

std::string cluster_name(const model::ServiceKey& k, uint16_t port, std::string_view zone) {
  return "outbound|" + std::to_string(port) + "||" + k.name + "." + k.ns + ".svc." +
         std::string(zone);
}

std::optional<ServicePortName> parse_resource_name(XdsType t, std::string_view name,
                                                   std::string_view zone) {
  std::string_view host, port;
  if (t == XdsType::kListener || t == XdsType::kRoute) {
    auto colon = name.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    host = name.substr(0, colon);
    port = name.substr(colon + 1);
  } else if (t == XdsType::kCluster || t == XdsType::kEndpoint) {
    constexpr std::string_view prefix = "outbound|";
    if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
    name.remove_prefix(prefix.size());
    auto bars = name.find("||");
    if (bars == std::string_view::npos) return std::nullopt;
    port = name.substr(0, bars);
    host = name.substr(bars + 2);
  } else {
    return std::nullopt;
  }
  auto p = parse_port(port);
  auto key = parse_host(host, zone);
  if (!p || !key) return std::nullopt;
  return ServicePortName{std::move(*key), *p};
}

bool has_xds_port(const model::ServiceState& st, uint16_t port) {
  return st.service.type != model::ServiceType::kExternalName && find_port(st, port) != nullptr;
}

std::vector<uint16_t> xds_ports(const model::ServiceState& st) {
  std::vector<uint16_t> out;
  if (st.service.type == model::ServiceType::kExternalName) return out;
  for (const auto& sp : st.service.ports)
    if (sp.protocol == model::Protocol::kTCP) out.push_back(sp.port);
  return out;
}

google::protobuf::Any build_resource(XdsType t, const ServicePortName& spn,
                                     const model::ServiceState* st, const XdsContext& ctx) {
  namespace hcm = envoy::extensions::filters::network::http_connection_manager::v3;
  const model::ServiceKey& key = spn.key;
  const uint16_t port = spn.port;
  switch (t) {
    case XdsType::kListener: {
      const std::string name = listener_name(key, port, ctx.zone);
      hcm::HttpConnectionManager m;
      m.set_stat_prefix(name);
      auto* rds = m.mutable_rds();
      *rds->mutable_config_source() = ads_source();
      rds->set_route_config_name(name);
      auto* router = m.add_http_filters();
      router->set_name("envoy.filters.http.router");
      router->mutable_typed_config()->PackFrom(
          envoy::extensions::filters::http::router::v3::Router());
      envoy::config::listener::v3::Listener l;
      l.set_name(name);
      l.mutable_api_listener()->mutable_api_listener()->PackFrom(m);
      return pack(l);
    }
    case XdsType::kRoute: {
      const std::string name = listener_name(key, port, ctx.zone);
      envoy::config::route::v3::RouteConfiguration rc;
      rc.set_name(name);
      auto* vh = rc.add_virtual_hosts();
      vh->set_name(name);
      vh->add_domains("*");
      auto* r = vh->add_routes();
      r->mutable_match()->set_prefix("");
      r->mutable_route()->set_cluster(cluster_name(key, port, ctx.zone));
      return pack(rc);
    }
    case XdsType::kCluster: {
      const std::string name = cluster_name(key, port, ctx.zone);
      envoy::config::cluster::v3::Cluster c;
      c.set_name(name);
      c.set_type(envoy::config::cluster::v3::Cluster::EDS);
      *c.mutable_eds_cluster_config()->mutable_eds_config() = ads_source();
      c.mutable_eds_cluster_config()->set_service_name(name);
      c.mutable_connect_timeout()->set_seconds(5);
      c.set_lb_policy(envoy::config::cluster::v3::Cluster::ROUND_ROBIN);
      return pack(c);
    }
    case XdsType::kEndpoint:
      return build_cla(st, port, ctx, cluster_name(key, port, ctx.zone));
    case XdsType::kUnknown:
      break;
  }
  return {};
}

}  // namespace endpointd::feed
