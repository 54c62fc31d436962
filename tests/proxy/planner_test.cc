#include <gtest/gtest.h>

#include <map>
#include <set>

#include "proxy/planner.h"
#include "proxy/render.h"
#include "tests/proxy/fixtures.h"

namespace endpointd::proxy {
namespace {

std::optional<Element> find(const Table& t, const std::string& set, const std::string& key) {
  auto s = t.sets.find(set);
  if (s == t.sets.end()) return std::nullopt;
  return s->second.elements.get(key);
}

std::string vip(const char* a, uint8_t proto, uint16_t port) {
  return addr_field(testing::ip(a)) + proto_field(proto) + port_field(port);
}

// ElementMap::put runs on the proxy sink's thread: an element it cannot hold is an error that
// names what was wrong, never an exception, and leaves the map as it was.
TEST(ProxyElementMap, TooManyGotoTargetsIsAnErrorNamingTheTarget) {
  ElementMap m;
  auto element = [](int i, const std::string& chain) {
    return Element{port_field(static_cast<uint16_t>(i)), {}, {}, Verdict::kGoto, chain};
  };
  for (int i = 1; i <= static_cast<int>(ElementMap::kMaxChains); ++i) {
    auto r = m.put(element(i, "chain-" + std::to_string(i)));
    ASSERT_TRUE(r) << r.error();
  }
  // A target already in use still fits.
  ASSERT_TRUE(m.put(element(1000, "chain-7")));
  Result<std::optional<Element>> r = std::optional<Element>();
  EXPECT_NO_THROW(r = m.put(element(1001, "chain-256")));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("goto chain-256"), std::string::npos) << r.error();
  EXPECT_NE(r.error().find("255"), std::string::npos) << r.error();
  EXPECT_EQ(m.size(), ElementMap::kMaxChains + 1);
  EXPECT_FALSE(m.contains(port_field(1001)));
  // Replacing an element with one the map refuses keeps the old one.
  Result<std::optional<Element>> again = std::optional<Element>();
  EXPECT_NO_THROW(again = m.put(element(1000, "chain-257")));
  ASSERT_FALSE(again);
  EXPECT_EQ(m.get(port_field(1000))->chain, "chain-7");
}

TEST(ProxyElementMap, OverlongFieldsAndDataWithAKeyEndAreErrors) {
  ElementMap m;
  std::string too_long(ElementMap::kMaxBytes + 1, 'x');
  Result<std::optional<Element>> r = std::optional<Element>();
  EXPECT_NO_THROW(r = m.put(Element{too_long, {}, {}, Verdict::kNone, {}}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("key of 45 bytes"), std::string::npos) << r.error();
  EXPECT_NO_THROW(r = m.put(Element{"k", {}, too_long, Verdict::kNone, {}}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("data of 45 bytes"), std::string::npos) << r.error();
  EXPECT_NO_THROW(r = m.put(Element{"k", too_long, {}, Verdict::kNone, {}}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("key end of 45 bytes"), std::string::npos) << r.error();
  EXPECT_NO_THROW(r = m.put(Element{"k", "z", "d", Verdict::kNone, {}}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("both data and a key end"), std::string::npos) << r.error();
  EXPECT_TRUE(m.empty());
  // The longest field there is fits.
  std::string longest(ElementMap::kMaxBytes, 'y');
  r = m.put(Element{longest, longest, {}, Verdict::kNone, {}});
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(m.get(longest)->key_end, longest);
}

TEST(ProxyPlanner, SetsAndChainsDoNotGrowWithServices) {
  Planner p(testing::node_context());
  std::vector<model::ServiceStatePtr> v;
  for (int i = 0; i < 200; ++i) {
    std::string a = "10.96.1." + std::to_string(i + 1);
    v.push_back(testing::state(
        testing::service("s" + std::to_string(i), {testing::ip(a.c_str())}, 80),
        {testing::endpoint("10.244.1.2", 8080), testing::endpoint("10.244.1.3", 8080)}));
  }
  p.reset(*testing::snapshot(1, v));
  const Table& t = p.table(IpFamily::kV4);
  EXPECT_EQ(t.sets.size(), 12u);  // 11 fixed (affinity and cluster-ips included) + backends-2
  EXPECT_EQ(t.sets.at("cluster-ips").elements.size(), 200u);
  EXPECT_EQ(t.sets.at("backends-2").elements.size(), 400u);
  EXPECT_EQ(t.sets.at("hairpin").elements.size(), 2u);
}

TEST(ProxyPlanner, EveryShape) {
  Planner p(testing::node_context());
  p.reset(*testing::every_shape());
  const Table& t = p.table(IpFamily::kV4);
  EXPECT_NE(find(t, "no-endpoint-reject", vip("10.96.0.11", 6, 80)), std::nullopt);
  // ClientIP affinity: service-ips chooses lb-affinity's class chain; service-lb holds only
  // externalTrafficPolicy Local keys.
  EXPECT_EQ(find(t, "service-ips", vip("10.96.0.12", 17, 53))->chain, "svc-internal-affinity");
  EXPECT_EQ(find(t, "service-lb", vip("10.96.0.12", 17, 53)), std::nullopt);
  EXPECT_NE(find(t, "service-lb", vip("203.0.113.7", 6, 443)), std::nullopt);
  EXPECT_NE(find(t, "backends-3", vip("10.96.0.12", 17, 53) + u32_field(2)), std::nullopt);
  EXPECT_EQ(find(t, "service-ips", vip("203.0.113.7", 6, 443))->chain, "svc-external-local");
  // NodePort with externalTrafficPolicy Local: this node's one endpoint.
  EXPECT_NE(find(t, "local-backends-1", vip("192.168.50.1", 6, 30443) + u32_field(0)),
            std::nullopt);
  EXPECT_NE(find(t, "firewall-ips", vip("203.0.113.7", 6, 443)), std::nullopt);
  EXPECT_EQ(find(t, "firewall-ips", vip("203.0.113.8", 6, 443)),
            std::nullopt);  // externalIP: no firewall
  // internalTrafficPolicy Local without a local endpoint: drop, counted.
  EXPECT_NE(find(t, "no-endpoint-drop", vip("10.96.0.14", 132, 9000)), std::nullopt);
  EXPECT_EQ(find(t, "no-endpoint-reject", vip("10.96.0.14", 132, 9000)), std::nullopt);
  EXPECT_EQ(p.no_local_internal(), 1u);
  // Terminating fallback: the serving terminating endpoint is used.
  EXPECT_NE(find(t, "backends-1", vip("10.96.0.15", 6, 80) + u32_field(0)), std::nullopt);
  // One lb rule per backend-map size in use; local-lb ends in drop.
  EXPECT_EQ(t.chains.at("lb").rules.size(), 3u);  // sizes 1, 2, 3
  EXPECT_EQ(t.chains.at("local-lb").rules.back().shape, RuleShape::kDrop);
  // IPv6: the LB's only endpoint is on another node -> no local backends, local-lb drops.
  const Table& t6 = p.table(IpFamily::kV6);
  EXPECT_EQ(t6.sets.count("local-backends-1"), 0u);
  EXPECT_EQ(p.no_local_external(), 1u);
  // Hairpin: only endpoints on this node.
  EXPECT_NE(find(t, "hairpin",
                 addr_field(testing::ip("10.244.1.4")) + addr_field(testing::ip("10.244.1.4"))),
            std::nullopt);
  EXPECT_EQ(find(t, "hairpin",
                 addr_field(testing::ip("10.244.2.4")) + addr_field(testing::ip("10.244.2.4"))),
            std::nullopt);
}

// A forwarded packet of an established flow meets one test, a new connection a service has
// translated two; only an untranslated new connection goes on to the checks of destinations no
// service port took (their keys are the original destination, which DNAT has replaced).
TEST(ProxyPlanner, ForwardedPacketsLeaveBeforeTheChecksOnceEstablishedOrTranslated) {
  Planner p(testing::node_context());
  p.reset(*testing::every_shape());
  for (IpFamily fam : {IpFamily::kV4, IpFamily::kV6}) {
    const auto& rules = p.table(fam).chains.at("filter-forward").rules;
    ASSERT_EQ(rules.size(), 4u);
    EXPECT_EQ(rules[0].shape, RuleShape::kAcceptEstablished);
    EXPECT_EQ(rules[1].shape, RuleShape::kAcceptDnat);
    EXPECT_EQ(rules[2].shape, RuleShape::kCtNewJump);
    EXPECT_EQ(rules[2].target, "service-endpoints-check");
    EXPECT_EQ(rules[3].shape, RuleShape::kCtNewJump);
    EXPECT_EQ(rules[3].target, "cluster-ips-check");
  }
}

// Node-local DNS: two raw-priority chains in the address's family only, as NodeLocal
// DNSCache's NOTRACK rules (queries in prerouting; answers and the node's own queries in output).
TEST(ProxyPlanner, NodeLocalDnsNotrackChainsInItsFamilyOnly) {
  NodeContext c = testing::node_context();
  Planner off(c);
  off.reset(*testing::every_shape());
  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    EXPECT_EQ(off.table(f).chains.count(names::kDnsNotrackPrerouting), 0u);
    EXPECT_EQ(off.table(f).chains.count(names::kDnsNotrackOutput), 0u);
  }
  c.dns_node_local = testing::ip("169.254.20.10");
  c.dns_node_local_port = 53;
  Planner p(c);
  p.reset(*testing::every_shape());
  const Table& t = p.table(IpFamily::kV4);
  const Chain& pre = t.chains.at(names::kDnsNotrackPrerouting);
  ASSERT_TRUE(pre.base);
  EXPECT_EQ(*pre.base, (BaseHook{"filter", "prerouting", -300}));
  std::vector<std::string> pre_rules, out_rules;
  for (const auto& r : pre.rules) pre_rules.push_back(render_rule(IpFamily::kV4, r));
  const Chain& out = t.chains.at(names::kDnsNotrackOutput);
  EXPECT_EQ(*out.base, (BaseHook{"filter", "output", -300}));
  for (const auto& r : out.rules) out_rules.push_back(render_rule(IpFamily::kV4, r));
  EXPECT_EQ(pre_rules, (std::vector<std::string>{
                           "ip daddr 169.254.20.10 udp dport 53 notrack",
                           "ip daddr 169.254.20.10 tcp dport 53 notrack",
                       }));
  EXPECT_EQ(out_rules, (std::vector<std::string>{
                           "ip daddr 169.254.20.10 udp dport 53 notrack",
                           "ip daddr 169.254.20.10 tcp dport 53 notrack",
                           "ip saddr 169.254.20.10 udp sport 53 notrack",
                           "ip saddr 169.254.20.10 tcp sport 53 notrack",
                       }));
  EXPECT_EQ(p.table(IpFamily::kV6).chains.count(names::kDnsNotrackPrerouting), 0u);
  EXPECT_EQ(t.chains.size(), off.table(IpFamily::kV4).chains.size() + 2);

  // An IPv6 address and another port: the ip6 table's chains.
  c.dns_node_local = testing::ip("fd00::10");
  c.dns_node_local_port = 5353;
  Planner p6(c);
  p6.reset(*testing::every_shape());
  EXPECT_EQ(p6.table(IpFamily::kV4).chains.count(names::kDnsNotrackOutput), 0u);
  const Chain& out6 = p6.table(IpFamily::kV6).chains.at(names::kDnsNotrackOutput);
  ASSERT_EQ(out6.rules.size(), 4u);
  EXPECT_EQ(render_rule(IpFamily::kV6, out6.rules[3]), "ip6 saddr fd00::10 tcp sport 5353 notrack");
}

// The rule the local-traffic test takes in each mode, in the two chains that use it.
TEST(ProxyPlanner, DetectLocalModesServiceCidrsAndTheNodesLoadBalancerException) {
  auto rules = [](const Planner& p, const char* chain) {
    std::vector<std::string> out;
    for (const auto& r : p.table(IpFamily::kV4).chains.at(chain).rules)
      out.push_back(render_rule(IpFamily::kV4, r));
    return out;
  };
  NodeContext c = testing::node_context();
  c.ipv6 = false;
  c.detect_local = DetectLocal::kBridgeInterface;
  c.local_interface = "cbr0";
  Planner bridge(c);
  bridge.reset(*testing::every_shape());
  EXPECT_EQ(rules(bridge, "svc-internal")[0], "iifname != \"cbr0\" jump mark-for-masquerade");
  EXPECT_EQ(rules(bridge, "svc-external-local")[0],
            "iifname \"cbr0\" ip daddr . meta l4proto . th dport vmap @service-lb");
  EXPECT_TRUE(bridge.table(IpFamily::kV4).sets.at("cluster-cidrs").elements.empty());

  c.detect_local = DetectLocal::kInterfaceNamePrefix;
  c.local_interface = "veth";
  Planner prefix(c);
  prefix.reset(*testing::every_shape());
  EXPECT_EQ(rules(prefix, "svc-internal")[0], "iifname != \"veth*\" jump mark-for-masquerade");

  // NodeCIDR: the Node object's podCIDRs, not --cluster-cidr; none yet: no local traffic.
  c.detect_local = DetectLocal::kNodeCidr;
  Planner no_node(node_context_from(c, *testing::every_shape()));
  no_node.reset(*testing::every_shape());
  EXPECT_EQ(rules(no_node, "svc-internal"), std::vector<std::string>{"goto lb"});
  auto with_node = std::make_shared<model::Snapshot>(*testing::every_shape());
  auto n = std::make_shared<model::Node>();
  n->name = "node-a";
  n->pod_cidrs = {testing::prefix("10.244.1.0/24"), testing::prefix("fd44::/64")};
  with_node->nodes.push_back(n);
  NodeContext nc = node_context_from(c, *with_node);
  Planner node_cidr(nc);
  node_cidr.reset(*with_node);
  const Table& t = node_cidr.table(IpFamily::kV4);
  EXPECT_EQ(rules(node_cidr, "svc-internal")[0],
            "ip saddr != @cluster-cidrs jump mark-for-masquerade");
  ASSERT_EQ(t.sets.at("cluster-cidrs").elements.size(), 1u);
  EXPECT_EQ((*t.sets.at("cluster-cidrs").elements.begin()).key,
            addr_field(testing::ip("10.244.1.0")));

  // cluster-ips-check: unserved ports of cluster IPs refused; the service CIDRs dropped only
  // when given.
  EXPECT_EQ(rules(node_cidr, "cluster-ips-check"),
            std::vector<std::string>{"ip daddr @cluster-ips goto reject-chain"});
  EXPECT_TRUE(t.sets.at("cluster-ips").elements.contains(addr_field(testing::ip("10.96.0.12"))));
  EXPECT_FALSE(t.sets.at("cluster-ips").elements.contains(addr_field(testing::ip("203.0.113.7"))));
  nc.service_cidrs = {testing::prefix("10.96.0.0/12"), testing::prefix("fd96::/108")};
  node_cidr.set_context(nc);
  node_cidr.reset(*with_node);
  EXPECT_EQ(rules(node_cidr, "cluster-ips-check"),
            (std::vector<std::string>{"ip daddr @cluster-ips goto reject-chain",
                                      "ip daddr @service-cidrs drop"}));
  EXPECT_EQ(node_cidr.table(IpFamily::kV4).sets.at("service-cidrs").elements.size(), 1u);

  // loadBalancerSourceRanges: the LB IPs become allowed sources only when a range holds the
  // node's (primary) IP.
  auto allow_lb = [](const Planner& p) {
    std::string key = vip("203.0.113.7", 6, 443) + addr_field(testing::ip("203.0.113.7"));
    return p.table(IpFamily::kV4).sets.at("firewall-allow").elements.contains(key);
  };
  EXPECT_FALSE(allow_lb(node_cidr));  // the fixture's range 198.51.100.0/24 lacks 192.168.50.1
  NodeContext in_range = nc;
  in_range.primary_ips = {testing::ip("198.51.100.20")};
  node_cidr.set_context(in_range);
  node_cidr.reset(*with_node);
  EXPECT_TRUE(allow_lb(node_cidr));
}

// kube-proxy's nodePortAddresses default, "primary": NodePorts on the Node object's first
// InternalIP per family (else ExternalIP), following the Node; CIDRs select among every node
// address; without a Node object, every address (a manifest directory without one).
TEST(ProxyPlanner, NodePortsOnPrimaryIpsByDefaultAndOnCidrSelectedAddresses) {
  NodeContext base = testing::node_context();
  base.node_ips = {testing::ip("192.168.50.1"), testing::ip("10.1.0.5"), testing::ip("fd50::1")};
  auto with_node = [&](std::vector<model::NodeAddress> addrs) {
    auto snap = std::make_shared<model::Snapshot>(*testing::every_shape());
    auto n = std::make_shared<model::Node>();
    n->name = "node-a";
    n->addresses = std::move(addrs);
    snap->nodes = {n};
    return snap;
  };
  auto served = [](const NodeContext& c) {
    std::vector<std::string> out;
    for (const auto& a : node_port_ips(c)) out.push_back(a.str());
    return out;
  };
  // No Node object yet: every address.
  EXPECT_EQ(served(base), (std::vector<std::string>{"192.168.50.1", "10.1.0.5", "fd50::1"}));
  auto snap = with_node({{"Hostname", "node-a"},
                         {"ExternalIP", "203.0.113.9"},
                         {"InternalIP", "10.1.0.5"},
                         {"InternalIP", "10.1.0.6"}});
  NodeContext c = node_context_from(base, *snap);
  EXPECT_EQ(served(c), std::vector<std::string>{"10.1.0.5"});
  Planner p(c);
  p.reset(*snap);
  const Table& t = p.table(IpFamily::kV4);
  EXPECT_NE(find(t, "local-backends-1", vip("10.1.0.5", 6, 30443) + u32_field(0)), std::nullopt);
  EXPECT_EQ(find(t, "local-backends-1", vip("192.168.50.1", 6, 30443) + u32_field(0)),
            std::nullopt);
  EXPECT_EQ(find(t, "local-backends-1", vip("203.0.113.9", 6, 30443) + u32_field(0)), std::nullopt);
  // The Node's InternalIP changes: NodePorts move with it at the next plan.
  auto moved = with_node({{"InternalIP", "10.1.0.7"}});
  NodeContext c2 = node_context_from(base, *moved);
  EXPECT_EQ(served(c2), std::vector<std::string>{"10.1.0.7"});
  p.set_context(c2);
  p.reset(*moved);
  EXPECT_NE(
      find(p.table(IpFamily::kV4), "local-backends-1", vip("10.1.0.7", 6, 30443) + u32_field(0)),
      std::nullopt);
  // Only an ExternalIP: that one.
  EXPECT_EQ(served(node_context_from(base, *with_node({{"ExternalIP", "203.0.113.9"}}))),
            std::vector<std::string>{"203.0.113.9"});
  // CIDRs: the node's addresses within them, primary or not.
  c.node_port_addresses = {testing::prefix("192.168.0.0/16"), testing::prefix("fd50::/64")};
  EXPECT_EQ(served(c), (std::vector<std::string>{"192.168.50.1", "fd50::1"}));
}

TEST(ProxyPlanner, OneEndpointChangeIsASmallChange) {
  Planner p(testing::node_context());
  auto s1 = testing::every_shape(1);
  p.reset(*s1);
  std::vector<model::ServiceStatePtr> v;
  for (const auto& st : s1->services) {
    if (st->key().name != "term") {
      v.push_back(st);
      continue;
    }
    v.push_back(testing::state(st->service, {testing::endpoint("10.244.1.8", 8080)}));
  }
  auto s2 = testing::snapshot(2, v);
  auto ch = p.update(*s2, model::diff(s1.get(), *s2));
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_TRUE(ch[0].add_sets.empty());
  EXPECT_TRUE(ch[0].del_sets.empty());
  // backends-1 element replaced, hairpin element replaced.
  EXPECT_EQ(ch[0].del_elements.size(), 2u);
  EXPECT_EQ(ch[0].add_elements.size(), 2u);
  // The planner's table equals a fresh plan of the new snapshot.
  Planner fresh(testing::node_context());
  fresh.reset(*s2);
  EXPECT_EQ(render(p.table(IpFamily::kV4)), render(fresh.table(IpFamily::kV4)));
}

// An endpoint leaving moves the service's elements to the next smaller backend map: no verdict
// element changes (the kernel would re-validate every jump), the lb chains get their rules
// rewritten only when a map size appears or goes.
TEST(ProxyPlanner, EndpointCountChangeTouchesNoVerdict) {
  Planner p(testing::node_context());
  auto web = testing::service("web", {testing::ip("10.96.0.10")}, 80);
  auto other = testing::service("other", {testing::ip("10.96.0.11")}, 80);
  std::vector<model::MergedEndpoint> three = {testing::endpoint("10.244.1.2", 8080),
                                              testing::endpoint("10.244.1.3", 8080),
                                              testing::endpoint("10.244.1.4", 8080)};
  std::vector<model::MergedEndpoint> two(three.begin(), three.begin() + 2);
  auto s1 = testing::snapshot(1, {testing::state(web, three), testing::state(other, two)});
  p.reset(*s1);
  auto s2 = testing::snapshot(2, {testing::state(web, two), testing::state(other, two)});
  auto ch = p.update(*s2, model::diff(s1.get(), *s2));
  ASSERT_EQ(ch.size(), 1u);
  for (const auto& [set, e] : ch[0].add_elements) EXPECT_EQ(e.verdict, Verdict::kNone) << set;
  for (const auto& [set, e] : ch[0].del_elements) EXPECT_EQ(e.verdict, Verdict::kNone) << set;
  // backends-3 went away: its set is deleted and the lb chains rewritten without it.
  EXPECT_EQ(ch[0].del_sets, std::vector<std::string>{"backends-3"});
  ASSERT_EQ(ch[0].replace_chains.size(), 3u);  // lb, local-lb, affinity-record
  EXPECT_EQ(ch[0].replace_chains[0].name, "lb");
  EXPECT_EQ(ch[0].replace_chains[0].rules.size(), 1u);
  // The same change again between sizes that stay in use: elements only.
  auto keep = testing::service("keep", {testing::ip("10.96.0.12")}, 80);
  auto s3 = testing::snapshot(
      3, {testing::state(web, three), testing::state(other, two), testing::state(keep, three)});
  p.update(*s3, model::diff(s2.get(), *s3));
  auto s4 = testing::snapshot(
      4, {testing::state(web, two), testing::state(other, two), testing::state(keep, three)});
  ch = p.update(*s4, model::diff(s3.get(), *s4));
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_TRUE(ch[0].replace_chains.empty());
  EXPECT_TRUE(ch[0].add_sets.empty());
  EXPECT_EQ(ch[0].add_elements.size(), 2u);  // backends-2 x 2
  EXPECT_EQ(ch[0].del_elements.size(), 3u);  // backends-3 x 3
  Planner fresh(testing::node_context());
  fresh.reset(*s4);
  EXPECT_EQ(render(p.table(IpFamily::kV4)), render(fresh.table(IpFamily::kV4)));
}

// ClientIP affinity: the VIP's current backends in affinity-backends-T, one record rule per
// timeout T in use; an endpoint change is element changes only, and names the pairs whose
// records must go.
TEST(ProxyPlanner, AffinityBackendsPerTimeoutAndForgottenPairs) {
  Planner p(testing::node_context());
  auto svc = testing::service("sticky", {testing::ip("10.96.0.20")}, 80);
  svc.session_affinity_client_ip = true;
  svc.session_affinity_timeout_seconds = 3;
  std::vector<model::MergedEndpoint> three = {testing::endpoint("10.244.1.2", 8080),
                                              testing::endpoint("10.244.1.3", 8080),
                                              testing::endpoint("10.244.1.4", 8080)};
  auto plain = testing::service("plain", {testing::ip("10.96.0.21")}, 80);
  auto s1 = testing::snapshot(1, {testing::state(svc, three), testing::state(plain, three)});
  p.reset(*s1);
  const Table& t = p.table(IpFamily::kV4);
  std::string key = vip("10.96.0.20", 6, 80);
  auto pair = [&](const char* ep) { return key + addr_field(testing::ip(ep)) + port_field(8080); };
  EXPECT_EQ(find(t, "service-ips", key)->chain, "svc-internal-affinity");
  EXPECT_EQ(find(t, "service-ips", vip("10.96.0.21", 6, 80))->chain, "svc-internal");
  ASSERT_EQ(t.sets.count("affinity"), 1u);
  EXPECT_EQ(t.sets.at("affinity").shape, SetShape::kAffinity);
  EXPECT_TRUE(t.sets.at("affinity").elements.empty()) << "the packet path fills it";
  ASSERT_EQ(t.sets.count("affinity-backends-3"), 1u);
  EXPECT_EQ(t.sets.at("affinity-backends-3").elements.size(), 3u) << "plain has none";
  EXPECT_NE(find(t, "affinity-backends-3", pair("10.244.1.3")), std::nullopt);
  const auto& stick = t.chains.at("lb-affinity").rules;
  ASSERT_EQ(stick.size(), 2u);
  EXPECT_EQ(stick[0].shape, RuleShape::kAffinityStick);
  EXPECT_EQ(stick[0].set, "affinity");
  EXPECT_EQ(stick[1].shape, RuleShape::kGoto);
  EXPECT_EQ(stick[1].target, "lb");
  const auto& record = t.chains.at("affinity-record").rules;
  ASSERT_EQ(record.size(), 3u);  // per protocol: tcp, udp, sctp
  EXPECT_EQ(record[0].shape, RuleShape::kAffinityRecord);
  EXPECT_EQ(record[0].l4proto, 6);
  EXPECT_EQ(record[2].l4proto, 132);
  EXPECT_EQ(record[0].set, "affinity-backends-3");
  EXPECT_EQ(record[0].affinity, "affinity");
  EXPECT_EQ(record[0].timeout_s, 3u);
  EXPECT_EQ(t.chains.at("nat-postrouting").rules.front().target, "affinity-record");
  EXPECT_EQ(t.chains.at("nat-input").rules.front().target, "affinity-record");

  // An endpoint goes: it leaves affinity-backends-3 and its pair is to be forgotten; no
  // verdict, and no set or chain besides the backend-map size's.
  std::vector<model::MergedEndpoint> two(three.begin(), three.begin() + 2);
  auto s2 = testing::snapshot(2, {testing::state(svc, two), testing::state(plain, three)});
  auto ch = p.update(*s2, model::diff(s1.get(), *s2));
  ASSERT_EQ(ch.size(), 1u);
  bool left = false;
  for (const auto& [set, e] : ch[0].del_elements) {
    EXPECT_EQ(e.verdict, Verdict::kNone) << set;
    left |= set == "affinity-backends-3" && e.key == pair("10.244.1.4");
  }
  EXPECT_TRUE(left);
  for (const auto& [set, e] : ch[0].add_elements) EXPECT_EQ(e.verdict, Verdict::kNone) << set;
  EXPECT_EQ(ch[0].forget_affinity, std::vector<std::string>{pair("10.244.1.4")});
  EXPECT_TRUE(ch[0].add_chains.empty());
  EXPECT_TRUE(ch[0].del_chains.empty());

  // Another timeout: its own set and record rule; the pairs move, so none is forgotten. The
  // last service with 3 s gone, its set goes.
  auto longer = svc;
  longer.session_affinity_timeout_seconds = 60;
  auto s3 = testing::snapshot(3, {testing::state(longer, two), testing::state(plain, three)});
  ch = p.update(*s3, model::diff(s2.get(), *s3));
  ASSERT_EQ(ch.size(), 1u);
  ASSERT_EQ(ch[0].add_sets.size(), 1u);
  EXPECT_EQ(ch[0].add_sets[0].name, "affinity-backends-60");
  EXPECT_EQ(ch[0].del_sets, std::vector<std::string>{"affinity-backends-3"});
  EXPECT_TRUE(ch[0].forget_affinity.empty());
  ASSERT_EQ(t.chains.at("affinity-record").rules.size(), 3u);
  EXPECT_EQ(t.chains.at("affinity-record").rules[0].timeout_s, 60u);
  Planner fresh(testing::node_context());
  fresh.reset(*s3);
  EXPECT_EQ(render(p.table(IpFamily::kV4)), render(fresh.table(IpFamily::kV4)));

  // Affinity switched off: every pair is forgotten (even with its whole set deleted).
  auto off = longer;
  off.session_affinity_client_ip = false;
  auto s4 = testing::snapshot(4, {testing::state(off, two), testing::state(plain, three)});
  ch = p.update(*s4, model::diff(s3.get(), *s4));
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_EQ(ch[0].forget_affinity,
            (std::vector<std::string>{pair("10.244.1.2"), pair("10.244.1.3")}));
  EXPECT_EQ(ch[0].del_sets, std::vector<std::string>{"affinity-backends-60"});
  EXPECT_TRUE(t.chains.at("affinity-record").rules.empty());
  EXPECT_EQ(t.chains.at("nat-postrouting").rules.front().target, "masquerading");
  EXPECT_TRUE(t.chains.at("nat-input").rules.empty());
}

// The ClusterIP and externalTrafficPolicy Cluster paths look a VIP key up once to choose the
// class chain, which goes to lb or lb-affinity by itself: the service's ClientIP affinity
// chooses service-ips' target. nat postrouting and input jump to affinity-record only while
// some service has affinity, after full syncs and updates alike.
TEST(ProxyPlanner, AffinityIsChosenInServiceIpsAndTheRecordChainOnlyWhileUsed) {
  auto chains_of = [](const Table& t, const char* chain) {
    std::vector<std::string> out;
    for (const auto& r : t.chains.at(chain).rules) out.push_back(r.target);
    return out;
  };
  using Targets = std::vector<std::string>;
  Planner p(testing::node_context());
  auto svc = testing::service("sticky", {testing::ip("10.96.0.40")}, 80);
  svc.external_ips = {testing::ip("203.0.113.40")};
  auto plain = testing::service("plain", {testing::ip("10.96.0.41")}, 80);
  plain.external_ips = {testing::ip("203.0.113.41")};
  std::vector<model::MergedEndpoint> eps = {testing::endpoint("10.244.1.2", 8080),
                                            testing::endpoint("10.244.2.2", 8080, "node-b")};
  const std::string cluster = vip("10.96.0.40", 6, 80);
  const std::string external = vip("203.0.113.40", 6, 80);
  const Table& t = p.table(IpFamily::kV4);

  // No service with affinity: no jump to the empty affinity-record.
  auto s1 = testing::snapshot(1, {testing::state(svc, eps), testing::state(plain, eps)});
  p.reset(*s1);
  EXPECT_EQ(find(t, "service-ips", cluster)->chain, "svc-internal");
  EXPECT_EQ(find(t, "service-ips", external)->chain, "svc-external");
  EXPECT_TRUE(t.sets.at("service-lb").elements.empty()) << "only eTP Local keys";
  EXPECT_EQ(chains_of(t, "svc-internal"), (Targets{"mark-for-masquerade", "lb"}));
  EXPECT_EQ(t.chains.at("svc-internal").rules.back().shape, RuleShape::kGoto);
  EXPECT_EQ(chains_of(t, "svc-internal-affinity"), (Targets{"mark-for-masquerade", "lb-affinity"}));
  EXPECT_EQ(chains_of(t, "svc-external"), (Targets{"mark-for-masquerade", "lb"}));
  EXPECT_EQ(chains_of(t, "svc-external-affinity"), (Targets{"mark-for-masquerade", "lb-affinity"}));
  EXPECT_EQ(chains_of(t, "nat-postrouting"), Targets{"masquerading"});
  EXPECT_TRUE(t.chains.at("nat-input").rules.empty());

  // It gains affinity: its verdicts move to the affinity chains, the jumps appear.
  auto sticky = svc;
  sticky.session_affinity_client_ip = true;
  auto s2 = testing::snapshot(2, {testing::state(sticky, eps), testing::state(plain, eps)});
  auto ch = p.update(*s2, model::diff(s1.get(), *s2));
  ASSERT_EQ(ch.size(), 1u);
  std::map<std::string, std::string> added;
  for (const auto& [set, e] : ch[0].add_elements)
    if (set == "service-ips") added[e.key] = e.chain;
  EXPECT_EQ(added, (std::map<std::string, std::string>{{cluster, "svc-internal-affinity"},
                                                       {external, "svc-external-affinity"}}));
  std::set<std::string> replaced;
  for (const auto& c : ch[0].replace_chains) replaced.insert(c.name);
  EXPECT_TRUE(replaced.count("nat-postrouting") && replaced.count("nat-input"));
  EXPECT_EQ(find(t, "service-ips", vip("10.96.0.41", 6, 80))->chain, "svc-internal");
  EXPECT_EQ(chains_of(t, "nat-postrouting"), (Targets{"affinity-record", "masquerading"}));
  EXPECT_EQ(chains_of(t, "nat-input"), Targets{"affinity-record"});
  Planner fresh(testing::node_context());
  fresh.reset(*s2);
  EXPECT_EQ(render(t), render(fresh.table(IpFamily::kV4)));

  // An endpoint change of the affinity service changes no verdict and no base chain.
  auto s3 = testing::snapshot(3, {testing::state(sticky, {eps[0]}), testing::state(plain, eps)});
  ch = p.update(*s3, model::diff(s2.get(), *s3));
  ASSERT_EQ(ch.size(), 1u);
  for (const auto& [set, e] : ch[0].add_elements) EXPECT_EQ(e.verdict, Verdict::kNone) << set;
  for (const auto& [set, e] : ch[0].del_elements) EXPECT_EQ(e.verdict, Verdict::kNone) << set;
  for (const auto& c : ch[0].replace_chains) EXPECT_FALSE(c.base.has_value()) << c.name;

  // The last service with affinity loses it: back to svc-internal, the jumps go.
  auto s4 = testing::snapshot(4, {testing::state(svc, {eps[0]}), testing::state(plain, eps)});
  ch = p.update(*s4, model::diff(s3.get(), *s4));
  ASSERT_EQ(ch.size(), 1u);
  added.clear();
  for (const auto& [set, e] : ch[0].add_elements)
    if (set == "service-ips") added[e.key] = e.chain;
  EXPECT_EQ(added, (std::map<std::string, std::string>{{cluster, "svc-internal"},
                                                       {external, "svc-external"}}));
  EXPECT_EQ(chains_of(t, "nat-postrouting"), Targets{"masquerading"});
  EXPECT_TRUE(t.chains.at("nat-input").rules.empty());
  fresh.reset(*s4);
  EXPECT_EQ(render(t), render(fresh.table(IpFamily::kV4)));
}

// Two services can put in the same element: a pod in both (its hairpin element), or the same
// address and port (here a shared external IP). The element stays until neither has it.
TEST(ProxyPlanner, AnElementTwoServicesShareStaysUntilBothAreGone) {
  Planner p(testing::node_context());
  auto a = testing::service("a", {testing::ip("10.96.0.30")}, 80);
  auto b = testing::service("b", {testing::ip("10.96.0.31")}, 80);
  a.external_ips = b.external_ips = {testing::ip("203.0.113.9")};
  auto pod = testing::endpoint("10.244.1.2", 8080);  // on this node
  std::string hairpin = addr_field(pod.address) + addr_field(pod.address);
  std::string shared = vip("203.0.113.9", 6, 80);
  auto s1 = testing::snapshot(1, {testing::state(a, {pod}), testing::state(b, {pod})});
  p.reset(*s1);
  const Table& t = p.table(IpFamily::kV4);
  ASSERT_NE(find(t, "hairpin", hairpin), std::nullopt);
  ASSERT_NE(find(t, "service-ips", shared), std::nullopt);

  // a goes: nothing it shared with b leaves the kernel.
  auto s2 = testing::snapshot(2, {testing::state(b, {pod})});
  auto ch = p.update(*s2, model::diff(s1.get(), *s2));
  ASSERT_EQ(ch.size(), 1u);
  for (const auto& [set, e] : ch[0].del_elements) {
    EXPECT_NE(e.key, hairpin) << set;
    EXPECT_NE(e.key, shared) << set;
  }
  EXPECT_NE(find(t, "hairpin", hairpin), std::nullopt);
  EXPECT_NE(find(t, "service-ips", shared), std::nullopt);
  Planner fresh(testing::node_context());
  fresh.reset(*s2);
  EXPECT_EQ(render(t), render(fresh.table(IpFamily::kV4)));

  // b changes (an endpoint more) and then goes too: now they leave.
  auto s3 = testing::snapshot(
      3, {testing::state(b, {pod, testing::endpoint("10.244.2.2", 8080, "node-b")})});
  p.update(*s3, model::diff(s2.get(), *s3));
  EXPECT_NE(find(t, "hairpin", hairpin), std::nullopt);
  auto s4 = testing::snapshot(4, {});
  ch = p.update(*s4, model::diff(s3.get(), *s4));
  ASSERT_EQ(ch.size(), 1u);
  size_t gone = 0;
  for (const auto& [set, e] : ch[0].del_elements) gone += e.key == hairpin || e.key == shared;
  EXPECT_EQ(gone, 2u);  // hairpin, service-ips (service-lb: eTP Local keys only)
  EXPECT_EQ(find(t, "hairpin", hairpin), std::nullopt);
  EXPECT_EQ(find(t, "service-ips", shared), std::nullopt);
  Planner empty(testing::node_context());
  empty.reset(*s4);
  EXPECT_EQ(render(t), render(empty.table(IpFamily::kV4)));
}

// A snapshot of thousands of services of every kind, planned with reset()'s helper thread and
// without: the same tables, the same skips in the same order, the same counts, and from there
// the same changes for the same update (the state behind the tables, shared elements included).
TEST(ProxyPlanner, PlanningOnTwoThreadsBuildsWhatOneDoes) {
  auto addr = [](uint32_t k) {
    return "10." + std::to_string(128 + (k >> 16)) + "." + std::to_string((k >> 8) & 255) + "." +
           std::to_string(k & 255);
  };
  auto make = [&](uint64_t g, int removed_every, int grown_every) {
    std::vector<model::ServiceStatePtr> v;
    for (int i = 0; i < 3000; ++i) {
      if (removed_every && i % removed_every == 0) continue;
      std::string vip = "10.96." + std::to_string(i / 256) + "." + std::to_string(i % 256);
      std::vector<model::IpAddr> vips = {testing::ip(vip.c_str())};
      bool dual = i % 4 == 0;
      if (dual) vips.push_back(testing::ip(("fd96::" + std::to_string(i)).c_str()));
      auto svc = testing::service("s" + std::to_string(i), vips, i % 17 == 0 ? 0 : 80);
      if (i % 17 == 0) {  // and a port its endpoints lack: no backends
        svc.ports.push_back(svc.ports[0]);
        svc.ports.back().name = "metrics";
        svc.ports.back().port = 81;
      }
      if (i % 7 == 0) {
        svc.type = model::ServiceType::kNodePort;
        svc.ports.back().node_port = static_cast<uint16_t>(30000 + i % 2000);
      }
      if (i % 5 == 0) {
        svc.session_affinity_client_ip = true;
        svc.session_affinity_timeout_seconds = static_cast<uint32_t>((i % 3) * 100);
      }
      if (i % 9 == 0) svc.internal_traffic_policy = model::TrafficPolicy::kLocal;
      if (i % 11 == 0) {
        svc.type = model::ServiceType::kLoadBalancer;
        svc.ports.back().node_port = static_cast<uint16_t>(31000 + i % 2000);
        svc.load_balancer_ips = {testing::ip(("203.0.114." + std::to_string(i % 200)).c_str())};
        svc.load_balancer_source_ranges = {testing::prefix("198.51.100.0/24")};
        svc.external_traffic_policy = model::TrafficPolicy::kLocal;
      }
      // Shared by every 13th service (with values that differ: all of them go in s2).
      if (i % 13 == 0) svc.external_ips = {testing::ip("203.0.113.9")};
      int n = i % 12 + (grown_every && i % grown_every == 0 ? 1 : 0);
      std::vector<model::MergedEndpoint> eps;
      for (int j = 0; j < n; ++j) {
        std::string a = addr(static_cast<uint32_t>(i * 13 + j));
        // Every other Local service (either policy) has none here.
        bool here = j % 3 == 0 && i % 22 != 0 && i % 18 != 0;
        eps.push_back(
            testing::endpoint(a.c_str(), 8080, here ? "node-a" : "node-b", j != 1, j == 1, true));
        if (dual && j < 3) {
          std::string a6 = "fd44::" + std::to_string(i * 13 + j);
          eps.push_back(testing::endpoint(a6.c_str(), 8080, here ? "node-a" : "node-b"));
        }
      }
      // One pod here behind every 10th service: its hairpin element is shared, the same value.
      if (i % 10 == 0) eps.push_back(testing::endpoint("10.250.0.1", 8080));
      if (i % 19 == 0) eps.push_back(testing::endpoint("127.0.0.1", 8080));  // skipped
      v.push_back(testing::state(svc, std::move(eps)));
    }
    return testing::snapshot(g, std::move(v));
  };
  auto s1 = make(1, 0, 0);
  ASSERT_GE(s1->services.size(), 2 * Planner::kHelperFrom);  // the helper's path, runs wrapping
  Planner one(testing::node_context());
  Planner two(testing::node_context());
  one.reset(*s1, false);
  two.reset(*s1, true);
  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    EXPECT_EQ(render(one.table(f)), render(two.table(f)));
    EXPECT_EQ(one.no_local_internal(f), two.no_local_internal(f));
    EXPECT_EQ(one.no_local_external(f), two.no_local_external(f));
  }
  EXPECT_GT(one.table(IpFamily::kV4).element_count(), 30000u);
  EXPECT_GT(one.table(IpFamily::kV6).element_count(), 3000u);
  EXPECT_GT(one.no_local_internal(), 0u);
  EXPECT_GT(one.no_local_external(), 0u);
  EXPECT_GT(one.last_stats().skipped, 300u);
  EXPECT_EQ(one.last_stats().skipped, two.last_stats().skipped);
  EXPECT_EQ(one.last_stats().skip_reasons, two.last_stats().skip_reasons);
  EXPECT_EQ(one.last_stats().rejected, two.last_stats().rejected);
  EXPECT_EQ(one.last_stats().rejections, two.last_stats().rejections);
  const std::string hairpin =
      addr_field(testing::ip("10.250.0.1")) + addr_field(testing::ip("10.250.0.1"));
  ASSERT_NE(find(two.table(IpFamily::kV4), "hairpin", hairpin), std::nullopt);

  // Every 13th service goes (among them every 130th of the pod's: its hairpin element stays for
  // the others), every 6th gains an endpoint.
  auto s2 = make(2, 13, 6);
  auto d = model::diff(s1.get(), *s2);
  auto c1 = one.update(*s2, d);
  auto c2 = two.update(*s2, d);
  ASSERT_EQ(c1.size(), c2.size());
  for (size_t i = 0; i < c1.size(); ++i) {
    EXPECT_EQ(c1[i].del_elements, c2[i].del_elements);
    EXPECT_EQ(c1[i].add_elements, c2[i].add_elements);
    EXPECT_EQ(c1[i].add_chains, c2[i].add_chains);
    EXPECT_EQ(c1[i].replace_chains, c2[i].replace_chains);
    EXPECT_EQ(c1[i].del_chains, c2[i].del_chains);
    EXPECT_EQ(c1[i].del_sets, c2[i].del_sets);
    EXPECT_EQ(c1[i].add_sets.size(), c2[i].add_sets.size());
    EXPECT_EQ(c1[i].forget_affinity, c2[i].forget_affinity);
    EXPECT_EQ(c1[i].del_digests, c2[i].del_digests);
    EXPECT_EQ(c1[i].add_digests, c2[i].add_digests);
  }
  ASSERT_FALSE(c1.empty());
  EXPECT_FALSE(c1[0].del_elements.empty());
  Planner fresh(testing::node_context());
  fresh.reset(*s2);
  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    EXPECT_EQ(render(one.table(f)), render(two.table(f)));
    EXPECT_EQ(render(two.table(f)), render(fresh.table(f)));
  }
  EXPECT_NE(find(two.table(IpFamily::kV4), "hairpin", hairpin), std::nullopt);
}

// Two services claiming one external address and port disagree on its elements (their own
// backends, Local or Cluster policy): the key takes the value of the last of them in key order,
// as a fresh plan does, whichever of them an update changes, adds or removes — never the value
// of a service that is gone (its backends).
TEST(ProxyPlanner, AnAddressTwoServicesClaimHasTheValueAFreshPlanGives) {
  auto a = testing::service("a", {testing::ip("10.96.0.30")}, 80);
  auto b = testing::service("b", {testing::ip("10.96.0.31")}, 80);
  auto c = testing::service("c", {testing::ip("10.96.0.32")}, 80);
  a.external_ips = b.external_ips = c.external_ips = {testing::ip("203.0.113.9")};
  a.external_traffic_policy = model::TrafficPolicy::kLocal;
  c.external_traffic_policy = model::TrafficPolicy::kLocal;
  auto sa = testing::state(a, {testing::endpoint("10.244.1.2", 8080)});
  auto sb = testing::state(b, {testing::endpoint("10.244.2.2", 8080, "node-b")});
  const std::string key = vip("203.0.113.9", 6, 80);
  Planner p(testing::node_context());
  auto same_as_fresh = [&](const model::Snapshot& snap) {
    Planner fresh(testing::node_context());
    fresh.reset(snap);
    EXPECT_EQ(render(p.table(IpFamily::kV4)), render(fresh.table(IpFamily::kV4)));
  };
  auto verdict_of = [&] { return find(p.table(IpFamily::kV4), "service-ips", key)->chain; };
  auto backend_of = [&] {
    return find(p.table(IpFamily::kV4), "backends-1", key + u32_field(0))->data;
  };
  const std::string a_pod = addr_field(testing::ip("10.244.1.2")) + port_field(8080);
  const std::string b_pod = addr_field(testing::ip("10.244.2.2")) + port_field(8080);

  auto s1 = testing::snapshot(1, {sa, sb});
  p.reset(*s1);
  EXPECT_EQ(verdict_of(), names::kSvcExternal);  // b's, the last in key order
  EXPECT_EQ(backend_of(), b_pod);

  // a changes (a new state, the same value for the key): b's value stays, and nothing about the
  // shared key goes to the kernel.
  auto sa2 = testing::state(a, {testing::endpoint("10.244.1.2", 8080)});
  auto s2 = testing::snapshot(2, {sa2, sb});
  auto ch = p.update(*s2, model::diff(s1.get(), *s2));
  for (const auto& change : ch)
    for (const auto& [set, e] : change.add_elements) EXPECT_NE(e.key, key) << set;
  EXPECT_EQ(verdict_of(), names::kSvcExternal);
  same_as_fresh(*s2);

  // b goes: a's value, sent to the kernel; no backend of b's left behind.
  auto s3 = testing::snapshot(3, {sa2});
  ch = p.update(*s3, model::diff(s2.get(), *s3));
  EXPECT_EQ(verdict_of(), names::kSvcExternalLocal);
  EXPECT_EQ(backend_of(), a_pod);
  ASSERT_EQ(ch.size(), 1u);
  bool sent = false;
  for (const auto& [set, e] : ch[0].add_elements)
    sent |= set == "service-ips" && e.key == key && e.chain == names::kSvcExternalLocal;
  EXPECT_TRUE(sent);
  same_as_fresh(*s3);

  // c comes, after a in key order: its value; then a goes: still c's.
  auto sc = testing::state(c, {testing::endpoint("10.244.3.2", 8080, "node-c")});
  auto s4 = testing::snapshot(4, {sa2, sc});
  p.update(*s4, model::diff(s3.get(), *s4));
  EXPECT_EQ(backend_of(), addr_field(testing::ip("10.244.3.2")) + port_field(8080));
  same_as_fresh(*s4);
  auto s5 = testing::snapshot(5, {sc});
  p.update(*s5, model::diff(s4.get(), *s5));
  same_as_fresh(*s5);
  EXPECT_EQ(verdict_of(), names::kSvcExternalLocal);
}

TEST(ProxyPlanner, BadInputIsSkippedAndCounted) {
  NodeContext ctx = testing::node_context();
  ctx.ipv6 = false;
  Planner p(ctx);
  auto zero = testing::service("zero", {testing::ip("10.96.0.20")}, 0);
  auto v6 = testing::service("v6", {testing::ip("fd96::20")}, 80);
  auto ok = testing::service("ok", {testing::ip("10.96.0.21")}, 80);
  p.reset(*testing::snapshot(1, {testing::state(zero, {}), testing::state(v6, {}),
                                 testing::state(ok, {testing::endpoint("10.244.1.2", 8080)})}));
  EXPECT_EQ(p.last_stats().skipped, 2u);
  EXPECT_NE(find(p.table(IpFamily::kV4), "service-ips", vip("10.96.0.21", 6, 80)), std::nullopt);
}

}  // namespace
}  // namespace endpointd::proxy
