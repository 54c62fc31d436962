// xDS names and resources built from model values.
#include <gtest/gtest.h>

#include "envoy/config/cluster/v3/cluster.pb.h"
#include "envoy/config/endpoint/v3/endpoint.pb.h"
#include "envoy/config/listener/v3/listener.pb.h"
#include "envoy/config/route/v3/route.pb.h"
#include "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.pb.h"
#include "feed/resources.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

using testing::Ep;
using testing::service;

TEST(XdsNames, ListenerAndClusterNamesRoundTrip) {
  model::ServiceKey k{"default", "web"};
  EXPECT_EQ(listener_name(k, 80, "cluster.local"), "web.default.svc.cluster.local:80");
  EXPECT_EQ(cluster_name(k, 80, "cluster.local"), "outbound|80||web.default.svc.cluster.local");
  auto l =
      parse_resource_name(XdsType::kListener, "web.default.svc.cluster.local:80", "cluster.local");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->key, k);
  EXPECT_EQ(l->port, 80);
  auto c = parse_resource_name(XdsType::kEndpoint, "outbound|443||web.default.svc.cluster.local",
                               "cluster.local");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->key, k);
  EXPECT_EQ(c->port, 443);
  for (const char* bad : {"web.default.svc.cluster.local", "web.default.svc.other.zone:80",
                          "web.default.svc.cluster.local:0", "web.default.svc.cluster.local:99999",
                          ".default.svc.cluster.local:80", "a.b.c.svc.cluster.local:80", ""})
    EXPECT_FALSE(parse_resource_name(XdsType::kListener, bad, "cluster.local")) << bad;
  EXPECT_FALSE(
      parse_resource_name(XdsType::kCluster, "web.default.svc.cluster.local:80", "cluster.local"));
}

TEST(XdsResources, TypeUrlsAreEnvoys) {
  auto l = build_resource(XdsType::kListener, {{"default", "web"}, 80}, nullptr, {});
  EXPECT_EQ(l.type_url(), "type.googleapis.com/envoy.config.listener.v3.Listener");
  envoy::config::listener::v3::Listener listener;
  ASSERT_TRUE(l.UnpackTo(&listener));
  EXPECT_EQ(listener.name(), "web.default.svc.cluster.local:80");
  EXPECT_EQ(listener.api_listener().api_listener().type_url(),
            "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager");
  envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager hcm;
  ASSERT_TRUE(listener.api_listener().api_listener().UnpackTo(&hcm));
  EXPECT_TRUE(hcm.rds().config_source().has_ads());
  EXPECT_EQ(hcm.rds().route_config_name(), "web.default.svc.cluster.local:80");
  ASSERT_EQ(hcm.http_filters_size(), 1);
  EXPECT_EQ(hcm.http_filters(0).typed_config().type_url(),
            "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router");

  auto r = build_resource(XdsType::kRoute, {{"default", "web"}, 80}, nullptr, {});
  EXPECT_EQ(r.type_url(), "type.googleapis.com/envoy.config.route.v3.RouteConfiguration");
  envoy::config::route::v3::RouteConfiguration rc;
  ASSERT_TRUE(r.UnpackTo(&rc));
  EXPECT_EQ(rc.virtual_hosts(0).routes(0).route().cluster(),
            "outbound|80||web.default.svc.cluster.local");

  auto c = build_resource(XdsType::kCluster, {{"default", "web"}, 80}, nullptr, {});
  EXPECT_EQ(c.type_url(), "type.googleapis.com/envoy.config.cluster.v3.Cluster");
  envoy::config::cluster::v3::Cluster cl;
  ASSERT_TRUE(c.UnpackTo(&cl));
  EXPECT_EQ(cl.type(), envoy::config::cluster::v3::Cluster::EDS);
  EXPECT_TRUE(cl.eds_cluster_config().eds_config().has_ads());
  EXPECT_EQ(cl.eds_cluster_config().service_name(), "outbound|80||web.default.svc.cluster.local");
  EXPECT_EQ(cl.lb_policy(), envoy::config::cluster::v3::Cluster::ROUND_ROBIN);
}

TEST(XdsResources, EndpointsGroupedByZoneWithWeightsAndDraining) {
  auto st = service(
      "default", "web",
      {{.ip = "10.0.0.1"},
       {.ip = "10.0.0.2"},
       {.ip = "10.0.0.3", .zone = "zone-b"},
       {.ip = "10.0.0.4", .ready = false, .serving = true, .terminating = true, .zone = "zone-b"},
       {.ip = "10.0.0.5", .ready = false, .serving = false}});
  auto any = build_resource(XdsType::kEndpoint, {{"default", "web"}, 80}, st.get(), {});
  EXPECT_EQ(any.type_url(), "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment");
  envoy::config::endpoint::v3::ClusterLoadAssignment cla;
  ASSERT_TRUE(any.UnpackTo(&cla));
  EXPECT_EQ(cla.cluster_name(), "outbound|80||web.default.svc.cluster.local");
  ASSERT_EQ(cla.endpoints_size(), 2);
  const auto& a = cla.endpoints(0);
  EXPECT_EQ(a.locality().zone(), "zone-a");
  EXPECT_EQ(a.load_balancing_weight().value(), 2u);  // two healthy; the unready one counts not
  EXPECT_EQ(a.priority(), 0u);
  ASSERT_EQ(a.lb_endpoints_size(), 3);
  EXPECT_EQ(a.lb_endpoints(0).endpoint().address().socket_address().address(), "10.0.0.1");
  EXPECT_EQ(a.lb_endpoints(0).endpoint().address().socket_address().port_value(), 8080u);
  EXPECT_EQ(a.lb_endpoints(0).health_status(), envoy::config::core::v3::HEALTHY);
  EXPECT_EQ(a.lb_endpoints(2).health_status(), envoy::config::core::v3::UNHEALTHY);
  const auto& b = cla.endpoints(1);
  EXPECT_EQ(b.locality().zone(), "zone-b");
  EXPECT_EQ(b.load_balancing_weight().value(), 1u);
  EXPECT_EQ(b.lb_endpoints(1).health_status(), envoy::config::core::v3::DRAINING);
}

TEST(XdsResources, PreferCloseMakesOtherZonesAFailoverPriority) {
  auto st = std::const_pointer_cast<model::ServiceState>(
      service("default", "web", {{.ip = "10.0.0.1"}, {.ip = "10.0.0.2", .zone = "zone-b"}}));
  st->service.traffic_distribution = "PreferClose";
  XdsContext ctx;
  ctx.client_zone = "zone-b";
  envoy::config::endpoint::v3::ClusterLoadAssignment cla;
  ASSERT_TRUE(
      build_resource(XdsType::kEndpoint, {{"default", "web"}, 80}, st.get(), ctx).UnpackTo(&cla));
  ASSERT_EQ(cla.endpoints_size(), 2);
  EXPECT_EQ(cla.endpoints(0).priority(), 1u);  // zone-a
  EXPECT_EQ(cla.endpoints(1).priority(), 0u);  // zone-b, the client's
}

// The feed serves another proxy's services too (only the dataplane leaves them to it).
TEST(XdsResources, AnotherProxysServiceStillHasItsEndpoints) {
  auto st = std::const_pointer_cast<model::ServiceState>(
      service("default", "web", {{.ip = "10.0.0.1"}, {.ip = "10.0.0.2"}}));
  st->service.service_proxy_name = "someone-else";
  envoy::config::endpoint::v3::ClusterLoadAssignment cla;
  ASSERT_TRUE(
      build_resource(XdsType::kEndpoint, {{"default", "web"}, 80}, st.get(), {}).UnpackTo(&cla));
  ASSERT_EQ(cla.endpoints_size(), 1);
  EXPECT_EQ(cla.endpoints(0).lb_endpoints_size(), 2);
}

TEST(XdsResources, MissingServiceIsAnEmptyAssignment) {
  envoy::config::endpoint::v3::ClusterLoadAssignment cla;
  ASSERT_TRUE(
      build_resource(XdsType::kEndpoint, {{"default", "gone"}, 80}, nullptr, {}).UnpackTo(&cla));
  EXPECT_EQ(cla.cluster_name(), "outbound|80||gone.default.svc.cluster.local");
  EXPECT_EQ(cla.endpoints_size(), 0);
}

TEST(Selection, MatchesAndCarriesPorts) {
  v1::Subscribe s;
  auto* a = s.add_selectors();
  a->set_namespace_("default");
  a->set_name("web");
  a->set_port(80);
  s.add_selectors()->set_namespace_("other");
  auto sel = Selection::from(s);
  ASSERT_TRUE(sel);
  EXPECT_FALSE(sel->exact_only());
  EXPECT_TRUE(sel->matches({"default", "web"}));
  EXPECT_FALSE(sel->matches({"default", "api"}));
  EXPECT_TRUE(sel->matches({"other", "x"}));
  EXPECT_TRUE(sel->carries_port({"default", "web"}, 80));
  EXPECT_FALSE(sel->carries_port({"default", "web"}, 443));
  EXPECT_TRUE(sel->carries_port({"other", "x"}, 443));
  s.add_selectors()->set_name("nons");
  auto bad = Selection::from(s);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(), "selector without a namespace");
}

}  // namespace
}  // namespace endpointd::feed
