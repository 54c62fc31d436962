// The routing rule, case by case: conditions, the all-terminating fallback, node-local scope,
// topology hints, and each consumer's view of one endpoint.
#include "model/routing.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace endpointd::model {
namespace {

IpAddr ip(const char* s) {
  return *IpAddr::parse(s);
}

struct Cond {
  bool ready, serving, terminating;
};

TEST(RoutingOf, EveryCombinationOfConditions) {
  struct Row {
    Cond c;
    bool publish_not_ready;
    Routing want;
  };
  const std::vector<Row> rows = {
      // ready serving terminating | publishNotReadyAddresses | routing
      {{true, true, false}, false, Routing::kReady},
      {{true, false, false}, false, Routing::kReady},
      {{false, true, false}, false, Routing::kNone},
      {{false, false, false}, false, Routing::kNone},
      {{true, true, true}, false, Routing::kFallback},
      {{false, true, true}, false, Routing::kFallback},
      {{true, false, true}, false, Routing::kNone},
      {{false, false, true}, false, Routing::kNone},
      {{true, true, false}, true, Routing::kReady},
      {{true, false, false}, true, Routing::kReady},
      {{false, true, false}, true, Routing::kReady},
      {{false, false, false}, true, Routing::kReady},
      // Terminating is never ready, publishNotReadyAddresses or not: stop-accepting comes first.
      {{true, true, true}, true, Routing::kFallback},
      {{false, true, true}, true, Routing::kFallback},
      {{true, false, true}, true, Routing::kNone},
      {{false, false, true}, true, Routing::kNone},
  };
  for (const auto& r : rows) {
    Service svc;
    svc.publish_not_ready_addresses = r.publish_not_ready;
    EndpointConditions c{r.c.ready, r.c.serving, r.c.terminating};
    EXPECT_EQ(routing_of(svc, c), r.want)
        << "ready=" << r.c.ready << " serving=" << r.c.serving << " terminating=" << r.c.terminating
        << " publishNotReady=" << r.publish_not_ready;
  }
}

struct Ep {
  const char* addr;
  Cond c;
  const char* node = "node-a";
  std::vector<std::string> zones = {};
  std::vector<std::string> nodes = {};
};

MergedEndpoint merged(const Ep& e) {
  MergedEndpoint m;
  m.address = ip(e.addr);
  m.conditions = {e.c.ready, e.c.serving, e.c.terminating};
  m.ports = {EndpointPort{"http", Protocol::kTCP, 8080, ""}};
  m.node_name = e.node;
  m.hint_zones = e.zones;
  m.hint_nodes = e.nodes;
  return m;
}

ServiceState state(const std::vector<Ep>& eps, Service svc = {}) {
  ServiceState st;
  svc.key = {"demo", "web"};
  if (svc.cluster_ips.empty() && !svc.headless) svc.cluster_ips = {ip("10.96.0.10")};
  ServicePort sp;
  sp.name = "http";
  sp.port = 80;
  sp.target_port_name = "http";
  svc.ports = {sp};
  st.service = svc;
  for (const auto& e : eps) st.endpoints.push_back(merged(e));
  return st;
}

// The addresses select_routed picks, in order.
std::vector<std::string> picked(const ServiceState& st, Scope scope, RoutingNode node) {
  std::vector<const MergedEndpoint*> eps;
  for (const auto& e : st.endpoints) eps.push_back(&e);
  std::vector<std::string> out;
  for (size_t i : select_routed(st.service, eps, scope, node)) out.push_back(eps[i]->address.str());
  return out;
}

using Addrs = std::vector<std::string>;
const Cond kReady{true, true, false};
const Cond kTerminatingServing{false, true, true};
const Cond kTerminatingGone{false, false, true};
const Cond kUnready{false, false, false};

TEST(SelectRouted, ReadyEndpointsWinOverFallbacks) {
  struct Row {
    const char* what;
    std::vector<Ep> eps;
    Addrs want;
  };
  const std::vector<Row> rows = {
      {"all ready", {{"10.0.0.1", kReady}, {"10.0.0.2", kReady}}, {"10.0.0.1", "10.0.0.2"}},
      {"one terminating", {{"10.0.0.1", kTerminatingServing}, {"10.0.0.2", kReady}}, {"10.0.0.2"}},
      {"all terminating: the serving ones as a last resort",
       {{"10.0.0.1", kTerminatingServing}, {"10.0.0.2", kTerminatingGone}},
       {"10.0.0.1"}},
      {"terminating and not serving: none", {{"10.0.0.1", kTerminatingGone}}, {}},
      {"unready is never a fallback",
       {{"10.0.0.1", kUnready}, {"10.0.0.2", kTerminatingServing}},
       {"10.0.0.2"}},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(picked(state(r.eps), Scope::kCluster, {"node-a", "zone-a"}), r.want) << r.what;
  }
}

TEST(SelectRouted, NodeLocalScopeKeepsThisNodesEndpointsAndItsOwnFallback) {
  auto st = state({{"10.0.0.1", kTerminatingServing, "node-a"},
                   {"10.0.0.2", kReady, "node-b"},
                   {"10.0.0.3", kUnready, "node-a"}});
  // Ready endpoints elsewhere do not count against this node's fallback.
  EXPECT_EQ(picked(st, Scope::kNodeLocal, {"node-a", ""}), Addrs{"10.0.0.1"});
  EXPECT_EQ(picked(st, Scope::kNodeLocal, {"node-b", ""}), Addrs{"10.0.0.2"});
  EXPECT_EQ(picked(st, Scope::kNodeLocal, {"node-c", ""}), Addrs{});
  EXPECT_EQ(picked(st, Scope::kCluster, {"node-a", ""}), Addrs{"10.0.0.2"});
}

TEST(SelectRouted, TopologyHintsNarrowTheReadySetOnlyWhenComplete) {
  Service close;
  close.traffic_distribution = "PreferClose";
  auto hinted = state({{"10.0.0.1", kReady, "node-a", {"zone-a"}},
                       {"10.0.0.2", kReady, "node-b", {"zone-b"}},
                       {"10.0.0.3", kReady, "node-c", {"zone-a"}}},
                      close);
  EXPECT_EQ(picked(hinted, Scope::kCluster, {"node-a", "zone-a"}), (Addrs{"10.0.0.1", "10.0.0.3"}));
  EXPECT_EQ(picked(hinted, Scope::kCluster, {"node-b", "zone-b"}), Addrs{"10.0.0.2"});
  // No endpoint hinted for this zone: all of them.
  EXPECT_EQ(picked(hinted, Scope::kCluster, {"node-d", "zone-d"}).size(), 3u);
  // A zone unknown to the node: all of them.
  EXPECT_EQ(picked(hinted, Scope::kCluster, {"node-a", ""}).size(), 3u);
  // The feed's view ignores hints.
  EXPECT_EQ(picked(hinted, Scope::kUnhinted, {"node-a", "zone-a"}).size(), 3u);
  // One ready endpoint without hints: the slice is half-rewritten, hints are ignored.
  auto partial =
      state({{"10.0.0.1", kReady, "node-a", {"zone-a"}}, {"10.0.0.2", kReady, "node-b"}}, close);
  EXPECT_EQ(picked(partial, Scope::kCluster, {"node-a", "zone-a"}).size(), 2u);
  // The hints decide, not the service's field (kube-proxy's topologyModeFromHints): hinted
  // slices of a service that no longer asks are still followed until the controller drops
  // their hints.
  auto plain = state(
      {{"10.0.0.1", kReady, "node-a", {"zone-a"}}, {"10.0.0.2", kReady, "node-b", {"zone-b"}}});
  EXPECT_EQ(picked(plain, Scope::kCluster, {"node-a", "zone-a"}), Addrs{"10.0.0.1"});
  // Hints never pick a fallback over a ready endpoint.
  auto mixed = state({{"10.0.0.1", kTerminatingServing, "node-a", {"zone-a"}},
                      {"10.0.0.2", kReady, "node-b", {"zone-b"}}},
                     close);
  EXPECT_EQ(picked(mixed, Scope::kCluster, {"node-a", "zone-a"}), Addrs{"10.0.0.2"});
}

TEST(SelectRouted, PreferSameNodeUsesNodeHintsThenZoneHints) {
  Service same_node;
  same_node.traffic_distribution = "PreferSameNode";
  auto st = state({{"10.0.0.1", kReady, "node-a", {"zone-a"}, {"node-a"}},
                   {"10.0.0.2", kReady, "node-b", {"zone-a"}, {"node-b"}},
                   {"10.0.0.3", kReady, "node-c", {"zone-b"}, {"node-c"}}},
                  same_node);
  EXPECT_EQ(picked(st, Scope::kCluster, {"node-a", "zone-a"}), Addrs{"10.0.0.1"});
  // No endpoint for this node: the zone's.
  EXPECT_EQ(picked(st, Scope::kCluster, {"node-x", "zone-a"}), (Addrs{"10.0.0.1", "10.0.0.2"}));
  Service same_zone;
  same_zone.traffic_distribution = "PreferSameZone";
  auto zonal = state({{"10.0.0.1", kReady, "node-a", {"zone-a"}, {"node-a"}},
                      {"10.0.0.2", kReady, "node-b", {"zone-b"}, {"node-b"}}},
                     same_zone);
  EXPECT_EQ(picked(zonal, Scope::kCluster, {"node-a", "zone-a"}), Addrs{"10.0.0.1"});
  Service annotated;
  annotated.topology_mode = "Auto";
  EXPECT_TRUE(prefers_close(annotated));
  EXPECT_FALSE(prefers_same_node(annotated));
}

TEST(SelectRouted, PublishNotReadyAddressesRoutesUnreadyButNotTerminating) {
  Service pnr;
  pnr.publish_not_ready_addresses = true;
  auto st = state({{"10.0.0.1", kUnready}, {"10.0.0.2", kTerminatingGone}}, pnr);
  EXPECT_EQ(picked(st, Scope::kCluster, {"node-a", ""}), Addrs{"10.0.0.1"});
}

// What the feed sends per endpoint of a port: the rule in kUnhinted scope, per family.
TEST(PortVerdicts, RoutedFallbackDrainingAndNotRoutedPerFamily) {
  using V = std::vector<PortVerdict>;
  auto verdicts = [](const ServiceState& st) { return port_verdicts(st, st.service.ports[0]); };
  // One ready: the terminating serving one drains, the others get nothing.
  EXPECT_EQ(verdicts(state({{"10.0.0.1", kReady},
                            {"10.0.0.2", kTerminatingServing},
                            {"10.0.0.3", kTerminatingGone},
                            {"10.0.0.4", kUnready}})),
            (V{PortVerdict::kRouted, PortVerdict::kDraining, PortVerdict::kNotRouted,
               PortVerdict::kNotRouted}));
  // None ready: the serving terminating one is the fallback.
  EXPECT_EQ(verdicts(state({{"10.0.0.1", kTerminatingServing}, {"10.0.0.2", kTerminatingGone}})),
            (V{PortVerdict::kFallback, PortVerdict::kNotRouted}));
  // Per family: a ready IPv4 endpoint does not stop the IPv6 fallback.
  EXPECT_EQ(verdicts(state({{"10.0.0.1", kReady}, {"fd00::1", kTerminatingServing}})),
            (V{PortVerdict::kRouted, PortVerdict::kFallback}));
  // publishNotReadyAddresses: an unready endpoint is routed, a terminating one still is not.
  Service pub;
  pub.publish_not_ready_addresses = true;
  EXPECT_EQ(verdicts(state({{"10.0.0.1", kUnready}, {"10.0.0.2", kTerminatingServing}}, pub)),
            (V{PortVerdict::kRouted, PortVerdict::kDraining}));
  // No hints in this scope: a hint for another node changes nothing.
  EXPECT_EQ(verdicts(state({{"10.0.0.1", kReady, "node-a", {}, {"node-b"}},
                            {"10.0.0.2", kReady, "node-b", {}, {"node-b"}}})),
            (V{PortVerdict::kRouted, PortVerdict::kRouted}));
  // A loopback endpoint is a subscriber's to connect to (not the dataplane's); an unspecified
  // one is nobody's.
  EXPECT_EQ(verdicts(state({{"127.0.0.1", kReady}, {"0.0.0.0", kReady}})),
            (V{PortVerdict::kRouted, PortVerdict::kNotRouted}));
  // Port 0: nothing.
  ServiceState zero = state({{"10.0.0.1", kReady}});
  zero.service.ports[0].port = 0;
  EXPECT_EQ(port_verdicts(zero, zero.service.ports[0]), (V{PortVerdict::kNotRouted}));
}

// The feed's verdicts agree with feed_routes_to, which drain asks of the feed's applied state.
TEST(PortVerdicts, AgreeWithFeedRoutesTo) {
  for (const auto& st :
       {state({{"10.0.0.1", kReady}, {"10.0.0.2", kTerminatingServing}}),
        state({{"10.0.0.1", kTerminatingServing}, {"10.0.0.2", kUnready}}),
        state({{"10.0.0.1", kTerminatingGone}, {"fd00::2", kTerminatingServing}})}) {
    auto v = port_verdicts(st, st.service.ports[0]);
    for (size_t i = 0; i < st.endpoints.size(); ++i) {
      bool routed = v[i] == PortVerdict::kRouted || v[i] == PortVerdict::kFallback;
      EXPECT_EQ(routed, feed_routes_to(st, st.endpoints[i], {})) << st.endpoints[i].address.str();
    }
  }
}

TEST(BackendPort, NeedsARoutableAddressAndANonZeroPort) {
  ServicePort sp;
  sp.name = "http";
  sp.port = 80;
  EXPECT_EQ(backend_port(merged({"10.0.0.1", kReady}), sp), 8080);
  EXPECT_FALSE(backend_port(merged({"127.0.0.1", kReady}), sp));
  EXPECT_FALSE(backend_port(merged({"0.0.0.0", kReady}), sp));
  sp.name = "other";  // no endpoint port of that name
  EXPECT_FALSE(backend_port(merged({"10.0.0.1", kReady}), sp));
}

TEST(RoutesTo, EachConsumersViewOfOneEndpoint) {
  struct Row {
    const char* what;
    ServiceState st;
    const char* addr;
    RoutingNode node;
    bool dataplane, feed, dns;
  };
  Service headless;
  headless.headless = true;
  Service external;
  external.type = ServiceType::kExternalName;
  external.external_name = "example.invalid";
  Service other_proxy;
  other_proxy.service_proxy_name = "someone-else";
  Service local;
  local.internal_traffic_policy = TrafficPolicy::kLocal;
  const std::vector<Row> rows = {
      {"ready", state({{"10.0.0.1", kReady}}), "10.0.0.1", {"node-a", ""}, true, true, false},
      {"terminating beside a ready one",
       state({{"10.0.0.1", kTerminatingServing}, {"10.0.0.2", kReady, "node-b"}}),
       "10.0.0.1",
       {"node-a", ""},
       false,
       false,
       false},
      {"terminating alone: fallback",
       state({{"10.0.0.1", kTerminatingServing}}),
       "10.0.0.1",
       {"node-a", ""},
       true,
       true,
       false},
      {"terminating, local to a node with no other local endpoint (node-local scope)",
       state({{"10.0.0.1", kTerminatingServing, "node-a"}, {"10.0.0.2", kReady, "node-b"}}, local),
       "10.0.0.1",
       {"node-a", ""},
       true,
       false,
       false},
      {"the same seen from another node",
       state({{"10.0.0.1", kTerminatingServing, "node-a"}, {"10.0.0.2", kReady, "node-b"}}, local),
       "10.0.0.1",
       {"node-b", ""},
       false,
       false,
       false},
      {"headless: DNS answers, no rules",
       state({{"10.0.0.1", kReady}}, headless),
       "10.0.0.1",
       {"node-a", ""},
       false,
       true,
       true},
      {"headless terminating: DNS drops it at once",
       state({{"10.0.0.1", kTerminatingServing}}, headless),
       "10.0.0.1",
       {"node-a", ""},
       false,
       true,
       false},
      {"ExternalName: nothing",
       state({{"10.0.0.1", kReady}}, external),
       "10.0.0.1",
       {"node-a", ""},
       false,
       true,
       false},
      {"another proxy's service: no rules of endpointd's",
       state({{"10.0.0.1", kReady}}, other_proxy),
       "10.0.0.1",
       {"node-a", ""},
       false,
       true,
       false},
      {"an address the service does not have",
       state({{"10.0.0.1", kReady}}),
       "10.0.0.9",
       {"node-a", ""},
       false,
       false,
       false},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(routes_to(RouteView::kDataplane, r.st, ip(r.addr), r.node), r.dataplane) << r.what;
    EXPECT_EQ(routes_to(RouteView::kFeed, r.st, ip(r.addr), r.node), r.feed) << r.what;
    EXPECT_EQ(routes_to(RouteView::kDns, r.st, ip(r.addr), r.node), r.dns) << r.what;
  }
}

TEST(RoutesTo, AnUnsyncedSnapshotRoutesToEverything) {
  Snapshot unsynced;
  EXPECT_TRUE(routes_to(RouteView::kDataplane, unsynced, ip("10.0.0.1"), {"node-a", ""}));
  Snapshot synced;
  synced.synced = true;
  EXPECT_FALSE(routes_to(RouteView::kDataplane, synced, ip("10.0.0.1"), {"node-a", ""}));
}

}  // namespace
}  // namespace endpointd::model
