// Decoding API objects: every field endpointd reads, and every kind of bad input refused with
// a reason that names the object.
#include "watcher/decode.h"

#include <gtest/gtest.h>

namespace endpointd::watcher {
namespace {

using model::ObjectKind;

TEST(Decode, ServiceWithEverything) {
  auto d = decode_json(R"({
    "kind":"Service","apiVersion":"v1",
    "metadata":{"name":"web","namespace":"prod","uid":"u1","resourceVersion":"42",
                "annotations":{"service.kubernetes.io/topology-mode":"Auto"}},
    "spec":{"type":"LoadBalancer","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10","fd00::10"],
            "ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":"web","nodePort":30080},
                     {"name":"dns","protocol":"UDP","port":53,"targetPort":5353}],
            "externalIPs":["192.0.2.7"],"loadBalancerSourceRanges":[" 203.0.113.0/24 "],
            "sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":60}},
            "internalTrafficPolicy":"Local","externalTrafficPolicy":"Local",
            "healthCheckNodePort":32000,"publishNotReadyAddresses":true,
            "trafficDistribution":"PreferClose"},
    "status":{"loadBalancer":{"ingress":[{"ip":"198.51.100.1"},{"ip":"198.51.100.2","ipMode":"Proxy"}]}}})");
  ASSERT_TRUE(d) << d.error();
  EXPECT_TRUE(d->warnings.empty());
  const auto& s = std::get<model::Service>(d->object);
  EXPECT_EQ(s.key.str(), "prod/web");
  EXPECT_EQ(s.type, model::ServiceType::kLoadBalancer);
  ASSERT_EQ(s.cluster_ips.size(), 2u);
  EXPECT_TRUE(s.cluster_ips[1].is_v6());
  ASSERT_EQ(s.ports.size(), 2u);
  EXPECT_EQ(s.ports[0].target_port_name, "web");
  EXPECT_EQ(s.ports[0].node_port, 30080);
  EXPECT_EQ(s.ports[1].protocol, model::Protocol::kUDP);
  EXPECT_EQ(s.ports[1].target_port_number, 5353);
  EXPECT_EQ(s.external_ips.size(), 1u);
  EXPECT_EQ(s.load_balancer_source_ranges[0].str(), "203.0.113.0/24");
  EXPECT_TRUE(s.session_affinity_client_ip);
  EXPECT_EQ(s.session_affinity_timeout_seconds, 60u);
  EXPECT_EQ(s.internal_traffic_policy, model::TrafficPolicy::kLocal);
  EXPECT_EQ(s.external_traffic_policy, model::TrafficPolicy::kLocal);
  EXPECT_EQ(s.health_check_node_port, 32000);
  EXPECT_TRUE(s.publish_not_ready_addresses);
  EXPECT_EQ(s.traffic_distribution, "PreferClose");
  EXPECT_EQ(s.topology_mode, "Auto");
  ASSERT_EQ(s.load_balancer_ips.size(), 1u);  // ipMode Proxy is not delivered to the VIP
  EXPECT_EQ(s.load_balancer_ips[0].str(), "198.51.100.1");
}

TEST(Decode, HeadlessAndExternalName) {
  auto h =
      decode_json(R"({"kind":"Service","metadata":{"name":"db"},"spec":{"clusterIP":"None"}})");
  ASSERT_TRUE(h) << h.error();
  const auto& hs = std::get<model::Service>(h->object);
  EXPECT_TRUE(hs.headless);
  EXPECT_TRUE(hs.cluster_ips.empty());
  EXPECT_EQ(hs.key.ns, "default");
  auto e = decode_json(R"({"kind":"Service","metadata":{"name":"x","namespace":"a"},
                           "spec":{"type":"ExternalName","externalName":"example.org"}})");
  ASSERT_TRUE(e) << e.error();
  EXPECT_EQ(std::get<model::Service>(e->object).external_name, "example.org");
}

TEST(Decode, EndpointSliceConditionsDefaultAsKubernetesSays) {
  auto d = decode_json(R"({"kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"a",
      "labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4",
      "ports":[{"name":"http","port":8080},{"name":"all"}],
      "endpoints":[
        {"addresses":["10.0.0.1"]},
        {"addresses":["10.0.0.2"],"conditions":{"ready":false,"serving":true,"terminating":true},
         "hostname":"h2","nodeName":"n1","zone":"z1","hints":{"forZones":[{"name":"z1"}],"forNodes":[{"name":"n1"}]},
         "targetRef":{"kind":"Pod","namespace":"a","name":"web-2","uid":"p2"}}]})");
  ASSERT_TRUE(d) << d.error();
  const auto& s = std::get<model::EndpointSlice>(d->object);
  EXPECT_EQ(s.service_name, "web");
  ASSERT_EQ(s.ports.size(), 1u);  // the port with no number is dropped
  EXPECT_EQ(s.ports[0].protocol, model::Protocol::kTCP);
  ASSERT_EQ(s.endpoints.size(), 2u);
  EXPECT_EQ(s.endpoints[0].conditions, (model::EndpointConditions{true, true, false}));
  EXPECT_EQ(s.endpoints[1].conditions, (model::EndpointConditions{false, true, true}));
  EXPECT_EQ(s.endpoints[1].hint_zones, std::vector<std::string>{"z1"});
  EXPECT_EQ(s.endpoints[1].hint_nodes, std::vector<std::string>{"n1"});
  ASSERT_TRUE(s.endpoints[1].target_ref);
  EXPECT_EQ(s.endpoints[1].target_ref->uid, "p2");
  EXPECT_EQ(s.trigger_time, std::chrono::system_clock::time_point{});  // no annotation
}

TEST(Decode, EndpointSliceTriggerTime) {
  auto d = decode_json(R"({"kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"a",
      "labels":{"kubernetes.io/service-name":"web"},
      "annotations":{"endpoints.kubernetes.io/last-change-trigger-time":"2026-11-25T21:00:00Z"}},
      "addressType":"IPv4","endpoints":[]})");
  ASSERT_TRUE(d) << d.error();
  EXPECT_EQ(
      std::chrono::system_clock::to_time_t(std::get<model::EndpointSlice>(d->object).trigger_time),
      1795640400);
  // A trigger time that does not parse only loses the metric's start.
  auto bad = decode_json(R"({"kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"a",
      "labels":{"kubernetes.io/service-name":"web"},
      "annotations":{"endpoints.kubernetes.io/last-change-trigger-time":"soon"}},
      "addressType":"IPv4","endpoints":[]})");
  ASSERT_TRUE(bad) << bad.error();
  EXPECT_EQ(std::get<model::EndpointSlice>(bad->object).trigger_time,
            std::chrono::system_clock::time_point{});
}

TEST(Decode, NodeAndPod) {
  auto n = decode_json(
      R"({"kind":"Node","metadata":{"name":"n1","labels":{"topology.kubernetes.io/zone":"z"}},
      "spec":{"podCIDRs":["10.244.1.0/24"]},
      "status":{"addresses":[{"type":"InternalIP","address":"192.168.1.2"},{"type":"Hostname","address":"n1"}]}})");
  ASSERT_TRUE(n) << n.error();
  const auto& node = std::get<model::Node>(n->object);
  EXPECT_EQ(node.zone, "z");
  ASSERT_EQ(node.internal_ips().size(), 1u);
  EXPECT_EQ(node.pod_cidrs[0].str(), "10.244.1.0/24");
  EXPECT_FALSE(node.deleting);
  EXPECT_TRUE(node.eligible());
  auto marked = decode_json(R"({"kind":"Node","metadata":{"name":"n2"},
      "spec":{"taints":[{"key":"ToBeDeletedByClusterAutoscaler","value":"1","effect":"NoSchedule"}]}})");
  ASSERT_TRUE(marked) << marked.error();
  EXPECT_EQ(std::get<model::Node>(marked->object).taint_keys,
            std::vector<std::string>{"ToBeDeletedByClusterAutoscaler"});
  EXPECT_FALSE(std::get<model::Node>(marked->object).eligible());
  auto going = decode_json(
      R"({"kind":"Node","metadata":{"name":"n3","deletionTimestamp":"2026-01-01T00:00:00Z"}})");
  ASSERT_TRUE(going) << going.error();
  EXPECT_TRUE(std::get<model::Node>(going->object).deleting);
  auto p = decode_json(R"({"kind":"Pod","metadata":{"name":"web-1","namespace":"a","uid":"u",
      "deletionTimestamp":"2026-01-01T00:00:00Z","annotations":{"k":"v"}},
      "spec":{"nodeName":"n1","terminationGracePeriodSeconds":45},
      "status":{"phase":"Running","podIPs":[{"ip":"10.244.1.5"},{"ip":"fd00::5"}]}})");
  ASSERT_TRUE(p) << p.error();
  const auto& pod = std::get<model::Pod>(p->object);
  EXPECT_TRUE(pod.terminating);
  EXPECT_EQ(pod.termination_grace_period_seconds, 45);
  EXPECT_EQ(pod.pod_ips.size(), 2u);
  EXPECT_EQ(pod.node_name, "n1");
}

struct BadCase {
  const char* json;
  const char* must_mention;
};

TEST(Decode, BadInputIsRefusedWithAReasonNamingTheObject) {
  const BadCase cases[] = {
      {R"({"kind":"Service","metadata":{"name":"a","namespace":"n"},"spec":{"clusterIP":"10.0.0.300"}})",
       "Service n/a: spec.clusterIPs: invalid IP address \"10.0.0.300\""},
      {R"({"kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":70000}]}})",
       "port 70000 out of range"},
      {R"({"kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":0}]}})",
       "port 0 out of range"},
      {R"({"kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":80,"protocol":"ICMP"}]}})",
       "unknown protocol \"ICMP\""},
      {R"({"kind":"Service","metadata":{"name":"a"},"spec":{"type":"Bogus"}})",
       "unknown service type"},
      {R"({"kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":"80"}]}})",
       "expected an integer"},
      {R"({"kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"name":"x","port":80},{"name":"x","port":81}]}})",
       "duplicate port name"},
      {R"({"kind":"Service","metadata":{"name":"a"},"spec":{"type":"ExternalName"}})",
       "externalName missing"},
      {R"({"kind":"Service","metadata":{},"spec":{}})", "metadata.name missing"},
      {R"({"kind":"Service","metadata":{"name":"a"}})", "spec missing"},
      {R"({"kind":"EndpointSlice","metadata":{"name":"s","namespace":"n"},"addressType":"IPv4",
           "endpoints":[{"addresses":["fd00::1"]}]})",
       "EndpointSlice n/s: endpoints[0].addresses: \"fd00::1\" is not an IPv4 address"},
      {R"({"kind":"EndpointSlice","metadata":{"name":"s"},"addressType":"IPv4","endpoints":[{"addresses":[]}]})",
       "endpoints[0].addresses: empty"},
      {R"({"kind":"EndpointSlice","metadata":{"name":"s"},"addressType":"IPv4","ports":[{"port":99999}]})",
       "out of range"},
      {R"({"kind":"EndpointSlice","metadata":{"name":"s"},"addressType":"IPv5"})", "addressType"},
      {R"({"kind":"EndpointSlice","metadata":{"name":"s"},"addressType":"IPv4",
           "endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":"yes"}}]})",
       "expected true or false"},
      {R"({"kind":"Widget","metadata":{"name":"w"}})", "unsupported kind \"Widget\""},
      {R"({"metadata":{"name":"w"}})", "kind missing"},
      {R"({"kind":"Service",)", "malformed JSON"},
      {R"([1,2,3])", "kind missing"},
  };
  for (const auto& c : cases) {
    auto d = decode_json(c.json);
    ASSERT_FALSE(d) << c.json;
    EXPECT_NE(d.error().find(c.must_mention), std::string::npos)
        << "error \"" << d.error() << "\" lacks \"" << c.must_mention << "\"";
  }
}

// A failure inside a list item names the item (its path is written only when one fails).
TEST(Decode, ErrorsNameTheListItem) {
  auto slice = decode_json(R"({"kind":"EndpointSlice","metadata":{"name":"s","namespace":"n"},
      "addressType":"IPv4","ports":[{"name":"a","port":80},{"name":"b","port":0}],
      "endpoints":[{"addresses":["10.0.0.1"]}]})");
  ASSERT_FALSE(slice);
  EXPECT_NE(slice.error().find("EndpointSlice n/s: ports[1].port: port 0 out of range"),
            std::string::npos)
      << slice.error();
  auto ep = decode_json(R"({"kind":"EndpointSlice","metadata":{"name":"s","namespace":"n"},
      "addressType":"IPv4","endpoints":[{"addresses":["10.0.0.1"]},{"addresses":["10.0.0.2"]},
      {"addresses":["10.0.0.3"],"targetRef":{"name":7}}]})");
  ASSERT_FALSE(ep);
  EXPECT_NE(ep.error().find("endpoints[2].targetRef.name: expected a string"), std::string::npos)
      << ep.error();
  auto svc = decode_json(R"({"kind":"Service","metadata":{"name":"a","namespace":"n"},
      "spec":{"ports":[{"name":"a","port":80},{"name":"b","port":81,"targetPort":"a-name-too-long-here"}]}})");
  ASSERT_FALSE(svc);
  EXPECT_NE(svc.error().find("spec.ports[1].targetPort: invalid port name"), std::string::npos)
      << svc.error();
}

// An endpoint's fields are read in one pass: a repeated key counts with its first value (as a
// lookup by name finds it), unknown keys are warnings naming the endpoint.
TEST(Decode, EndpointFieldsInOnePass) {
  auto d = decode_json(R"({"kind":"EndpointSlice","metadata":{"name":"s","namespace":"n",
      "labels":{"kubernetes.io/service-name":"web","other":"x"}},"addressType":"IPv4",
      "endpoints":[{"addresses":["10.0.0.1"]},
                   {"nodeName":"n1","addresses":["10.0.0.2"],"nodeName":"n2","zone":null,
                    "deprecatedTopology":{},"colour":"blue","conditions":{"ready":false}}]})");
  ASSERT_TRUE(d) << d.error();
  const auto& s = std::get<model::EndpointSlice>(d->object);
  EXPECT_EQ(s.service_name, "web");
  ASSERT_EQ(s.endpoints.size(), 2u);
  EXPECT_EQ(s.endpoints[1].node_name, "n1");
  EXPECT_EQ(s.endpoints[1].zone, "");
  EXPECT_FALSE(s.endpoints[1].conditions.ready);
  EXPECT_TRUE(s.endpoints[0].conditions.ready);
  ASSERT_EQ(d->warnings.size(), 1u);
  EXPECT_NE(d->warnings[0].find("endpoints[1]: unknown field \"colour\""), std::string::npos)
      << d->warnings[0];
}

// A body with padding after it is parsed in place; only `json`'s bytes count.
TEST(Decode, ListParsedInPlaceWhenPadded) {
  std::string body = R"({"kind":"ServiceList","metadata":{"resourceVersion":"5"},"items":[
      {"metadata":{"name":"a","namespace":"n"},"spec":{"clusterIP":"10.96.0.1"}}]})";
  const size_t n = body.size();
  body.append(kJsonPadding, 'x');  // not JSON: must not be read as part of the list
  auto l = decode_list(std::string_view(body.data(), n), ObjectKind::kService, true);
  ASSERT_TRUE(l) << l.error();
  EXPECT_EQ(l->resource_version, "5");
  ASSERT_EQ(l->objects.size(), 1u);
  EXPECT_EQ(std::get<model::Service>(l->objects[0]).key.name, "a");
}

// The next page's request needs only the metadata: read without the items, wherever it is.
TEST(Decode, ListMetaIsPeekedWithoutTheItems) {
  auto peek = [](std::string body) {
    const size_t n = body.size();
    body.append(kJsonPadding, 'x');
    return peek_list_meta(std::string_view(body.data(), n));
  };
  auto m = peek(R"({"kind":"ServiceList","metadata":{"resourceVersion":"5","continue":"t:1",
      "remainingItemCount":3},"items":[{"metadata":{"name":"a"}}]})");
  ASSERT_TRUE(m) << m.error();
  EXPECT_EQ(m->resource_version, "5");
  EXPECT_EQ(m->continue_token, "t:1");
  // The last page: no continue; metadata after the items is found too.
  m = peek(
      R"({"items":[{"metadata":{"name":"a","continue":"no"}}],"metadata":{"resourceVersion":"6"}})");
  ASSERT_TRUE(m) << m.error();
  EXPECT_EQ(m->resource_version, "6");
  EXPECT_EQ(m->continue_token, "");
  // A value that is no string is read as decode_list reads it: none.
  m = peek(R"({"metadata":{"resourceVersion":7,"continue":null},"items":[]})");
  ASSERT_TRUE(m) << m.error();
  EXPECT_EQ(m->resource_version, "");
  EXPECT_EQ(m->continue_token, "");
  EXPECT_FALSE(peek(R"({"metadata":{"resourceVersion":"5",)"));
  EXPECT_FALSE(peek(R"([1,2])"));
  EXPECT_FALSE(peek(R"({"metadata":[]})"));
}

TEST(Decode, OversizedObjectRefusedBeforeParsing) {
  std::string big = R"({"kind":"Service","metadata":{"name":"a","annotations":{"x":")" +
                    std::string(kMaxObjectBytes, 'x') + R"("}},"spec":{}})";
  auto d = decode_json(big);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().find("exceeds the limit"), std::string::npos);
}

TEST(Decode, UnknownFieldsAreWarningsNotErrors) {
  auto d = decode_json(R"({"kind":"Service","metadata":{"name":"a","namespace":"n"},
                           "spec":{"clusterIP":"10.0.0.1","prots":[]}})");
  ASSERT_TRUE(d) << d.error();
  ASSERT_EQ(d->warnings.size(), 1u);
  EXPECT_NE(d->warnings[0].find("Service n/a: spec: unknown field \"prots\""), std::string::npos);
}

TEST(Decode, HintGivesKindToListItemsAndMustAgree) {
  auto d = decode_json(R"({"metadata":{"name":"a"},"spec":{}})", ObjectKind::kService);
  EXPECT_TRUE(d) << d.error();
  auto wrong = decode_json(R"({"kind":"Pod","metadata":{"name":"a"}})", ObjectKind::kService);
  EXPECT_FALSE(wrong);
}

TEST(DecodeList, KeepsGoodItemsAndReportsBadOnes) {
  auto l =
      decode_list(R"({"kind":"ServiceList","metadata":{"resourceVersion":"77","continue":"tok"},
      "items":[{"metadata":{"name":"good"},"spec":{}},
               {"metadata":{"name":"bad"},"spec":{"clusterIP":"nope"}},
               {"metadata":{"name":"good2"},"spec":{}}]})",
                  ObjectKind::kService);
  ASSERT_TRUE(l) << l.error();
  EXPECT_EQ(l->resource_version, "77");
  EXPECT_EQ(l->continue_token, "tok");
  EXPECT_EQ(l->objects.size(), 2u);
  ASSERT_EQ(l->errors.size(), 1u);
  EXPECT_NE(l->errors[0].find("Service default/bad"), std::string::npos);
}

}  // namespace
}  // namespace endpointd::watcher

namespace endpointd::watcher {
namespace {

TEST(DecodeList, NamesTheItemsThatFailed) {
  auto l = decode_list(R"({"items":[{"metadata":{"name":"ok"},"spec":{}},
      {"metadata":{"name":"bad","namespace":"x"},"spec":{"clusterIP":"nope"}}]})",
                       model::ObjectKind::kService);
  ASSERT_TRUE(l) << l.error();
  ASSERT_EQ(l->failed.size(), 1u);
  EXPECT_EQ(l->failed[0].str(), "x/bad");
}

}  // namespace
}  // namespace endpointd::watcher
