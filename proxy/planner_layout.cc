// The planner's fixed layout: the base chains, class chains and shared sets of a family's table
// (base_table), the per-size backend maps, and the lb chains' rules over the maps in use
// (rebuild_lb_chains). See proxy/LAYOUT.md.
#include <algorithm>

#include "proxy/planner.h"
#include "proxy/planner_internal.h"

namespace endpointd::proxy {
namespace {

using model::Protocol;

Rule rule(RuleShape shape, std::string target = {}, std::string set = {}, uint32_t n = 0) {
  return Rule{shape, std::move(target), std::move(set), n, {}, 0};
}

Chain base_chain(std::string name, std::string type, std::string hook, int prio,
                 std::vector<Rule> rules) {
  Chain c;
  c.name = std::move(name);
  c.base = BaseHook{std::move(type), std::move(hook), prio};
  c.rules = std::move(rules);
  return c;
}

Chain chain(std::string name, std::vector<Rule> rules) {
  Chain c;
  c.name = std::move(name);
  c.rules = std::move(rules);
  return c;
}

Set set(std::string name, SetShape shape) {
  Set s;
  s.name = std::move(name);
  s.shape = shape;
  return s;
}

}  // namespace

Set backends_set(bool local, uint32_t n) {
  Set s = set(local ? names::local_backends(n) : names::backends(n), SetShape::kBackends);
  s.modulus = n;
  return s;
}

Set affinity_backends_set(uint32_t timeout_s) {
  Set s = set(names::affinity_backends(timeout_s), SetShape::kVipBackendSet);
  s.modulus = timeout_s;
  return s;
}

// One rule per backend-map size in use: a key absent from backends-N misses the lookup, which
// ends that rule, so each key finds the one map that has it. Changing a service's endpoint
// count moves its elements between maps and touches no verdict, so the kernel has no jump
// graph to validate again (a verdict element change costs milliseconds at 10k services).
void Planner::rebuild_lb_chains(IpFamily f) {
  Table& t = table_mut(f);
  const FamilyState& st = state(f);
  auto& lb = t.chains[names::kLb].rules;
  auto& local = t.chains[names::kLocalLb].rules;
  lb.clear();
  local.clear();
  // ClientIP affinity for clients outside the cluster of an externalTrafficPolicy Local
  // service: they come here (pods and the node go through service-lb), so a record of theirs
  // names one of this node's endpoints; other services' addresses have no record and miss.
  if (!st.affinity_sets.empty())
    local.push_back(rule(RuleShape::kAffinityStick, {}, names::kAffinity));
  for (const auto& [n, _] : st.lb_sets) {
    lb.push_back(rule(RuleShape::kDnatRandom, {}, names::backends(n), n));
  }
  for (const auto& [n, _] : st.local_lb_sets) {
    local.push_back(rule(RuleShape::kDnatRandom, {}, names::local_backends(n), n));
  }
  local.push_back(rule(RuleShape::kDrop));  // externalTrafficPolicy Local, none on this node

  // ClientIP affinity, one rule per timeout T in use: a new connection DNATed to a current
  // backend of an affinity VIP with timeout T records (or refreshes) its client's choice.
  // Without any, nat postrouting and input do not enter the empty chain.
  auto& record = t.chains[names::kAffinityRecord].rules;
  record.clear();
  auto& postrouting = t.chains[names::kNatPostrouting].rules;
  auto& input = t.chains[names::kNatInput].rules;
  postrouting.clear();
  input.clear();
  if (!st.affinity_sets.empty()) {
    postrouting.push_back(rule(RuleShape::kJump, names::kAffinityRecord));
    input.push_back(rule(RuleShape::kJump, names::kAffinityRecord));
  }
  postrouting.push_back(rule(RuleShape::kJump, names::kMasquerading));
  for (const auto& [timeout, _] : st.affinity_sets) {
    for (Protocol p : {Protocol::kTCP, Protocol::kUDP, Protocol::kSCTP}) {
      record.push_back(Rule{RuleShape::kAffinityRecord,
                            {},
                            names::affinity_backends(timeout),
                            0,
                            names::kAffinity,
                            timeout,
                            l4proto(p)});
    }
  }
}

// The fixed part of the layout: base chains at kube-proxy's hooks and priorities, the class
// chains, and the sets and maps every service shares. See proxy/LAYOUT.md.
void Planner::base_table(IpFamily f) {
  Table& t = table_mut(f);
  FamilyState& st = state(f);
  st = {};
  t.sets.clear();
  t.chains.clear();
  for (Set s :
       {set(names::kClusterCidrs, SetShape::kAddrInterval),
        set(names::kHairpin, SetShape::kAddrPair), set(names::kFirewallIps, SetShape::kVipSet),
        set(names::kFirewallAllow, SetShape::kVipSrcInterval),
        set(names::kNoEndpointReject, SetShape::kVipSet),
        set(names::kNoEndpointDrop, SetShape::kVipSet),
        set(names::kServiceIps, SetShape::kVipVerdictMap),
        set(names::kServiceLb, SetShape::kVipVerdictMap),
        set(names::kClusterIps, SetShape::kAddrSet),
        set(names::kServiceCidrs, SetShape::kAddrInterval),
        set(names::kAffinity, SetShape::kAffinity)}) {
    t.sets.emplace(s.name, std::move(s));
  }
  // In SetKind's order.
  const char* fixed[kFixedSets] = {
      names::kHairpin,        names::kFirewallIps, names::kFirewallAllow, names::kNoEndpointReject,
      names::kNoEndpointDrop, names::kServiceIps,  names::kServiceLb,     names::kClusterIps};
  for (size_t i = 0; i < kFixedSets; ++i) st.fixed[i] = &t.sets.at(fixed[i]);
  // An interval set of this family's prefixes; a prefix inside another is left out (the kernel
  // refuses overlapping intervals).
  auto fill = [&](Set& s, const std::vector<model::IpPrefix>& prefixes, const char* what) {
    for (const auto& p : prefixes) {
      if (p.family() != t.family) continue;
      bool inside = std::any_of(prefixes.begin(), prefixes.end(), [&](const model::IpPrefix& o) {
        return o.family() == p.family() && o.length() < p.length() && o.contains(p.addr());
      });
      if (inside) continue;
      Element e;
      e.key = addr_field(p.addr());
      e.key_end = prefix_last(p);
      if (auto r = s.elements.put(e); !r) {
        ++stats_.skipped;
        stats_.skip_reasons.push_back(std::string(what) + " " + p.str() + ": " + r.error());
      }
    }
  };
  // Local traffic by source address: the cluster CIDRs, or this Node's pod CIDRs.
  auto& cidrs = t.sets[names::kClusterCidrs];
  if (planned_.detect_local == DetectLocal::kClusterCidr)
    fill(cidrs, planned_.cluster_cidrs, "cluster CIDR");
  if (planned_.detect_local == DetectLocal::kNodeCidr)
    fill(cidrs, planned_.node_pod_cidrs, "node pod CIDR");
  bool have_cidrs = !cidrs.elements.empty();
  // Local traffic by the interface it arrived on: the bridge, or "<prefix>*".
  std::string local_iif;
  if (planned_.detect_local == DetectLocal::kBridgeInterface) local_iif = planned_.local_interface;
  if (planned_.detect_local == DetectLocal::kInterfaceNamePrefix &&
      !planned_.local_interface.empty())
    local_iif = planned_.local_interface + "*";
  auto& service_cidrs = t.sets[names::kServiceCidrs];
  fill(service_cidrs, planned_.service_cidrs, "service CIDR");

  auto add = [&t](Chain c) { t.chains.emplace(c.name, std::move(c)); };
  add(base_chain("filter-prerouting", "filter", "prerouting", -110,
                 {rule(RuleShape::kCtNewJump, "firewall-check")}));
  add(base_chain("filter-input", "filter", "input", -110,
                 {rule(RuleShape::kCtNewJump, "service-endpoints-check")}));
  // Forwarded packets: established and related ones (most packets) meet one test; a new
  // connection a service DNATed meets two. Both checks below are about a destination no service
  // port took (no endpoints, a port the cluster IP does not serve); after DNAT the packet holds
  // an endpoint's address, which they cannot match, so they run only for untranslated ones.
  add(base_chain("filter-forward", "filter", "forward", -110,
                 {rule(RuleShape::kAcceptEstablished), rule(RuleShape::kAcceptDnat),
                  rule(RuleShape::kCtNewJump, "service-endpoints-check"),
                  rule(RuleShape::kCtNewJump, names::kClusterIpsCheck)}));
  add(base_chain("filter-output", "filter", "output", -110,
                 {rule(RuleShape::kCtNewJump, "service-endpoints-check"),
                  rule(RuleShape::kCtNewJump, "firewall-check")}));
  // After nat output's DNAT (-100), as kube-proxy's: a cluster IP still in the packet here is
  // one no service port took.
  add(base_chain("filter-output-post-dnat", "filter", "output", -90,
                 {rule(RuleShape::kCtNewJump, names::kClusterIpsCheck)}));
  add(base_chain("nat-prerouting", "nat", "prerouting", -100,
                 {rule(RuleShape::kJump, "services")}));
  add(base_chain("nat-output", "nat", "output", -100, {rule(RuleShape::kJump, "services")}));
  // ClientIP affinity is recorded after DNAT, where the backend is in the packet: on the way
  // out (forwarded or local clients) or in (external clients of this node's own addresses).
  // Their rules follow the affinity timeouts in use (rebuild_lb_chains).
  add(base_chain(names::kNatPostrouting, "nat", "postrouting", 100, {}));
  add(base_chain(names::kNatInput, "nat", "input", 100, {}));
  add(chain("firewall-check", {rule(RuleShape::kFirewallCheck)}));
  // Plain sets rather than a verdict map: a service gaining or losing its last endpoint then
  // changes no verdict element (see rebuild_lb_chains).
  add(chain("service-endpoints-check",
            {rule(RuleShape::kVipInSetGoto, names::kRejectChain, names::kNoEndpointReject),
             rule(RuleShape::kVipInSetDrop, {}, names::kNoEndpointDrop)}));
  // TCP gets a reset: a local client's SYN is rejected while connect() holds its socket, and
  // TCP only records an ICMP error met then as soft (the connect would wait for a retransmit);
  // a reset is queued to the socket's backlog and refuses the connect at once.
  add(chain(names::kRejectChain, {rule(RuleShape::kRejectTcpReset), rule(RuleShape::kReject)}));
  // kube-proxy's cluster-ips-check: a port a cluster IP does not serve is refused (through
  // reject-chain: TCP gets a reset, as above); an address of the service CIDRs that is no
  // cluster IP is dropped.
  std::vector<Rule> ips_check = {
      rule(RuleShape::kDaddrInSetGoto, names::kRejectChain, names::kClusterIps)};
  if (!service_cidrs.elements.empty())
    ips_check.push_back(rule(RuleShape::kDaddrInSetDrop, {}, names::kServiceCidrs));
  add(chain(names::kClusterIpsCheck, std::move(ips_check)));
  add(chain(names::kLb, {}));
  add(chain(names::kLocalLb, {rule(RuleShape::kDrop)}));
  // A client with a record goes where it went before; others are balanced (and recorded).
  add(chain(names::kLbAffinity, {rule(RuleShape::kAffinityStick, {}, names::kAffinity),
                                 rule(RuleShape::kGoto, names::kLb)}));
  add(chain(names::kAffinityRecord, {}));
  add(chain(names::kMarkForMasquerade, {rule(RuleShape::kMarkForMasquerade)}));
  add(chain(names::kMasquerading, {rule(RuleShape::kHairpinMark, names::kMarkForMasquerade),
                                   rule(RuleShape::kMasqReturnUnmarked),
                                   rule(RuleShape::kMasqClearMark), rule(RuleShape::kMasquerade)}));
  add(chain("services", {rule(RuleShape::kVipVmap, {}, names::kServiceIps)}));

  // Traffic to a cluster IP: masquerade what does not come from a pod (or everything).
  std::vector<Rule> internal;
  if (planned_.masquerade_all) {
    internal.push_back(rule(RuleShape::kJump, names::kMarkForMasquerade));
  } else if (have_cidrs) {
    internal.push_back(
        rule(RuleShape::kSaddrNotInJump, names::kMarkForMasquerade, names::kClusterCidrs));
  } else if (!local_iif.empty()) {
    Rule r = rule(RuleShape::kIifnameNotJump, names::kMarkForMasquerade);
    r.iifname = local_iif;
    internal.push_back(std::move(r));
  }
  // service-ips chooses between these by the service's ClientIP affinity, so after it the VIP
  // key is looked up only in lb's backend maps (a service's endpoints never change a verdict).
  std::vector<Rule> internal_affinity = internal;
  internal.push_back(rule(RuleShape::kGoto, names::kLb));
  internal_affinity.push_back(rule(RuleShape::kGoto, names::kLbAffinity));
  add(chain(names::kSvcInternal, std::move(internal)));
  add(chain(names::kSvcInternalAffinity, std::move(internal_affinity)));
  // External traffic with externalTrafficPolicy Cluster: always masqueraded.
  add(chain(names::kSvcExternal, {rule(RuleShape::kJump, names::kMarkForMasquerade),
                                  rule(RuleShape::kGoto, names::kLb)}));
  add(chain(names::kSvcExternalAffinity, {rule(RuleShape::kJump, names::kMarkForMasquerade),
                                          rule(RuleShape::kGoto, names::kLbAffinity)}));
  // externalTrafficPolicy Local: pods and the node itself use every endpoint (as kube-proxy
  // short-circuits them: service-lb, which holds only these services' keys, chooses lb or
  // lb-affinity); everyone else only this node's endpoints, unmasqueraded.
  std::vector<Rule> ext_local;
  if (have_cidrs) {
    ext_local.push_back(rule(RuleShape::kSaddrInVmap, {}, names::kServiceLb));
  } else if (!local_iif.empty()) {
    Rule r = rule(RuleShape::kIifnameVmap, {}, names::kServiceLb);
    r.iifname = local_iif;
    ext_local.push_back(std::move(r));
  }
  ext_local.push_back(rule(RuleShape::kFibLocalJump, names::kMarkForMasquerade));
  ext_local.push_back(rule(RuleShape::kFibLocalVmap, {}, names::kServiceLb));
  ext_local.push_back(rule(RuleShape::kJump, names::kLocalLb));
  add(chain(names::kSvcExternalLocal, ext_local));

  // Node-local DNS, as NodeLocal DNSCache's raw rules: queries to the address and its answers
  // skip conntrack (no UDP conntrack race, no table entry per query). Output has both: the
  // answers, and the queries of the node's own clients (host network).
  if (planned_.dns_node_local && planned_.dns_node_local->family() == f) {
    auto notrack = [&](RuleShape shape, uint8_t proto) {
      Rule r = rule(shape);
      r.addr = addr_field(*planned_.dns_node_local);
      r.l4proto = proto;
      r.port = planned_.dns_node_local_port;
      return r;
    };
    add(base_chain(names::kDnsNotrackPrerouting, "filter", "prerouting", kRawPriority,
                   {notrack(RuleShape::kNotrackDaddr, 17), notrack(RuleShape::kNotrackDaddr, 6)}));
    add(base_chain(names::kDnsNotrackOutput, "filter", "output", kRawPriority,
                   {notrack(RuleShape::kNotrackDaddr, 17), notrack(RuleShape::kNotrackDaddr, 6),
                    notrack(RuleShape::kNotrackSaddr, 17), notrack(RuleShape::kNotrackSaddr, 6)}));
  }
}

}  // namespace endpointd::proxy
