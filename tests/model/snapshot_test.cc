// Merging slices into a service's endpoints, and diffing snapshots.
#include "model/snapshot.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

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

// Already in order with each address once (the common case, taken without sorting or
// copying): kept as given; in order but with a copy, still merged.
TEST(BuildServiceState, InOrderInputIsKeptAndInOrderCopiesStillMerge) {
  auto a = slice("a", {ep("10.0.0.1"), ep("10.0.0.2")});
  auto b = slice("b", {ep("10.0.0.3", false)});
  auto st = build_service_state(svc("web"), {&a, &b});
  ASSERT_EQ(st.endpoints.size(), 3u);
  EXPECT_EQ(st.endpoints[0].address, ip("10.0.0.1"));
  EXPECT_EQ(st.endpoints[2].address, ip("10.0.0.3"));
  EXPECT_FALSE(st.endpoints[2].conditions.ready);
  auto c = slice("c", {ep("10.0.0.3", true)});
  c.ports = {{"metrics", Protocol::kTCP, 9090, ""}};
  auto merged = build_service_state(svc("web"), {&a, &c, &b});  // ready copy first: in order
  ASSERT_EQ(merged.endpoints.size(), 3u);
  EXPECT_TRUE(merged.endpoints[2].conditions.ready);
  EXPECT_EQ(merged.endpoints[2].ports.size(), 2u);
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

// Copies of one address with the same conditions: the one of the earlier slice is kept, and
// within a slice the earlier one, whatever the order of the addresses around them.
TEST(BuildServiceState, EqualCopiesKeepSliceOrder) {
  auto a = slice("a", {ep("10.0.0.9"), ep("10.0.0.5"), ep("10.0.0.5")});
  a.endpoints[1].hostname = "a-first";
  a.endpoints[2].hostname = "a-second";
  auto b = slice("b", {ep("10.0.0.5"), ep("10.0.0.1")});
  b.endpoints[0].hostname = "b";
  auto st = build_service_state(svc("web"), {&b, &a});
  ASSERT_EQ(st.endpoints.size(), 3u);
  EXPECT_EQ(st.endpoints[0].address, ip("10.0.0.1"));
  EXPECT_EQ(st.endpoints[1].address, ip("10.0.0.5"));
  EXPECT_EQ(st.endpoints[1].hostname, "b");
  auto st2 = build_service_state(svc("web"), {&a, &b});
  ASSERT_EQ(st2.endpoints.size(), 3u);
  EXPECT_EQ(st2.endpoints[1].hostname, "a-first");
  EXPECT_EQ(st2.endpoints[2].address, ip("10.0.0.9"));
}

TEST(BuildServiceState, DedupeKeepsPortsOfEveryCopy) {
  auto a = slice("a", {ep("10.0.0.1")});
  auto b = slice("b", {ep("10.0.0.1")});
  b.ports = {{"metrics", Protocol::kTCP, 9090, ""}};
  auto st = build_service_state(svc("web"), {&a, &b});
  ASSERT_EQ(st.endpoints.size(), 1u);
  EXPECT_EQ(st.endpoints[0].ports.size(), 2u);
}

TEST(BuildServiceState, EndpointsShareTheirSlicesPortsAndPodReference) {
  auto a = slice("a", {ep("10.0.0.1"), ep("10.0.0.2")});
  a.endpoints[0].target_ref = ObjectRef{"Pod", "ns", "web-0", "uid-0"};
  a.endpoints[0].hint_zones = {"zone-a"};
  auto st = build_service_state(svc("web"), {&a});
  ASSERT_EQ(st.endpoints.size(), 2u);
  // One port list for the slice, not a copy per endpoint.
  EXPECT_EQ(&st.endpoints[0].ports.vec(), &st.endpoints[1].ports.vec());
  ASSERT_TRUE(st.endpoints[0].target_ref);
  EXPECT_EQ(&*st.endpoints[0].target_ref, &*a.endpoints[0].target_ref);
  EXPECT_EQ(st.endpoints[0].target_ref->name, "web-0");
  EXPECT_FALSE(st.endpoints[1].target_ref);
  EXPECT_EQ(st.endpoints[0].hint_zones, std::vector<std::string>{"zone-a"});
  EXPECT_TRUE(st.endpoints[1].hint_zones.empty());
}

TEST(SharedValues, WritingThroughACopyLeavesTheOthers) {
  SharedVector<EndpointPort> ports = {{"http", Protocol::kTCP, 8080, ""}};
  auto copy = ports;
  copy.push_back({"metrics", Protocol::kTCP, 9090, ""});
  EXPECT_EQ(ports.size(), 1u);
  EXPECT_EQ(copy.size(), 2u);
  EXPECT_EQ(copy[1].port, 9090);
  EXPECT_FALSE(ports == copy);
  // Equality is by value: separately built equal lists are equal, and null equals empty.
  EXPECT_EQ(ports, (SharedVector<EndpointPort>{{"http", Protocol::kTCP, 8080, ""}}));
  EXPECT_EQ(SharedVector<std::string>(), SharedVector<std::string>(std::vector<std::string>{}));

  Shared<ObjectRef> ref = ObjectRef{"Pod", "ns", "a", "u"};
  auto other = ref;
  other = ObjectRef{"Pod", "ns", "b", "u"};
  EXPECT_EQ(ref->name, "a");
  EXPECT_EQ(other->name, "b");
  EXPECT_EQ(ref, (Shared<ObjectRef>(ObjectRef{"Pod", "ns", "a", "u"})));
  other.reset();
  EXPECT_FALSE(other);
  EXPECT_TRUE(other == std::nullopt);
  EXPECT_FALSE(ref == other);
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

namespace endpointd::model {
namespace {

ServiceStatePtr state(int i, int version = 0) {
  ServiceState st;
  char name[16];
  std::snprintf(name, sizeof name, "s%05d", i);
  st.service.key = {"ns", name};
  st.service.uid = std::to_string(version);
  return std::make_shared<const ServiceState>(std::move(st));
}

std::vector<std::string> names(const ServiceList& l) {
  std::vector<std::string> out;
  for (const auto& p : l) out.push_back(p->key().name);
  return out;
}

TEST(ServiceList, ChangesShareEveryUntouchedChunk) {
  std::vector<ServiceStatePtr> all;
  for (int i = 0; i < 1000; i += 2) all.push_back(state(i));
  ServiceList l(all);
  ASSERT_EQ(l.size(), 500u);
  ASSERT_GT(l.chunks().size(), 5u);
  // Replace one, insert one, remove one: all in the middle.
  auto next = l.with({{state(500)->key(), state(500, 1)},
                      {state(501)->key(), state(501)},
                      {state(502)->key(), nullptr}});
  EXPECT_EQ(next.size(), 500u);
  auto n = names(next);
  EXPECT_TRUE(std::is_sorted(n.begin(), n.end()));
  EXPECT_EQ(next.find(state(501)->key())->get()->key().name, "s00501");
  EXPECT_EQ(next.find(state(502)->key()), nullptr);
  EXPECT_EQ(next.find(state(500)->key())->get()->service.uid, "1");
  size_t shared = 0;
  for (const auto& c : next.chunks())
    for (const auto& o : l.chunks()) shared += (c == o);
  EXPECT_GE(shared, l.chunks().size() - 1);  // only the touched chunk was copied
  Snapshot a, b;
  a.services = l;
  b.services = next;
  auto d = diff(&a, b);
  EXPECT_EQ(d.added.size(), 1u);
  EXPECT_EQ(d.removed.size(), 1u);
  EXPECT_EQ(d.changed.size(), 1u);
}

TEST(ServiceList, GrowsFromEmptySplitsAndEmpties) {
  ServiceList l;
  std::vector<std::pair<ServiceKey, ServiceStatePtr>> adds;
  for (int i = 0; i < 300; ++i) adds.emplace_back(state(i)->key(), state(i));
  auto full = l.with(adds);
  EXPECT_EQ(full.size(), 300u);
  EXPECT_GE(full.chunks().size(), 300 / (2 * ServiceList::kChunk));
  for (const auto& c : full.chunks()) EXPECT_LE(c->items.size(), 2 * ServiceList::kChunk);
  // Insert at both ends.
  auto ends = full.with({{ServiceKey{"a", "first"},
                          [] {
                            ServiceState st;
                            st.service.key = {"a", "first"};
                            return std::make_shared<const ServiceState>(std::move(st));
                          }()},
                         {ServiceKey{"zz", "last"}, [] {
                            ServiceState st;
                            st.service.key = {"zz", "last"};
                            return std::make_shared<const ServiceState>(std::move(st));
                          }()}});
  auto n = names(ends);
  ASSERT_EQ(n.size(), 302u);
  EXPECT_EQ(n.front(), "first");
  EXPECT_EQ(n.back(), "last");
  std::vector<std::pair<ServiceKey, ServiceStatePtr>> removes;
  for (const auto& p : ends) removes.emplace_back(p->key(), nullptr);
  auto empty = ends.with(removes);
  EXPECT_TRUE(empty.empty());
  EXPECT_TRUE(empty.chunks().empty());
  EXPECT_EQ(empty.begin(), empty.end());
}

}  // namespace
}  // namespace endpointd::model

namespace endpointd::model {
namespace {

// Merging the deltas of consecutive generations gives the delta a sink that skipped the middle
// ones would have had from a diff: over many random steps of adds, changes and removals.
TEST(Merge, ChainedDeltasEqualTheDiffAcrossThem) {
  std::mt19937 rng(7);
  std::vector<std::shared_ptr<Snapshot>> gens;
  auto first = std::make_shared<Snapshot>();
  first->generation = 1;
  gens.push_back(first);
  for (int g = 2; g < 60; ++g) {
    std::map<ServiceKey, ServiceStatePtr> step;  // one change per key and step
    for (int n = 0; n < 6; ++n) {
      int i = static_cast<int>(rng() % 40);
      auto st = state(i, g * 100 + n);
      bool remove = rng() % 3 == 0;
      step[st->key()] = remove ? nullptr : st;
    }
    std::vector<std::pair<ServiceKey, ServiceStatePtr>> changes(step.begin(), step.end());
    auto next = std::make_shared<Snapshot>();
    next->generation = static_cast<uint64_t>(g);
    next->services = gens.back()->services.with(changes);
    gens.push_back(next);
  }
  for (size_t from = 0; from < gens.size(); from += 7) {
    Delta merged = diff(gens[from].get(), *gens[from + 1]);
    for (size_t to = from + 2; to < gens.size(); ++to) {
      merged = merge(merged, diff(gens[to - 1].get(), *gens[to]));
      Delta direct = diff(gens[from].get(), *gens[to]);
      // diff reports a service rebuilt with equal content as changed (pointer identity), and so
      // does merge: the lists are equal as sets.
      EXPECT_EQ(merged.added, direct.added) << from << " -> " << to;
      EXPECT_EQ(merged.removed, direct.removed) << from << " -> " << to;
      EXPECT_EQ(merged.changed, direct.changed) << from << " -> " << to;
      EXPECT_EQ(merged.from_generation, direct.from_generation);
      EXPECT_EQ(merged.to_generation, direct.to_generation);
    }
  }
}

TEST(Merge, AddedThenRemovedIsNoChangeAndRemovedThenAddedIsAChange) {
  Delta a;
  a.from_generation = 1;
  a.to_generation = 2;
  a.added = {{"ns", "x"}};
  a.removed = {{"ns", "y"}};
  a.nodes_changed = true;
  Delta b;
  b.from_generation = 2;
  b.to_generation = 3;
  b.removed = {{"ns", "x"}};
  b.added = {{"ns", "y"}};
  b.pods_changed = true;
  Delta m = merge(a, b);
  EXPECT_TRUE(m.added.empty());
  EXPECT_TRUE(m.removed.empty());
  ASSERT_EQ(m.changed.size(), 1u);
  EXPECT_EQ(m.changed[0].name, "y");
  EXPECT_TRUE(m.nodes_changed);
  EXPECT_TRUE(m.pods_changed);
  EXPECT_EQ(m.from_generation, 1u);
  EXPECT_EQ(m.to_generation, 3u);
}

}  // namespace
}  // namespace endpointd::model
