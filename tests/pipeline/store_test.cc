// The Store: objects in, snapshots out, only real differences published.
#include "pipeline/store.h"

#include <gtest/gtest.h>

#include "model/routing.h"

namespace endpointd::pipeline {
namespace {

using model::ObjectKind;

model::IpAddr ip(const char* s) {
  return *model::IpAddr::parse(s);
}

model::Service svc(const char* name, const char* cluster_ip = "10.96.0.1") {
  model::Service s;
  s.key = {"ns", name};
  s.cluster_ips = {ip(cluster_ip)};
  s.ports = {{"http", model::Protocol::kTCP, 80, 8080, "", 0, ""}};
  return s;
}

model::EndpointSlice slice(const char* name, const char* service, std::vector<const char*> addrs,
                           bool ready = true) {
  model::EndpointSlice s;
  s.key = {"ns", name};
  s.service_name = service;
  s.ports = {{"http", model::Protocol::kTCP, 8080, ""}};
  for (auto a : addrs) {
    model::Endpoint e;
    e.addresses = {ip(a)};
    e.conditions.ready = ready;
    s.endpoints.push_back(e);
  }
  return s;
}

model::Event up(model::Object o) {
  return model::Event{model::Upsert{std::move(o)}};
}
model::Event rm(ObjectKind k, const char* name) {
  return model::Event{model::Remove{k, {"ns", name}}};
}

class StoreTest : public ::testing::Test {
 protected:
  Store store{{ObjectKind::kService, ObjectKind::kEndpointSlice}};
  model::SnapshotPtr snap;
  model::SnapshotPtr build() {
    auto next = store.build(snap);
    snap = next;
    return next;
  }
};

TEST_F(StoreTest, NotSyncedUntilEveryExpectedKindWasListed) {
  store.apply(model::Event{model::Replace{ObjectKind::kService, {svc("web")}}});
  EXPECT_FALSE(build()->synced);
  store.apply(model::Event{model::Replace{ObjectKind::kEndpointSlice, {}}});
  EXPECT_TRUE(build()->synced);
}

TEST_F(StoreTest, GenerationGrowsOnlyOnChange) {
  store.apply(up(svc("web")));
  auto s1 = build();
  EXPECT_EQ(s1->generation, 1u);
  EXPECT_FALSE(store.pending());
  EXPECT_EQ(build(), s1);  // nothing changed: the same snapshot
  auto again = svc("web");
  again.resource_version = "99";  // a no-op update, as a resync sends
  store.apply(up(again));
  EXPECT_EQ(build(), s1);
  store.apply(up(slice("web-1", "web", {"10.0.0.1"})));
  auto s2 = build();
  EXPECT_EQ(s2->generation, 2u);
  ASSERT_EQ(s2->find({"ns", "web"})->endpoints.size(), 1u);
}

TEST_F(StoreTest, UnchangedServicesKeepTheirPointer) {
  store.apply(up(svc("a")));
  store.apply(up(svc("b")));
  store.apply(up(slice("a-1", "a", {"10.0.0.1"})));
  store.apply(up(slice("b-1", "b", {"10.0.1.1"})));
  auto s1 = build();
  store.apply(up(slice("b-1", "b", {"10.0.1.1", "10.0.1.2"})));
  auto s2 = build();
  EXPECT_EQ(s1->find_ptr({"ns", "a"}), s2->find_ptr({"ns", "a"}));
  EXPECT_NE(s1->find_ptr({"ns", "b"}), s2->find_ptr({"ns", "b"}));
  auto d = model::diff(s1.get(), *s2);
  ASSERT_EQ(d.changed.size(), 1u);
  EXPECT_EQ(d.changed[0].name, "b");
}

// A first list of many services is built on several threads (Store::build): every service
// gets its own slices' endpoints, removed services go, and a relist that changes a few keeps
// every other service's pointer, as a build one by one does.
TEST_F(StoreTest, ManyServicesBuiltTogetherMatchTheirSlices) {
  constexpr int kServices = 6000;  // several threads' worth
  std::vector<model::Object> services, slices;
  std::vector<std::string> names;
  for (int i = 0; i < kServices; ++i) names.push_back("s" + std::to_string(i));
  auto addr = [](int i, int k) {
    return "10.1." + std::to_string(i / 250) + "." + std::to_string(i % 250 + k);
  };
  for (int i = 0; i < kServices; ++i) {
    services.push_back(svc(names[i].c_str()));
    std::string a = addr(i, 0), b = addr(i, 1);
    slices.push_back(
        slice((names[i] + "-1").c_str(), names[i].c_str(), {a.c_str(), b.c_str()}, i % 3 != 0));
  }
  store.apply(model::Event{model::Replace{ObjectKind::kService, services}});
  store.apply(model::Event{model::Replace{ObjectKind::kEndpointSlice, slices}});
  auto s1 = build();
  ASSERT_EQ(s1->services.size(), static_cast<size_t>(kServices));
  EXPECT_EQ(s1->endpoint_count(), 2u * kServices);
  for (int i : {0, 1, 2, 2047, 2048, 4095, 5999}) {
    auto* st = s1->find({"ns", names[i]});
    ASSERT_NE(st, nullptr) << names[i];
    ASSERT_EQ(st->endpoints.size(), 2u) << names[i];
    EXPECT_EQ(st->endpoints[0].address.str(), addr(i, 0)) << names[i];
    EXPECT_EQ(st->endpoints[0].conditions.ready, i % 3 != 0) << names[i];
  }
  // Relist: service 7 gone, service 8's slice has one address more, the rest the same.
  services.erase(services.begin() + 7);
  std::string extra = "10.2.0.1", a8 = addr(8, 0), b8 = addr(8, 1);
  slices[8] = slice("s8-1", "s8", {a8.c_str(), b8.c_str(), extra.c_str()});
  store.apply(model::Event{model::Replace{ObjectKind::kService, services}});
  store.apply(model::Event{model::Replace{ObjectKind::kEndpointSlice, slices}});
  auto s2 = build();
  EXPECT_EQ(s2->services.size(), static_cast<size_t>(kServices - 1));
  EXPECT_EQ(s2->find({"ns", "s7"}), nullptr);
  ASSERT_NE(s2->find({"ns", "s8"}), nullptr);
  EXPECT_EQ(s2->find({"ns", "s8"})->endpoints.size(), 3u);
  EXPECT_EQ(s2->find_ptr({"ns", "s9"}), s1->find_ptr({"ns", "s9"}));
  EXPECT_EQ(s2->endpoint_count(), 2u * kServices - 2 + 1);
  auto d = model::diff(s1.get(), *s2);
  EXPECT_EQ(d.changed.size(), 1u);
  EXPECT_EQ(d.removed.size(), 1u);
}

TEST_F(StoreTest, SliceBeforeItsServiceAppearsWithIt) {
  store.apply(up(slice("web-1", "web", {"10.0.0.1"})));
  auto s1 = build();
  EXPECT_EQ(s1->find({"ns", "web"}), nullptr);
  store.apply(up(svc("web")));
  auto s2 = build();
  ASSERT_NE(s2->find({"ns", "web"}), nullptr);
  EXPECT_EQ(s2->find({"ns", "web"})->endpoints.size(), 1u);
}

TEST_F(StoreTest, SliceMovingBetweenServicesUpdatesBoth) {
  store.apply(up(svc("a")));
  store.apply(up(svc("b")));
  store.apply(up(slice("s", "a", {"10.0.0.1"})));
  auto s1 = build();
  EXPECT_EQ(s1->find({"ns", "a"})->endpoints.size(), 1u);
  store.apply(up(slice("s", "b", {"10.0.0.1"})));
  auto s2 = build();
  EXPECT_TRUE(s2->find({"ns", "a"})->endpoints.empty());
  EXPECT_EQ(s2->find({"ns", "b"})->endpoints.size(), 1u);
}

TEST_F(StoreTest, DeletionOfSliceAndService) {
  store.apply(up(svc("web")));
  store.apply(up(slice("web-1", "web", {"10.0.0.1"})));
  store.apply(up(slice("web-2", "web", {"10.0.0.2"})));
  build();
  store.apply(rm(ObjectKind::kEndpointSlice, "web-1"));
  auto s = build();
  ASSERT_EQ(s->find({"ns", "web"})->endpoints.size(), 1u);
  EXPECT_EQ(s->find({"ns", "web"})->endpoints[0].address, ip("10.0.0.2"));
  store.apply(rm(ObjectKind::kService, "web"));
  EXPECT_EQ(build()->find({"ns", "web"}), nullptr);
  store.apply(rm(ObjectKind::kService, "never-existed"));
  EXPECT_FALSE(store.pending());
}

TEST_F(StoreTest, ReplaceChangesOnlyRealDifferences) {
  store.apply(up(svc("keep")));
  store.apply(up(svc("gone")));
  store.apply(up(slice("keep-1", "keep", {"10.0.0.1", "10.0.0.2"})));
  auto s1 = build();
  auto keep_before = s1->find_ptr({"ns", "keep"});
  // A relist: "keep" unchanged, "gone" deleted, "new" added.
  store.apply(model::Event{model::Replace{ObjectKind::kService, {svc("keep"), svc("new")}}});
  store.apply(model::Event{model::Replace{ObjectKind::kEndpointSlice,
                                          {slice("keep-1", "keep", {"10.0.0.1", "10.0.0.2"})}}});
  auto s2 = build();
  EXPECT_EQ(s2->find_ptr({"ns", "keep"}), keep_before);  // never disappeared, not even touched
  EXPECT_EQ(s2->find({"ns", "gone"}), nullptr);
  EXPECT_NE(s2->find({"ns", "new"}), nullptr);
  auto d = model::diff(s1.get(), *s2);
  EXPECT_EQ(d.removed.size(), 1u);
  EXPECT_EQ(d.added.size(), 1u);
  EXPECT_TRUE(d.changed.empty());
}

model::Event at(model::Event e, const char* rv) {
  e.resource_version = rv;
  return e;
}
model::EndpointSlice with_rv(model::EndpointSlice s, const char* rv) {
  s.resource_version = rv;
  return s;
}

// A service's state says which state it directly follows: one update from it, or several
// merged (a reader holding the older one never saw the states in between).
TEST_F(StoreTest, AStateFollowsTheLastOnlyWhenOneUpdateMadeIt) {
  store.apply(at(up(svc("web")), "10"));
  store.apply(at(up(with_rv(slice("web-1", "web", {"10.0.0.1", "10.0.0.2"}), "11")), "11"));
  auto s1 = build();
  const auto* first = s1->find({"ns", "web"});
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->revision, 11u);
  EXPECT_EQ(first->follows, 0u) << "merged from two updates";

  store.apply(at(up(with_rv(slice("web-1", "web", {"10.0.0.1"}), "12")), "12"));
  auto s2 = build();
  EXPECT_EQ(s2->find({"ns", "web"})->revision, 12u);
  EXPECT_EQ(s2->find({"ns", "web"})->follows, 11u);

  // Unready and ready again before the next build: the same content, but a state in between
  // that nobody holding revision 12 saw. A new state that follows nothing.
  store.apply(at(up(with_rv(slice("web-1", "web", {"10.0.0.1"}, false), "13")), "13"));
  store.apply(at(up(with_rv(slice("web-1", "web", {"10.0.0.1"}), "14")), "14"));
  auto s3 = build();
  EXPECT_NE(s3->find_ptr({"ns", "web"}), s2->find_ptr({"ns", "web"}));
  EXPECT_EQ(s3->find({"ns", "web"})->endpoints, s2->find({"ns", "web"})->endpoints);
  EXPECT_EQ(s3->find({"ns", "web"})->revision, 14u);
  EXPECT_EQ(s3->find({"ns", "web"})->follows, 0u);
  EXPECT_EQ(model::diff(s2.get(), *s3).changed.size(), 1u);

  // A write that changes nothing the state holds: the same state.
  store.apply(at(up(with_rv(slice("web-1", "web", {"10.0.0.1"}), "15")), "15"));
  auto s4 = build();
  EXPECT_EQ(s4->find_ptr({"ns", "web"}), s3->find_ptr({"ns", "web"}));

  // A relist after a gap that finds the slice rewritten with what it held: the writes in the
  // gap were never seen.
  store.apply(at(model::Event{model::Replace{ObjectKind::kEndpointSlice,
                                             {with_rv(slice("web-1", "web", {"10.0.0.1"}), "19")}}},
                 "20"));
  auto s5 = build();
  EXPECT_NE(s5->find_ptr({"ns", "web"}), s4->find_ptr({"ns", "web"}));
  EXPECT_EQ(s5->find({"ns", "web"})->follows, 0u);
  EXPECT_EQ(s5->find({"ns", "web"})->revision, 20u);
}

// The first list of each kind fills an empty Store; the next one of each kind drops what it
// no longer holds.
TEST_F(StoreTest, FirstListThenRelistOfEveryKind) {
  Store all{
      {ObjectKind::kService, ObjectKind::kEndpointSlice, ObjectKind::kNode, ObjectKind::kPod}};
  model::Node n1, n2;
  n1.name = "node-a";
  n2.name = "node-b";
  model::Pod p1, p2;
  p1.key = {"ns", "web-1"};
  p2.key = {"ns", "web-2"};
  std::vector<model::Replace> first = {
      {ObjectKind::kService, {svc("a"), svc("b")}},
      {ObjectKind::kEndpointSlice,
       {slice("a-1", "a", {"10.0.0.1"}), slice("b-1", "b", {"10.0.0.2"})}},
      {ObjectKind::kNode, {n1, n2}},
      {ObjectKind::kPod, {p1, p2}}};
  all.apply(model::Event{model::ReplaceMany{std::move(first)}});
  auto s1 = all.build(nullptr);
  EXPECT_TRUE(s1->synced);
  EXPECT_EQ(s1->services.size(), 2u);
  EXPECT_EQ(s1->endpoint_count(), 2u);
  EXPECT_EQ(s1->nodes.size(), 2u);
  EXPECT_EQ(s1->pods.size(), 2u);
  std::vector<model::Replace> again = {
      {ObjectKind::kService, {svc("a"), svc("b")}},
      {ObjectKind::kEndpointSlice, {slice("a-1", "a", {"10.0.0.1"})}},
      {ObjectKind::kNode, {n2}},
      {ObjectKind::kPod, {p1}}};
  all.apply(model::Event{model::ReplaceMany{std::move(again)}});
  auto s2 = all.build(s1);
  EXPECT_EQ(s2->find_ptr({"ns", "a"}), s1->find_ptr({"ns", "a"}));
  ASSERT_NE(s2->find({"ns", "b"}), nullptr);
  EXPECT_TRUE(s2->find({"ns", "b"})->endpoints.empty());
  EXPECT_EQ(s2->find_node("node-a"), nullptr);
  EXPECT_NE(s2->find_node("node-b"), nullptr);
  EXPECT_EQ(s2->find_pod({"ns", "web-2"}), nullptr);
  EXPECT_NE(s2->find_pod({"ns", "web-1"}), nullptr);
}

// Another proxy's services stay in the snapshot, labelled: DNS and the feed serve them, the
// dataplane alone leaves them out (model::has_proxy_rules).
TEST_F(StoreTest, ServiceProxyNameLabelIsKeptForDnsAndTheFeed) {
  auto s = svc("other");
  s.service_proxy_name = "someone-else";
  store.apply(up(s));
  auto snap = build();
  ASSERT_NE(snap->find({"ns", "other"}), nullptr);
  EXPECT_EQ(snap->find({"ns", "other"})->service.service_proxy_name, "someone-else");
  EXPECT_FALSE(model::has_proxy_rules(snap->find({"ns", "other"})->service));
  store.apply(up(svc("other")));  // the label taken off: the dataplane's again
  snap = build();
  ASSERT_NE(snap->find({"ns", "other"}), nullptr);
  EXPECT_TRUE(model::has_proxy_rules(snap->find({"ns", "other"})->service));
}

TEST_F(StoreTest, NodesAndPods) {
  model::Node n;
  n.name = "node-a";
  store.apply(up(n));
  model::Pod p;
  p.key = {"ns", "web-1"};
  p.uid = "u1";
  store.apply(up(p));
  auto s = build();
  ASSERT_NE(s->find_node("node-a"), nullptr);
  ASSERT_NE(s->find_pod({"ns", "web-1"}), nullptr);
  auto before = s;
  p.terminating = true;
  store.apply(up(p));
  auto s2 = build();
  EXPECT_TRUE(s2->find_pod({"ns", "web-1"})->terminating);
  auto d = model::diff(before.get(), *s2);
  EXPECT_TRUE(d.pods_changed);
  EXPECT_FALSE(d.nodes_changed);
  store.apply(model::Event{model::Remove{ObjectKind::kNode, {"", "node-a"}}});
  EXPECT_EQ(build()->find_node("node-a"), nullptr);
}

}  // namespace
}  // namespace endpointd::pipeline

namespace endpointd::pipeline {
namespace {

TEST(StoreKeep, RelistKeepsTheLastGoodVersionOfAnUndecodableObject) {
  Store store{{model::ObjectKind::kService}};
  model::Service a, b;
  a.key = {"ns", "a"};
  b.key = {"ns", "b"};
  store.apply(model::Event{model::Replace{model::ObjectKind::kService, {a, b}, {}}});
  auto s1 = store.build(nullptr);
  // The relist could not decode "b": it must stay as it was, not be removed.
  store.apply(model::Event{model::Replace{model::ObjectKind::kService, {a}, {{"ns", "b"}}}});
  auto s2 = store.build(s1);
  EXPECT_NE(s2->find({"ns", "b"}), nullptr);
}

}  // namespace
}  // namespace endpointd::pipeline
