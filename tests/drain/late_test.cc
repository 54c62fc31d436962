// Late senders (drain/late.h): who a source address is, the bounded count per drain, and which
// drain a new connection belongs to — before the removal, after it, after the release, and once
// another pod holds the address.
#include "drain/late.h"

#include <gtest/gtest.h>

#include <memory>

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using TimePoint = std::chrono::steady_clock::time_point;

model::IpAddr ip(const char* s) {
  return *model::IpAddr::parse(s);
}

std::shared_ptr<model::Snapshot> cluster() {
  auto s = std::make_shared<model::Snapshot>();
  auto node = [&](const char* name, const char* address, const char* cidr) {
    auto n = std::make_shared<model::Node>();
    n->name = name;
    n->addresses = {{"InternalIP", address}, {"Hostname", name}};
    n->pod_cidrs = {*model::IpPrefix::parse(cidr)};
    s->nodes.push_back(n);
  };
  node("node-a", "10.0.0.1", "10.244.0.0/24");
  node("node-b", "10.0.0.2", "10.244.1.0/24");
  auto pod = [&](const char* ns, const char* name, const char* on, const char* address,
                 bool host = false, bool terminating = false) {
    auto p = std::make_shared<model::Pod>();
    p->key = {ns, name};
    p->uid = std::string("uid-") + name;
    p->node_name = on;
    p->pod_ips = {ip(address)};
    p->host_network = host;
    p->terminating = terminating;
    s->pods.push_back(p);
  };
  pod("ingress", "nginx-1", "node-b", "10.244.1.7");
  pod("kube-system", "haproxy-b", "node-b", "10.0.0.2", true);  // hostNetwork
  pod("default", "web-1", "node-a", "10.244.0.5", false, true);
  pod("default", "web-9", "node-a", "10.244.0.5");  // given web-1's address
  return s;
}

TEST(LateTest, AttributesANodeAPodAPodRangeAndTheOutside) {
  auto s = cluster();
  Source n = attribute(*s, ip("10.0.0.2"));
  EXPECT_EQ(n.kind, Source::Kind::kNode) << "a hostNetwork pod's address is its node's";
  EXPECT_EQ(n.str(), "node node-b (10.0.0.2)");
  EXPECT_STREQ(n.kind_label(), "node");

  Source p = attribute(*s, ip("10.244.1.7"));
  EXPECT_EQ(p.kind, Source::Kind::kPod);
  EXPECT_EQ(p.str(), "pod ingress/nginx-1 on node-b (10.244.1.7)");
  EXPECT_STREQ(p.kind_label(), "pod");

  Source r = attribute(*s, ip("10.244.1.99"));
  EXPECT_EQ(r.kind, Source::Kind::kPod);
  EXPECT_EQ(r.str(), "a pod of node node-b (10.244.1.99)");

  Source x = attribute(*s, ip("203.0.113.9"));
  EXPECT_EQ(x.kind, Source::Kind::kExternal);
  EXPECT_EQ(x.str(), "outside the cluster (203.0.113.9)");
  EXPECT_STREQ(x.kind_label(), "external");
}

TEST(LateTest, OfTwoPodsWithOneAddressTheOneNotTerminatingSends) {
  EXPECT_EQ(attribute(*cluster(), ip("10.244.0.5")).name, "default/web-9");
}

TEST(LateTest, KeepsTheFirstSourcesByNameAndSumsTheRest) {
  LateSenders late;
  TimePoint t0{};
  int asked = 0;
  auto who = [&](const char* a) {
    return [&asked, a] {
      ++asked;
      Source s;
      s.address = ip(a);
      return s;
    };
  };
  for (int k = 0; k < 3; ++k) late.add(ip("203.0.113.1"), t0 + k * 1ms, who("203.0.113.1"));
  EXPECT_EQ(asked, 1) << "a source is named once, not once a connection";
  for (int k = 0; k < 10; ++k) {
    std::string a = "198.51.100." + std::to_string(k + 1);
    late.add(ip(a.c_str()), t0 + 5ms, who(a.c_str()));
  }
  EXPECT_EQ(late.entries().size(), LateSenders::kMaxSources);
  EXPECT_EQ(late.total(), 13u);
  EXPECT_EQ(late.others(), 13u - 3u - (LateSenders::kMaxSources - 1));
  EXPECT_EQ(late.entries()[0].count, 3u);
  EXPECT_EQ(late.entries()[0].last, t0 + 2ms);
  EXPECT_EQ(late.summary().rfind("outside the cluster (203.0.113.1): 3, ", 0), 0u)
      << late.summary();
  EXPECT_NE(late.summary().find("3 more from sources past the bound"), std::string::npos)
      << late.summary();
}

TEST(LateTest, ConnectionsBeforeTheRemovalAreExpectedAfterItLateAfterTheReleaseKeptApart) {
  auto s = cluster();
  LateWatch w(5s);
  TimePoint t0 = TimePoint{} + 1h;
  LateWatch::Pod web{ip("10.244.0.5"), "uid-web-1", "default/web-1", std::nullopt, std::nullopt};
  w.update({web}, "node-a", nullptr, t0);
  EXPECT_EQ(w.addresses(), std::set<model::IpAddr>{ip("10.244.0.5")});
  w.observe({{ip("10.244.1.7"), ip("10.244.0.5"), t0 + 10ms}}, s.get());

  web.removed = t0 + 100ms;
  w.update({web}, "node-a", nullptr, t0 + 120ms);
  // One before the removal (seen late by the loop), two after it from the ingress pod, one
  // from another node.
  w.observe({{ip("10.244.1.7"), ip("10.244.0.5"), t0 + 90ms},
             {ip("10.244.1.7"), ip("10.244.0.5"), t0 + 150ms},
             {ip("10.244.1.7"), ip("10.244.0.5"), t0 + 160ms},
             {ip("10.0.0.2"), ip("10.244.0.5"), t0 + 170ms},
             {ip("10.244.1.7"), ip("10.244.0.77"), t0 + 170ms}},
            s.get());
  web.released = t0 + 200ms;
  w.update({web}, "node-a", nullptr, t0 + 210ms);
  w.observe({{ip("10.244.1.7"), ip("10.244.0.5"), t0 + 3s}}, s.get());

  const auto* r = w.record("uid-web-1");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->before_removal, 2u);
  ASSERT_EQ(r->late.entries().size(), 2u);
  EXPECT_EQ(r->late.total(), 3u);
  EXPECT_EQ(r->late.entries()[0].source.name, "ingress/nginx-1");
  EXPECT_EQ(r->late.entries()[0].count, 2u);
  EXPECT_EQ(r->late.entries()[1].source.kind, Source::Kind::kNode);
  EXPECT_EQ(r->after_release.total(), 1u);
  EXPECT_EQ(w.stats().unwatched, 1u) << "10.244.0.77 is no terminating pod's";

  // The window ends 5 s after the release: later connections are nobody's, and the record is
  // handed over once.
  EXPECT_TRUE(w.take_finished(t0 + 5s).empty());
  w.observe({{ip("10.244.1.7"), ip("10.244.0.5"), t0 + 5300ms}}, s.get());
  EXPECT_EQ(w.record("uid-web-1")->after_release.total(), 1u);
  auto done = w.take_finished(t0 + 5200ms);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].pod.name, "default/web-1");
  EXPECT_EQ(w.record("uid-web-1"), nullptr);
  EXPECT_TRUE(w.addresses().empty());
}

TEST(LateTest, AnAddressAnotherPodHoldsEndsTheOldPodsWatch) {
  auto s = cluster();  // web-9 (running) holds web-1's address on node-a
  LateWatch w(30s);
  TimePoint t0 = TimePoint{} + 1h;
  LateWatch::Pod web{ip("10.244.0.5"), "uid-web-1", "default/web-1", t0, t0 + 10ms};
  w.update({web}, "node-a", nullptr, t0 + 20ms);
  w.observe({{ip("10.244.1.7"), ip("10.244.0.5"), t0 + 30ms}}, s.get());
  EXPECT_EQ(w.record("uid-web-1")->after_release.total(), 1u);
  // The state now shows web-9 with the address: its traffic is its own.
  w.update({}, "node-a", s.get(), t0 + 40ms);
  w.observe({{ip("10.244.1.7"), ip("10.244.0.5"), t0 + 50ms}}, s.get());
  EXPECT_EQ(w.stats().unwatched, 1u);
  auto done = w.take_finished(t0 + 40ms);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].after_release.total(), 1u);
}

// Found by the simulation (seed 100905): web-7's drain was erased as web-9 took its address, so
// its record never saw a release; web-9 terminated before the agent saw it running. Both
// records watched the address with no release: web-7's (first by UID) took web-9's late
// connections, web-9's drain saw none, and its silent release said "confirmed".
TEST(LateTest, ADrainUnderWayTakesTheConnectionsOfAnAddressBeforeOneThatEnded) {
  LateWatch w(5s);
  TimePoint t0 = TimePoint{} + 1h;
  LateWatch::Pod web7{ip("10.244.0.5"), "uid-web-7", "default/web-7", t0, std::nullopt};
  w.update({web7}, "node-a", nullptr, t0);
  w.update({}, "node-a", nullptr, t0 + 100ms);  // erased without a release: its window starts
  LateWatch::Pod web9{ip("10.244.0.5"), "uid-web-9", "default/web-9", t0 + 1s, std::nullopt};
  w.update({web9}, "node-a", nullptr, t0 + 1s);
  w.observe({{ip("10.244.1.7"), ip("10.244.0.5"), t0 + 1200ms}}, nullptr);
  EXPECT_EQ(w.record("uid-web-9")->late.total(), 1u);
  EXPECT_EQ(w.record("uid-web-7")->after_release.total() + w.record("uid-web-7")->late.total(), 0u);
}

// Seed 164195: web-0, killed at its grace and never released, kept its drain while web-6 got
// its address; both drains under way, web-0's (first by UID) took web-6's late connections.
TEST(LateTest, OfTwoDrainsUnderWayAtOneAddressTheNewerTakesItsConnections) {
  LateWatch w(5s);
  TimePoint t0 = TimePoint{} + 1h;
  LateWatch::Pod web0{ip("10.244.0.5"), "uid-web-0", "default/web-0", t0, std::nullopt, t0};
  LateWatch::Pod web6{ip("10.244.0.5"), "uid-web-6",  "default/web-6",
                      t0 + 10s,         std::nullopt, t0 + 9s};
  w.update({web0, web6}, "node-a", nullptr, t0 + 10s);
  w.observe({{ip("10.244.1.7"), ip("10.244.0.5"), t0 + 11s}}, nullptr);
  EXPECT_EQ(w.record("uid-web-6")->late.total(), 1u);
  EXPECT_EQ(w.record("uid-web-0")->late.total(), 0u);
}

TEST(LateTest, ADrainGoneWithoutAReleaseStartsItsWindowWhenItGoes) {
  LateWatch w(2s);
  TimePoint t0 = TimePoint{} + 1h;
  LateWatch::Pod web{ip("10.244.0.5"), "uid-web-1", "default/web-1", t0, std::nullopt};
  w.update({web}, "node-a", nullptr, t0);
  w.update({}, "node-a", nullptr, t0 + 1s);
  EXPECT_TRUE(w.take_finished(t0 + 2900ms).empty());
  EXPECT_EQ(w.take_finished(t0 + 3s).size(), 1u);
}

}  // namespace
}  // namespace endpointd::drain
