// The zone built incrementally from deltas answers exactly what a zone built whole from the
// same snapshot answers; a delta rebuilds only what it names; retired blocks keep drain's
// record until no zone holds them.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "dns/answer.h"
#include "dns/zone.h"
#include "tests/dns/test_util.h"

namespace endpointd::dns {
namespace {

using namespace testing;

std::vector<uint8_t> reply(const Zone& z, const std::string& name, uint16_t qtype) {
  auto pkt = query(name, qtype, 1232);
  Query q = parse_query(pkt);
  std::vector<uint8_t> out(65535);
  Reply r = answer(z, pkt, q, out.data(), out.size(), 65535, 1);
  out.resize(r.action == Reply::Action::kSend ? r.size : 0);
  return out;
}

// Every name of either zone, asked every type, and a few names that are in neither.
void expect_same(const Zone& a, const Zone& b, const std::string& where) {
  auto names = a.names();
  ASSERT_EQ(names, b.names()) << where;
  names.push_back("nope.default.svc.cluster.local.");
  names.push_back("10-9-9-9.ns1.pod.cluster.local.");
  for (const auto& n : names)
    for (uint16_t t : {type::kA, type::kAAAA, type::kSRV, type::kPTR, type::kTXT, type::kCNAME,
                       type::kSOA, type::kNS, type::kANY})
      ASSERT_EQ(reply(a, n, t), reply(b, n, t)) << where << ": " << n << " " << type_name(t);
}

struct Cluster {
  std::mt19937 rng{42};
  std::map<std::string, model::ServiceStatePtr> services;  // by "ns/name"
  std::map<std::string, model::PodPtr> pods;
  int next_ip = 1;

  std::string addr() {
    int k = next_ip++;
    return "10.1." + std::to_string(k / 250) + "." + std::to_string(k % 250 + 1);
  }
  model::ServiceStatePtr make(const std::string& ns, const std::string& name) {
    int kind = static_cast<int>(rng() % 4);
    std::vector<model::MergedEndpoint> eps;
    int n = static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      // Shared addresses between services of one namespace: PTR names with two owners.
      std::string a = rng() % 5 == 0 ? "10.0.0." + std::to_string(rng() % 3 + 1) : addr();
      bool dup = false;
      for (const auto& e : eps) dup = dup || e.address == ip(a);
      if (dup) continue;
      eps.push_back(
          endpoint(a, rng() % 4 != 0, rng() % 6 == 0, rng() % 2 ? "h" + std::to_string(i) : ""));
    }
    std::sort(eps.begin(), eps.end(),
              [](const auto& x, const auto& y) { return x.address < y.address; });
    model::ServiceStatePtr st;
    if (kind == 0) {
      st = service(ns, name, {"None"}, eps);
    } else if (kind == 1) {
      st = service(ns, name, {"10.96.0." + std::to_string(rng() % 250 + 1)}, eps);
    } else if (kind == 2) {
      st = service(ns, name,
                   {"10.96.1." + std::to_string(rng() % 250 + 1),
                    "fd00::" + std::to_string(rng() % 999 + 1)},
                   eps);
    } else {
      st = service(ns, name, {});
      auto& s = std::const_pointer_cast<model::ServiceState>(st)->service;
      s.type = model::ServiceType::kExternalName;
      // Half of them name a service of the zone: its records follow the CNAME, and its
      // changes must reach them.
      s.external_name = rng() % 2 ? "ext" + std::to_string(rng() % 10) + ".example.org"
                                  : "s" + std::to_string(rng() % 12) + ".ns" +
                                        std::to_string(rng() % 3) + ".svc.cluster.local";
    }
    return st;
  }
  void step() {
    int what = static_cast<int>(rng() % 10);
    std::string ns = "ns" + std::to_string(rng() % 3);
    std::string name = "s" + std::to_string(rng() % 12);
    std::string key = ns + "/" + name;
    if (what < 6) {
      services[key] = make(ns, name);
    } else if (what < 8) {
      services.erase(key);
    } else {
      auto p = std::make_shared<model::Pod>();
      p->key = {ns, "p" + std::to_string(rng() % 6)};
      std::string pk = p->key.str();
      if (rng() % 3 == 0) {
        pods.erase(pk);
      } else {
        p->pod_ips = {ip(rng() % 2 ? addr() : "10.0.0." + std::to_string(rng() % 3 + 1))};
        p->terminating = rng() % 5 == 0;
        pods[pk] = p;
      }
    }
  }
  model::SnapshotPtr snap(uint64_t gen) {
    std::vector<model::ServiceStatePtr> v;
    for (const auto& [k, s] : services) v.push_back(s);
    auto s = std::const_pointer_cast<model::Snapshot>(snapshot(v, gen));
    for (const auto& [k, p] : pods) s->pods.push_back(p);
    std::sort(s->pods.begin(), s->pods.end(),
              [](const auto& a, const auto& b) { return a->key < b->key; });
    return s;
  }
};

// Random changes, applied one delta at a time, end in the zone a full build makes.
void incremental_matches_full_builds(const ZoneOptions& o) {
  ZoneBuilder b(o);
  Cluster c;
  for (int i = 0; i < 10; ++i) c.step();
  model::SnapshotPtr prev = c.snap(1);
  b.apply(prev, model::diff(nullptr, *prev));
  for (uint64_t g = 2; g < 120; ++g) {
    int changes = static_cast<int>(c.rng() % 3) + 1;
    for (int i = 0; i < changes; ++i) c.step();
    auto next = c.snap(g);
    // Mostly deltas that follow; now and then one that does not (the builder diffs itself).
    model::Delta d = g % 7 == 0 ? model::Delta{} : model::diff(prev.get(), *next);
    auto z = b.apply(next, d);
    EXPECT_FALSE(b.last_stats().full);
    expect_same(*z, *Zone::build(*next, o), "generation " + std::to_string(g));
    if (::testing::Test::HasFatalFailure()) return;
    prev = next;
  }
}

class Incremental : public ::testing::TestWithParam<PodMode> {};

TEST_P(Incremental, MatchesAFullBuildAfterEveryDelta) {
  ZoneOptions o;
  o.pod_mode = GetParam();
  incremental_matches_full_builds(o);
}

// The CoreDNS options that leave names out (and the ExternalName targets they hide).
TEST(IncrementalOptions, NoendpointsIgnoreEmptyServiceAndNamespaces) {
  ZoneOptions o;
  o.pod_mode = PodMode::kVerified;
  o.no_endpoints = true;
  o.ignore_empty_service = true;
  o.namespaces = {"ns0", "ns2"};
  incremental_matches_full_builds(o);
}

INSTANTIATE_TEST_SUITE_P(PodModes, Incremental,
                         ::testing::Values(PodMode::kDisabled, PodMode::kVerified,
                                           PodMode::kInsecure));

std::vector<model::ServiceStatePtr> many_services(int n) {
  std::vector<model::ServiceStatePtr> v;
  for (int i = 0; i < n; ++i) {
    std::string name = "s" + std::to_string(i);
    if (i % 10 == 0)
      v.push_back(service(
          "ns" + std::to_string(i % 7), name, {"None"},
          {endpoint("10.2." + std::to_string(i / 200) + "." + std::to_string(i % 200 + 1))}));
    else
      v.push_back(
          service("ns" + std::to_string(i % 7), name,
                  {"10.96." + std::to_string(i / 200) + "." + std::to_string(i % 200 + 1)}));
  }
  return v;
}

TEST(IncrementalCost, OneChangedServiceRebuildsOneService) {
  ZoneBuilder b(ZoneOptions{});
  auto v = many_services(2000);
  auto s1 = snapshot(v, 1);
  auto z1 = b.apply(s1, model::diff(nullptr, *s1));
  EXPECT_TRUE(b.last_stats().full);
  EXPECT_EQ(b.last_stats().services, 2000u);
  v[10] = service("ns3", "s10", {"None"}, {endpoint("10.3.0.1"), endpoint("10.3.0.2")});
  auto s2 = snapshot(v, 2);
  auto z2 = b.apply(s2, model::diff(s1.get(), *s2));
  EXPECT_FALSE(b.last_stats().full);
  EXPECT_EQ(b.last_stats().services, 2u);  // the old block removed, the new one built
  EXPECT_LT(b.last_stats().shards, 40u);   // of 1024
  // Unchanged names are the very same nodes in both zones.
  auto n1 = z1->find(name_from_text("s11.ns4.svc.cluster.local")->view());
  ASSERT_NE(n1, nullptr);
  EXPECT_EQ(n1, z2->find(name_from_text("s11.ns4.svc.cluster.local")->view()));
  EXPECT_EQ(reply(*z2, "s10.ns3.svc.cluster.local", type::kA).size(),
            reply(*Zone::build(*s2, ZoneOptions{}), "s10.ns3.svc.cluster.local", type::kA).size());
  expect_same(*z2, *Zone::build(*s2, ZoneOptions{}), "after one change");
}

TEST(IncrementalDrain, RetiredBlocksKeepTheirRecordUntilNoZoneHoldsThem) {
  ZoneOptions o;
  ZoneBuilder b(o);
  auto s1 = snapshot(
      {service("default", "db", {"None"}, {endpoint("10.1.0.1"), endpoint("10.1.0.2")})}, 1);
  ZonePtr z1 = b.apply(s1);
  auto r = reply(*z1, "db.default.svc.cluster.local", type::kA);
  ASSERT_FALSE(r.empty());
  // The answer above was stamped at time 1; stamp a later one through the hot path.
  {
    auto pkt = query("db.default.svc.cluster.local", type::kA);
    Query q = parse_query(pkt);
    std::vector<uint8_t> out(512);
    answer(*z1, pkt, q, out.data(), out.size(), 512, 5000);
  }
  auto s2 = snapshot({service("default", "db", {"None"},
                              {endpoint("10.1.0.1", true, true), endpoint("10.1.0.2")})},
                     2);
  ZonePtr z2 = b.apply(s2, model::diff(s1.get(), *s2));
  EXPECT_EQ(b.last_served_ns(ip("10.1.0.1")), 5000);
  b.harvest(0);
  EXPECT_GT(b.retired_blocks(), 0u);  // z1 still holds them: a worker may still answer from it
  z1.reset();
  b.harvest(0);
  EXPECT_EQ(b.retired_blocks(), 0u);
  EXPECT_EQ(b.last_served_ns(ip("10.1.0.1")), 5000);  // folded into the departed record
  b.harvest(6000);                                    // its TTL has passed
  EXPECT_FALSE(b.last_served_ns(ip("10.1.0.1")));
  // 10.1.0.2 is still served from a block that was rebuilt: the new block starts afresh but
  // the old one's stamp was folded in.
  EXPECT_FALSE(b.last_served_ns(ip("10.1.0.2")));
}

TEST(IncrementalSync, UnsyncedThenSynced) {
  ZoneBuilder b(ZoneOptions{});
  auto z = b.apply(snapshot({service("default", "web", {"10.96.0.10"})}, 1, false));
  EXPECT_FALSE(z->synced());
  auto r = reply(*z, "web.default.svc.cluster.local", type::kA);
  ASSERT_GE(r.size(), 4u);
  EXPECT_EQ(r[3] & 0xF, 2);  // SERVFAIL
  auto s = snapshot({service("default", "web", {"10.96.0.10"})}, 2);
  z = b.apply(s);
  EXPECT_TRUE(b.last_stats().full);
  expect_same(*z, *Zone::build(*s, ZoneOptions{}), "synced");
}

}  // namespace
}  // namespace endpointd::dns
