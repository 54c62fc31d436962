// Merging slices into a service's endpoints, and diffing snapshots.
#include "model/snapshot.h"

#include <gtest/gtest.h>

namespace endpointd::model {
namespace {

IpAddr ip(const char* s) {
  return *IpAddr::parse(s);
}

Service svc(const char* name) {
  Service s;
  s.key = {"ns", name};
  s.cluster_ips = {ip("10.96.0.1")};
  s.ports = {{"http", Protocol::kTCP, 80, 8080, "", 0, ""}};
  return s;
}

Endpoint ep(const char* addr, bool ready = true, bool serving = true, bool terminating = false) {
  Endpoint e;
  e.addresses = {ip(addr)};
  e.conditions = {ready, serving, terminating};
  return e;
}

EndpointSlice slice(const char* name, std::vector<Endpoint> eps, uint16_t port = 8080,
                    AddressType t = AddressType::kIPv4) {
  EndpointSlice s;
  s.key = {"ns", name};
  s.service_name = "web";
  s.address_type = t;
  s.ports = {{"http", Protocol::kTCP, port, ""}};
  s.endpoints = std::move(eps);
  return s;
}

TEST(BuildServiceState, MergesSlicesSortedByAddress) {
  auto a = slice("a", {ep("10.0.0.3"), ep("10.0.0.1")});
  auto b = slice("b", {ep("10.0.0.2")});
  auto st = build_service_state(svc("web"), {&a, &b});
  ASSERT_EQ(st.endpoints.size(), 3u);
  EXPECT_EQ(st.endpoints[0].address, ip("10.0.0.1"));
  EXPECT_EQ(st.endpoints[1].address, ip("10.0.0.2"));
  EXPECT_EQ(st.endpoints[2].address, ip("10.0.0.3"));
  EXPECT_EQ(st.endpoints[1].port_for(st.service.ports[0]), 8080);
}

TEST(BuildServiceState, DedupePrefersTheNonTerminatingCopy) {
  // The endpoint moved to a new slice while the old slice still shows it terminating.
  auto old_slice = slice("a", {ep("10.0.0.1", false, true, true)});
  auto new_slice = slice("b", {ep("10.0.0.1", true, true, false)});
  for (auto order : {std::vector<const EndpointSlice*>{&old_slice, &new_slice},
                     std::vector<const EndpointSlice*>{&new_slice, &old_slice}}) {
    auto st = build_service_state(svc("web"), order);
    ASSERT_EQ(st.endpoints.size(), 1u);
    EXPECT_FALSE(st.endpoints[0].conditions.terminating);
    EXPECT_TRUE(st.endpoints[0].conditions.ready);
  }
}

TEST(BuildServiceState, DedupeThenPrefersReady) {
  auto a = slice("a", {ep("10.0.0.1", false)});
  auto b = slice("b", {ep("10.0.0.1", true)});
  auto st = build_service_state(svc("web"), {&a, &b});
  ASSERT_EQ(st.endpoints.size(), 1u);
  EXPECT_TRUE(st.endpoints[0].conditions.ready);
}

TEST(BuildServiceState, DedupeKeepsPortsOfEveryCopy) {
  auto a = slice("a", {ep("10.0.0.1")});
  auto b = slice("b", {ep("10.0.0.1")});
  b.ports = {{"metrics", Protocol::kTCP, 9090, ""}};
  auto st = build_service_state(svc("web"), {&a, &b});
  ASSERT_EQ(st.endpoints.size(), 1u);
  EXPECT_EQ(st.endpoints[0].ports.size(), 2u);
}

TEST(BuildServiceState, KeepsConditionsAsGiven) {
  auto a = slice("a", {ep("10.0.0.1", true, true, false), ep("10.0.0.2", false, true, true),
                       ep("10.0.0.3", false, false, true), ep("10.0.0.4", false, false, false)});
  auto st = build_service_state(svc("web"), {&a});
  ASSERT_EQ(st.endpoints.size(), 4u);
  EXPECT_EQ(st.endpoints[1].conditions, (EndpointConditions{false, true, true}));
  EXPECT_EQ(st.endpoints[2].conditions, (EndpointConditions{false, false, true}));
  EXPECT_EQ(st.endpoints[3].conditions, (EndpointConditions{false, false, false}));
}

TEST(BuildServiceState, DualStackSlicesBothCount) {
  auto v4 = slice("v4", {ep("10.0.0.1")});
  auto v6 = slice("v6", {ep("fd00::1")}, 8080, AddressType::kIPv6);
  auto s = svc("web");
  s.cluster_ips.push_back(ip("fd00:96::1"));
  auto st = build_service_state(s, {&v4, &v6});
  ASSERT_EQ(st.endpoints.size(), 2u);
  EXPECT_TRUE(st.endpoints[0].address.is_v4());
  EXPECT_TRUE(st.endpoints[1].address.is_v6());
}

TEST(BuildServiceState, FqdnSlicesAndExternalNameHaveNoEndpoints) {
  auto f = slice("f", {}, 8080, AddressType::kFQDN);
  EXPECT_TRUE(build_service_state(svc("web"), {&f}).endpoints.empty());
  auto s = svc("web");
  s.type = ServiceType::kExternalName;
  auto a = slice("a", {ep("10.0.0.1")});
  EXPECT_TRUE(build_service_state(s, {&a}).endpoints.empty());
}

TEST(Diff, ByPointerIdentity) {
  auto mk = [](const char* name) {
    ServiceState st;
    st.service = svc(name);
    return std::make_shared<const ServiceState>(std::move(st));
  };
  auto a = mk("a"), b = mk("b"), c = mk("c"), c2 = mk("c"), d = mk("d");
  Snapshot s1, s2;
  s1.generation = 1;
  s1.services = {a, b, c};
  s2.generation = 2;
  s2.services = {a, c2, d};
  auto delta = diff(&s1, s2);
  EXPECT_EQ(delta.from_generation, 1u);
  EXPECT_EQ(delta.to_generation, 2u);
  ASSERT_EQ(delta.removed.size(), 1u);
  EXPECT_EQ(delta.removed[0].name, "b");
  ASSERT_EQ(delta.changed.size(), 1u);
  EXPECT_EQ(delta.changed[0].name, "c");
  ASSERT_EQ(delta.added.size(), 1u);
  EXPECT_EQ(delta.added[0].name, "d");
  auto from_nothing = diff(nullptr, s2);
  EXPECT_EQ(from_nothing.added.size(), 3u);
  EXPECT_TRUE(diff(&s2, s2).empty());
}

TEST(Snapshot, FindsByKey) {
  ServiceState st;
  st.service = svc("b");
  auto p = std::make_shared<const ServiceState>(std::move(st));
  Snapshot s;
  s.services = {p};
  EXPECT_EQ(s.find({"ns", "b"}), p.get());
  EXPECT_EQ(s.find({"ns", "a"}), nullptr);
  EXPECT_EQ(s.find({"other", "b"}), nullptr);
}

}  // namespace
}  // namespace endpointd::model
