// Root tests in throwaway namespaces: what the netlink backend programs must list exactly as
// what `nft -f` makes of render's output, expression for expression.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "proxy/monitor.h"
#include "proxy/netlink.h"
#include "proxy/planner.h"
#include "proxy/render.h"
#include "tests/netns/netns.h"
#include "tests/proxy/fixtures.h"

namespace endpointd::proxy {
namespace {

using NetNs = netns::Netns;

std::string list(NetNs& ns, const char* family, bool bytecode = false) {
  return ns.sh(std::string("nft ") + (bytecode ? "--debug=netlink " : "") + "list table " + family +
               " endpointd");
}

void load_render(NetNs& ns, const Planner& p) {
  std::string path = "/tmp/" + ns.name() + ".nft";
  {
    std::ofstream f(path);
    for (IpFamily fam : p.families()) f << render(p.table(fam));
  }
  int st = 0;
  std::string out = ns.sh("nft -f " + path, &st);
  std::remove(path.c_str());
  ASSERT_EQ(st, 0) << out;
}

std::unique_ptr<NetlinkBackend> open_in(NetNs& ns) {
  std::unique_ptr<NetlinkBackend> b;
  ns.run([&] {
    auto r = NetlinkBackend::open();
    if (!r) throw std::runtime_error(r.error());
    b = std::move(*r);
  });
  return b;
}

// A Monitor in `ns` that ignores `b`'s own notifications and counts the others in *seen.
std::unique_ptr<Monitor> monitor_in(NetNs& ns, const NetlinkBackend& b, std::atomic<int>* seen) {
  std::unique_ptr<Monitor> m;
  ns.run([&] {
    auto r = Monitor::start(b.port_id(), [seen] { ++*seen; });
    if (!r) throw std::runtime_error(r.error());
    m = std::move(*r);
  });
  return m;
}

Result<BatchStats> sync(NetlinkBackend& b, const Planner& p) {
  std::vector<const Table*> ts;
  for (IpFamily f : p.families()) ts.push_back(&p.table(f));
  return b.full_sync(ts);
}

// The sets of `p` a full sync has a content digest for, and those it always lists (the plain
// interval sets; the affinity map is never listed).
size_t sets_with_digest(const Planner& p) {
  size_t n = 0;
  for (IpFamily f : p.families()) n += digest_entries(p.table(f)).size();
  return n;
}
size_t sets_always_listed(const Planner& p) {
  size_t n = 0;
  for (IpFamily f : p.families()) {
    for (const auto& [name, s] : p.table(f).sets) {
      n += s.shape != SetShape::kAffinity && !digest_key(name) ? 1 : 0;
    }
  }
  return n;
}

// nft --debug=netlink prints hash set elements in hash order, which differs between two
// namespaces; the rules' order is checked by the plain listing.
std::vector<std::string> sorted_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    out.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `nft list` prints sets and chains in creation order; a table built up incrementally
// created them in another order than a fresh load. Compare the blocks as a sorted list.
std::vector<std::string> blocks(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    std::string line = s.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    cur += line + "\n";
    if (line == "\t}" || line == "}") {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  std::sort(out.begin(), out.end());
  return out;
}

// Rule handles differ between namespaces: "ip endpointd lb-2 40 39" -> "ip endpointd lb-2".
std::string strip_handles(const std::string& s) {
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    std::string line = s.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.rfind("ip endpointd ", 0) == 0 || line.rfind("ip6 endpointd ", 0) == 0) {
      while (!line.empty() &&
             (std::isdigit(static_cast<unsigned char>(line.back())) || line.back() == ' '))
        line.pop_back();
    }
    out += line + "\n";
  }
  return out;
}

void expect_same(NetNs& a, NetNs& b) {
  for (const char* fam : {"ip", "ip6"}) {
    std::string la = list(a, fam), lb = list(b, fam);
    EXPECT_FALSE(la.empty());
    EXPECT_EQ(blocks(la), blocks(lb)) << fam;
    EXPECT_EQ(sorted_lines(strip_handles(list(a, fam, true))),
              sorted_lines(strip_handles(list(b, fam, true))))
        << fam << " bytecode";
  }
}

// `p`'s tables loaded by nft from render and by a netlink full sync, each into a fresh
// namespace, list the same.
void expect_sync_lists_like_render(const Planner& p) {
  NetNs by_nft(netns::unique_prefix() + "nft"), by_netlink(netns::unique_prefix() + "nl");
  load_render(by_nft, p);
  auto b = open_in(by_netlink);
  auto r = sync(*b, p);
  ASSERT_TRUE(r.ok()) << r.error();
  expect_same(by_nft, by_netlink);
}

TEST(ProxyNetlink, FullSyncListsLikeRender) {
  Planner p(testing::node_context());
  p.reset(*testing::every_shape());
  expect_sync_lists_like_render(p);
}

// The local-traffic rules of each --detect-local-mode, cluster-ips-check with service CIDRs, and
// the LB-IP sources of the node's loadBalancerSourceRanges exception: nft itself writes and
// lists the same bytecode from the rendered text.
TEST(ProxyNetlink, DetectLocalModesAndClusterIpsCheckListLikeRender) {
  for (auto [mode, iface] : {std::pair{DetectLocal::kBridgeInterface, "cbr0"},
                             std::pair{DetectLocal::kInterfaceNamePrefix, "veth"},
                             std::pair{DetectLocal::kNodeCidr, ""}}) {
    SCOPED_TRACE(static_cast<int>(mode));
    NodeContext c = testing::node_context();
    c.detect_local = mode;
    c.local_interface = iface;
    c.node_pod_cidrs = {testing::prefix("10.244.1.0/24"), testing::prefix("fd44::/64")};
    c.service_cidrs = {testing::prefix("10.96.0.0/12"), testing::prefix("fd96::/108")};
    c.primary_ips = {testing::ip("198.51.100.20"), testing::ip("2001:db8:1::20")};
    Planner p(c);
    p.reset(*testing::every_shape());
    expect_sync_lists_like_render(p);
  }
}

// Node-local DNS's notrack chains (IPv4 and IPv6 addresses): nft writes and lists the same.
TEST(ProxyNetlink, NodeLocalDnsNotrackListsLikeRender) {
  for (const char* addr : {"169.254.20.10", "fd00::10"}) {
    SCOPED_TRACE(addr);
    NodeContext c = testing::node_context();
    c.dns_node_local = testing::ip(addr);
    c.dns_node_local_port = 53;
    Planner p(c);
    p.reset(*testing::every_shape());
    expect_sync_lists_like_render(p);
  }
}

TEST(ProxyNetlink, IncrementalChangesEndLikeAFreshLoad) {
  NetNs by_nft(netns::unique_prefix() + "nft"), by_netlink(netns::unique_prefix() + "nl");
  Planner p(testing::node_context());
  auto s1 = testing::every_shape(1);
  p.reset(*s1);
  auto b = open_in(by_netlink);
  ASSERT_TRUE(sync(*b, p).ok());
  // Scale web from 2 to 3 endpoints, drop dns, give empty an endpoint.
  std::vector<model::ServiceStatePtr> v;
  for (const auto& st : s1->services) {
    if (st->key().name == "dns") continue;
    if (st->key().name == "web") {
      auto eps = st->endpoints;
      eps.push_back(testing::endpoint("10.244.1.9", 8080));
      v.push_back(testing::state(st->service, eps));
    } else if (st->key().name == "empty") {
      v.push_back(testing::state(st->service, {testing::endpoint("10.244.1.10", 8080)}));
    } else {
      v.push_back(st);
    }
  }
  auto s2 = testing::snapshot(2, v);
  auto changes = p.update(*s2, model::diff(s1.get(), *s2));
  auto r = b->apply(changes);
  ASSERT_TRUE(r.ok()) << r.error();
  load_render(by_nft, p);
  expect_same(by_nft, by_netlink);  // the digests set included: each change kept its set's
  // A restarted agent over it trusts every digest: nothing listed but the interval sets.
  auto again = sync(*open_in(by_netlink), p);
  ASSERT_TRUE(again.ok()) << again.error();
  EXPECT_EQ(again->elements, 0u);
  EXPECT_EQ(again->sets_unchanged, sets_with_digest(p));
}

TEST(ProxyNetlink, FullSyncReconcilesWithoutDeletingTheTable) {
  NetNs by_nft(netns::unique_prefix() + "nft"), by_netlink(netns::unique_prefix() + "nl");
  auto b = open_in(by_netlink);
  Planner old_plan(testing::node_context());
  old_plan.reset(*testing::every_shape());
  ASSERT_TRUE(sync(*b, old_plan).ok());
  // Something extra that a full sync must remove, and a handle that must survive.
  by_netlink.sh("nft add chain ip endpointd stray");
  std::string handle_before = by_netlink.sh("nft -a list chain ip endpointd nat-prerouting");

  Planner p(testing::node_context());
  p.reset(*testing::snapshot(
      5, {testing::state(testing::service("only", {testing::ip("10.96.1.1")}, 80),
                         {testing::endpoint("10.244.1.2", 8080)})}));
  auto b2 = open_in(by_netlink);  // a restarted agent
  auto r = sync(*b2, p);
  ASSERT_TRUE(r.ok()) << r.error();
  load_render(by_nft, p);
  expect_same(by_nft, by_netlink);
  // The base chain was not recreated (its handle is the same): no flush, no gap.
  auto handle_of = [](const std::string& s) { return s.substr(s.find("# handle"), 12); };
  EXPECT_EQ(handle_of(handle_before),
            handle_of(by_netlink.sh("nft -a list chain ip endpointd nat-prerouting")));
}

// An agent restarted over its own rules: the full sync lists what the kernel holds and sends
// only the difference. Nothing differs: no element is deleted or added again.
TEST(ProxyNetlink, FullSyncOverRulesInPlaceChangesNoElement) {
  NetNs ns(netns::unique_prefix() + "rst"), by_nft(netns::unique_prefix() + "nft");
  Planner p(testing::node_context());
  p.reset(*testing::every_shape());
  auto b = open_in(ns);
  auto first = sync(*b, p);
  ASSERT_TRUE(first.ok()) << first.error();
  size_t total = p.table(IpFamily::kV4).element_count() + p.table(IpFamily::kV6).element_count();
  EXPECT_EQ(first->elements, total) << "a fresh namespace gets every element";
  ASSERT_GT(total, 10u);
  std::string before4 = list(ns, "ip"), before6 = list(ns, "ip6");

  auto b2 = open_in(ns);  // a restarted agent, same state
  auto again = sync(*b2, p);
  ASSERT_TRUE(again.ok()) << again.error();
  EXPECT_EQ(again->elements, 0u);
  EXPECT_EQ(list(ns, "ip"), before4);
  EXPECT_EQ(list(ns, "ip6"), before6);
  // Every set with a digest was left alone by it, unlisted; only the interval sets were listed.
  EXPECT_EQ(again->sets_unchanged, sets_with_digest(p));
  EXPECT_GT(again->sets_unchanged, 10u);
  EXPECT_EQ(again->sets_listed, sets_always_listed(p));

  // Someone else's element and one of endpointd's gone (the monitor reports it: digests are
  // not trusted): exactly those two are repaired, every set listed.
  ns.sh("nft add element ip endpointd no-endpoint-drop { 10.9.9.9 . tcp . 99 }");
  ns.sh("nft flush set ip endpointd hairpin");
  size_t hairpin = p.table(IpFamily::kV4).sets.at("hairpin").elements.size();
  ASSERT_GT(hairpin, 0u);
  b2->distrust_digests();
  auto repaired = sync(*b2, p);
  ASSERT_TRUE(repaired.ok()) << repaired.error();
  EXPECT_EQ(repaired->elements, 1 + hairpin);
  EXPECT_EQ(repaired->sets_unchanged, 0u);
  EXPECT_EQ(repaired->sets_listed, sets_with_digest(p) + sets_always_listed(p));
  load_render(by_nft, p);
  expect_same(by_nft, ns);
  // Repaired: the digests hold again and the next full sync lists nothing it need not.
  auto next = sync(*b2, p);
  ASSERT_TRUE(next.ok()) << next.error();
  EXPECT_EQ(next->elements, 0u);
  EXPECT_EQ(next->sets_unchanged, sets_with_digest(p));
}

// `n` ClusterIP services with one endpoint each: cluster-ips, service-ips and backends-1 hold
// n elements each (service-lb none: it has only externalTrafficPolicy Local keys).
model::SnapshotPtr services(uint64_t g, int n) {
  std::vector<model::ServiceStatePtr> v;
  for (int i = 0; i < n; ++i) {
    std::string vip = "10.97." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    std::string pod = "10.244." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    char name[16];
    std::snprintf(name, sizeof name, "s%04d", i);
    v.push_back(testing::state(testing::service(name, {testing::ip(vip.c_str())}, 80),
                               {testing::endpoint(pod.c_str(), 8080)}));
  }
  return testing::snapshot(g, std::move(v));
}

// Hash sets are made with a size (room to double): the kernel refuses an element beyond it, so
// a change that would overfill one does not fit, and a full sync makes the set anew, larger —
// without listing it, every element in place after it, and a restart over it changes nothing.
TEST(ProxyNetlink, SetsThatOutgrowTheirSizeAreMadeAnewLarger) {
  NetNs ns(netns::unique_prefix() + "grow"), by_nft(netns::unique_prefix() + "nft");
  NodeContext c = testing::node_context();
  Planner p(c);
  auto s1 = services(1, 500);
  p.reset(*s1);
  auto b = open_in(ns);
  ASSERT_TRUE(sync(*b, p).ok());
  EXPECT_NE(ns.sh("nft list set ip endpointd cluster-ips").find("size 1024"), std::string::npos);
  // One more service fits.
  auto s2 = services(2, 501);
  auto small = p.update(*s2, model::diff(s1.get(), *s2));
  EXPECT_TRUE(b->fits(small));
  ASSERT_TRUE(b->apply(small).ok());
  // 600 more do not: the kernel would refuse the batch (ENFILE), and fits() says so first.
  auto s3 = services(3, 1101);
  auto big = p.update(*s3, model::diff(s2.get(), *s3));
  EXPECT_FALSE(b->fits(big));
  auto refused = b->apply(big);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find(std::strerror(ENFILE)), std::string::npos) << refused.error();
  // The full sync instead: the sets that outgrew 1024 are made anew with room for 2 x 1101.
  auto grown = sync(*b, p);
  ASSERT_TRUE(grown.ok()) << grown.error();
  std::string ips = ns.sh("nft list set ip endpointd cluster-ips");
  EXPECT_NE(ips.find("size 4096"), std::string::npos) << ips.substr(0, 200);
  EXPECT_NE(ips.find("10.97.4.101"), std::string::npos);  // the 1101st service's
  load_render(by_nft, p);
  expect_same(by_nft, ns);
  // A restart over it: nothing changed, nothing listed but the interval sets.
  auto again = sync(*open_in(ns), p);
  ASSERT_TRUE(again.ok()) << again.error();
  EXPECT_EQ(again->elements, 0u);
  EXPECT_EQ(again->sets_unchanged, sets_with_digest(p));
}

// An agent restarted after services changed while it was down lists only the sets whose
// content digest differs from the kernel's, and sends only the difference.
TEST(ProxyNetlink, RestartAfterChangesListsOnlyTheSetsThatDiffer) {
  NetNs ns(netns::unique_prefix() + "chg"), by_nft(netns::unique_prefix() + "nft");
  auto s1 = testing::every_shape(1);
  Planner old_plan(testing::node_context());
  old_plan.reset(*s1);
  ASSERT_TRUE(sync(*open_in(ns), old_plan).ok());
  // web gains an endpoint while no agent runs.
  std::vector<model::ServiceStatePtr> v;
  for (const auto& st : s1->services) {
    if (st->key().name != "web") {
      v.push_back(st);
      continue;
    }
    auto eps = st->endpoints;
    eps.push_back(testing::endpoint("10.244.1.9", 8080));
    v.push_back(testing::state(st->service, eps));
  }
  Planner p(testing::node_context());
  p.reset(*testing::snapshot(2, v));
  auto r = sync(*open_in(ns), p);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_GT(r->elements, 0u);
  EXPECT_GT(r->sets_unchanged, 0u);
  EXPECT_LT(r->sets_listed, sets_with_digest(p) + sets_always_listed(p));
  EXPECT_GT(r->sets_listed, sets_always_listed(p));
  load_render(by_nft, p);
  expect_same(by_nft, ns);
}

TEST(ProxyNetlink, CleanupDeletesBothTables) {
  NetNs ns(netns::unique_prefix() + "clean");
  auto b = open_in(ns);
  Planner p(testing::node_context());
  p.reset(*testing::every_shape());
  ASSERT_TRUE(sync(*b, p).ok());
  auto r = b->cleanup();
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(ns.sh("nft list tables"), "");
  EXPECT_TRUE(b->cleanup().ok());  // nothing left: still fine
}

TEST(ProxyNetlink, MonitorSeesForeignChangesOnly) {
  NetNs ns(netns::unique_prefix() + "mon");
  auto b = open_in(ns);
  std::atomic<int> seen{0};
  auto m = monitor_in(ns, *b, &seen);
  Planner p(testing::node_context());
  p.reset(*testing::every_shape());
  ASSERT_TRUE(sync(*b, p).ok());
  ns.sh("nft add table ip other");                              // not ours
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let notifications drain
  EXPECT_EQ(seen.load(), 0);
  EXPECT_EQ(ns.sh("nft flush chain ip endpointd svc-internal"), "");
  for (int i = 0; i < 100 && seen.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GT(seen.load(), 0);
}

// A quiet full sync: the monitor leaves its group around endpointd's own batch, so the
// kernel sends it nothing for it; a commit by someone else inside that window is caught by
// the ruleset generation, reported as a foreign change, and the next full sync listens.
TEST(ProxyNetlink, QuietFullSyncSendsNoNotificationsAndCatchesACommitInItsWindow) {
  NetNs ns(netns::unique_prefix() + "quiet");
  auto b = open_in(ns);
  std::atomic<int> seen{0};
  auto m = monitor_in(ns, *b, &seen);
  auto wait_for = [](const std::function<bool()>& done) {
    for (int i = 0; i < 200 && !done(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return done();
  };
  Planner p(testing::node_context());
  p.reset(*testing::every_shape());

  // Listening: the kernel notifies the monitor of every object of endpointd's batch.
  ASSERT_TRUE(sync(*b, p).ok());
  ASSERT_TRUE(wait_for([&] { return m->own_notifications() > 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the rest of them
  const uint64_t own = m->own_notifications();

  // Quiet: nothing, and the generation moved by endpointd's one batch.
  std::vector<bool> calls;
  bool commit_in_window = false;
  b->set_quiet_full_sync(
      [&](bool on) {
        calls.push_back(on);
        bool ok = m->listen(on);
        if (!on && commit_in_window) ns.sh("nft add table ip other");
        return ok;
      },
      [&] { m->report_foreign(); });
  auto g0 = b->ruleset_generation();
  ASSERT_TRUE(g0.ok()) << g0.error();
  ASSERT_TRUE(sync(*b, p).ok());
  auto g1 = b->ruleset_generation();
  ASSERT_TRUE(g1.ok()) << g1.error();
  EXPECT_EQ(*g1 - *g0, 1u);  // endpointd's batch, nobody else's
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(m->own_notifications(), own);
  EXPECT_EQ(calls, (std::vector<bool>{false, true}));
  EXPECT_EQ(b->quiet_stats().quiet, 1u);
  EXPECT_EQ(b->quiet_stats().foreign, 0u);
  EXPECT_EQ(seen.load(), 0);

  // Someone else commits while nobody listens: reported through the monitor.
  calls.clear();
  commit_in_window = true;
  ASSERT_TRUE(sync(*b, p).ok());
  commit_in_window = false;
  EXPECT_EQ(calls, (std::vector<bool>{false, true}));
  EXPECT_EQ(b->quiet_stats().foreign, 1u);
  EXPECT_TRUE(wait_for([&] { return seen.load() > 0; }));
  EXPECT_EQ(m->foreign_changes(), 1u);

  // So the next full sync keeps listening (its notifications arrive), and the one after is
  // quiet again.
  calls.clear();
  ASSERT_TRUE(sync(*b, p).ok());
  EXPECT_TRUE(calls.empty());
  EXPECT_TRUE(wait_for([&] { return m->own_notifications() > own; }));
  ASSERT_TRUE(sync(*b, p).ok());
  EXPECT_EQ(calls, (std::vector<bool>{false, true}));
  EXPECT_EQ(b->quiet_stats().quiet, 3u);
}

// Not a benchmark (bench/ owns those): prints what a full sync of 10,000 services x 10
// endpoints and a one-endpoint change cost here, and checks they are accepted.
TEST(ProxyNetlink, ScaleFullSyncAndOneEndpointChange) {
  NetNs ns(netns::unique_prefix() + "scale");
  std::vector<model::ServiceStatePtr> v;
  for (int i = 0; i < 10000; ++i) {
    std::string vip = "10.96." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    std::vector<model::MergedEndpoint> eps;
    for (int j = 0; j < 10; ++j) {
      int n = i * 10 + j;
      std::string a = "10." + std::to_string(100 + n / 65536) + "." +
                      std::to_string((n / 256) % 256) + "." + std::to_string(n % 256);
      eps.push_back(testing::endpoint(a.c_str(), 8080));
    }
    v.push_back(testing::state(
        testing::service("s" + std::to_string(i), {testing::ip(vip.c_str())}, 80), eps));
  }
  auto s1 = testing::snapshot(1, v);
  NodeContext ctx = testing::node_context();
  Planner p(ctx);
  auto t0 = std::chrono::steady_clock::now();
  p.reset(*s1);
  auto t1 = std::chrono::steady_clock::now();
  auto b = open_in(ns);
  auto r = sync(*b, p);
  auto t2 = std::chrono::steady_clock::now();
  ASSERT_TRUE(r.ok()) << r.error();
  // A restart over these rules: everything listed, nothing changed. Not at once: the kernel
  // grows the big sets in a deferred rehash after the insert, and a dump taken meanwhile is
  // listed again (or, never settling, the set is filled anew); no agent restarts that fast.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  auto restarted = open_in(ns);
  auto t5 = std::chrono::steady_clock::now();
  auto rr = sync(*restarted, p);
  auto t6 = std::chrono::steady_clock::now();
  ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(rr->elements, 0u) << restarted->unsettled_dumps() << " dumps taken again";
  // One endpoint of one service leaves.
  auto old = v[5000];
  auto eps = old->endpoints;
  eps.pop_back();
  v[5000] = testing::state(old->service, eps);
  auto s2 = testing::snapshot(2, v);
  auto t3 = std::chrono::steady_clock::now();
  auto changes = p.update(*s2, model::diff(s1.get(), *s2));
  auto r2 = b->apply(changes);
  auto t4 = std::chrono::steady_clock::now();
  ASSERT_TRUE(r2.ok()) << r2.error();
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf(
      "plan %.1f ms; full sync %.1f ms (%zu messages, %zu bytes, %zu elements); "
      "restart's full sync %.1f ms (%zu elements changed); "
      "one endpoint change %.2f ms (%zu messages, %zu bytes)\n",
      ms(t1 - t0), ms(t2 - t1), r->messages, r->bytes, p.table(IpFamily::kV4).element_count(),
      ms(t6 - t5), rr->elements, ms(t4 - t3), r2->messages, r2->bytes);
  EXPECT_EQ(ns.sh("nft list set ip endpointd hairpin | grep -c '10.100.0.1 . 10.100.0.1'"), "1\n");
}

}  // namespace
}  // namespace endpointd::proxy
