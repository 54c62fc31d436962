// The planner: every service port becomes elements of a fixed set of maps; only the
// per-size backend maps (and their chains) come and go, one per endpoint count in use.
// The fixed layout (base_table, the backend maps, rebuild_lb_chains) is in planner_layout.cc.
#include "proxy/planner.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "model/routing.h"
#include "proxy/frontends.h"
#include "proxy/planner_internal.h"

namespace endpointd::proxy {
namespace {

using model::IpAddr;
using model::MergedEndpoint;
using model::Protocol;
using model::Service;
using model::ServicePort;
using model::ServiceState;
using model::TrafficPolicy;

// An element that carries more than its key (data, a key end, a verdict): two services
// sharing its key can disagree on it.
bool has_value(const Element& e) {
  return !e.data.empty() || !e.key_end.empty() || e.verdict != Verdict::kNone;
}

std::string vip_key(const IpAddr& a, uint8_t proto, uint16_t port) {
  return addr_field(a) + proto_field(proto) + port_field(port);
}

Element verdict_element(std::string key, Verdict v, std::string chain = {}) {
  Element e;
  e.key = std::move(key);
  e.verdict = v;
  e.chain = std::move(chain);
  return e;
}

struct Target {
  IpAddr addr;
  uint16_t port;
  bool on_this_node;  // only these can be hairpin traffic's source and destination
  friend auto operator<=>(const Target&, const Target&) = default;
};

}  // namespace

NodeContext node_context_from(const NodeContext& base, const model::Snapshot& snap) {
  NodeContext c = base;
  const model::Node* n = snap.find_node(base.node_name);
  if (!n) return c;
  if (!n->zone.empty()) c.zone = n->zone;
  c.node_pod_cidrs = n->pod_cidrs;
  c.primary_ips.clear();
  for (const char* type : {"InternalIP", "ExternalIP"}) {
    for (const auto& a : n->addresses) {
      if (a.type != type) continue;
      auto ip = model::IpAddr::parse(a.address);
      if (!ip || ip->is_loopback() || ip->is_unspecified()) continue;
      bool have_family =
          std::any_of(c.primary_ips.begin(), c.primary_ips.end(),
                      [&](const model::IpAddr& p) { return p.family() == ip->family(); });
      if (!have_family) c.primary_ips.push_back(*ip);
    }
  }
  for (const auto& a : n->addresses) {
    if (a.type != "InternalIP" && a.type != "ExternalIP") continue;
    auto ip = model::IpAddr::parse(a.address);
    if (!ip) continue;
    if (std::find(c.node_ips.begin(), c.node_ips.end(), *ip) == c.node_ips.end())
      c.node_ips.push_back(*ip);
  }
  return c;
}

std::vector<model::IpAddr> node_port_ips(const NodeContext& ctx) {
  std::vector<model::IpAddr> out;
  const auto& from =
      ctx.node_port_addresses.empty() && !ctx.primary_ips.empty() ? ctx.primary_ips : ctx.node_ips;
  for (const auto& a : from) {
    if (a.is_loopback() || a.is_unspecified()) continue;  // never on localhost
    bool selected = ctx.node_port_addresses.empty();
    for (const auto& p : ctx.node_port_addresses) selected |= p.contains(a);
    if (selected && std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  return out;
}

uint32_t affinity_timeout(const model::Service& svc) {
  uint32_t t = svc.session_affinity_timeout_seconds;
  if (t == 0) return 10800;
  return std::min<uint32_t>(t, 86400);
}

std::map<uint32_t, Set*>& Planner::sized_sets(IpFamily f, SetKind kind) {
  FamilyState& st = state(f);
  if (kind == SetKind::kLocalBackends) return st.local_lb_sets;
  if (kind == SetKind::kAffinityBackends) return st.affinity_sets;
  return st.lb_sets;
}

Planner::Planner(NodeContext ctx)
    : ctx_(std::move(ctx)), node_port_ips_(node_port_ips(ctx_)), planned_(ctx_) {
  v4_.family = IpFamily::kV4;
  v6_.family = IpFamily::kV6;
}

std::vector<IpFamily> Planner::families() const {
  std::vector<IpFamily> out;
  if (planned_.ipv4) out.push_back(IpFamily::kV4);
  if (planned_.ipv6) out.push_back(IpFamily::kV6);
  return out;
}

void Planner::forget_service(const PlannedService& p) {
  for (size_t f = 0; f < 2; ++f) {
    no_local_internal_[f] -= p.no_local_internal[f] ? 1 : 0;
    no_local_external_[f] -= p.no_local_external[f] ? 1 : 0;
  }
}

void Planner::remember_service(const PlannedService& p) {
  for (size_t f = 0; f < 2; ++f) {
    no_local_internal_[f] += p.no_local_internal[f] ? 1 : 0;
    no_local_external_[f] += p.no_local_external[f] ? 1 : 0;
  }
}

template <typename Emit>
void Planner::plan_service(const ServiceState& st, PlanStats* skips, PlannedService& plan,
                           Emit&& emit) const {
  const NodeContext& ctx = planned_;  // what the tables are planned with
  const Service& svc = st.service;
  if (!model::has_proxy_rules(svc)) return;
  auto skip = [&](const std::string& why) {
    if (!skips) return;
    ++skips->skipped;
    skips->skip_reasons.push_back(svc.key.str() + ": " + why);
  };
  // A pod reaching itself through a service is always on this node; an endpoint without a
  // node name (a hand-made slice) is kept in the hairpin set to be safe.
  auto is_here = [&](const MergedEndpoint& e) {
    return e.node_name.empty() || e.node_name == ctx.node_name;
  };
  const model::RoutingNode node{ctx.node_name, ctx.zone};

  const std::vector<Frontend> addresses = service_addresses(svc);
  for (IpFamily fam : {IpFamily::kV4, IpFamily::kV6}) {
    bool fam_used = false;
    for (const auto& a : addresses) fam_used |= a.addr.family() == fam;
    if (!fam_used) continue;
    if (!has_family(fam)) {
      skip(std::string("node has no ") + std::string(model::to_string(fam)) + " family");
      continue;
    }
    // kube-proxy's cluster-ips: every cluster IP with a service port (its other ports are
    // refused in cluster-ips-check).
    bool any_port = std::any_of(svc.ports.begin(), svc.ports.end(),
                                [](const ServicePort& sp) { return sp.port != 0; });
    for (const auto& a : addresses) {
      const IpAddr& vip = a.addr;
      if (a.kind != FrontendKind::kClusterIp || !any_port || vip.family() != fam ||
          vip.is_unspecified() || vip.is_loopback())
        continue;
      emit(fam, SetId{SetKind::kClusterIps}, Element{addr_field(vip), {}, {}, Verdict::kNone, {}});
    }
    // kube-proxy's loadBalancerSourceRanges exception for the node: when a range holds this
    // node's IP, the LB IPs are allowed sources too (a VIP-like load balancer's IP is a local
    // address, so the node reaches it from that IP). The node's IP: its primary IP of the
    // family, as kube-proxy's; without a Node object, any of its addresses.
    std::vector<model::IpPrefix> ranges;  // this family's, none inside another (no overlap)
    for (const auto& r : svc.load_balancer_source_ranges) {
      if (r.family() != fam) continue;
      bool inside =
          std::any_of(svc.load_balancer_source_ranges.begin(),
                      svc.load_balancer_source_ranges.end(), [&](const auto& o) {
                        return o.family() == fam && o.length() < r.length() && o.contains(r.addr());
                      });
      if (!inside && std::find(ranges.begin(), ranges.end(), r) == ranges.end())
        ranges.push_back(r);
    }
    bool allow_from_node = false;
    const auto& node_ips = ctx.primary_ips.empty() ? ctx.node_ips : ctx.primary_ips;
    for (const auto& r : ranges) {
      for (const auto& a : node_ips)
        allow_from_node |= a.family() == fam && !a.is_loopback() && r.contains(a);
    }
    for (const ServicePort& sp : svc.ports) {
      if (sp.port == 0) {
        skip("port " + sp.name + " is 0");
        continue;
      }
      uint8_t proto = l4proto(sp.protocol);
      // Endpoints of this family that can be backends of this service port.
      std::vector<const MergedEndpoint*> eps;
      std::vector<uint16_t> ports;
      for (const auto& e : st.endpoints) {
        if (e.address.family() != fam) continue;
        if (e.address.is_unspecified() || e.address.is_loopback()) {
          skip("endpoint " + e.address.str() + " is not routable");
          continue;
        }
        auto p = model::backend_port(e, sp);
        if (!p) continue;
        eps.push_back(&e);
        ports.push_back(*p);
      }
      auto select = [&](model::Scope scope) {
        std::vector<Target> t;
        for (size_t i : model::select_routed(svc, eps, scope, node))
          t.push_back({eps[i]->address, ports[i], is_here(*eps[i])});
        std::sort(t.begin(), t.end());
        return t;
      };
      std::vector<Target> cluster = select(model::Scope::kCluster);
      std::vector<Target> local = select(model::Scope::kNodeLocal);
      bool itp_local = svc.internal_traffic_policy == TrafficPolicy::kLocal;
      bool etp_local = svc.external_traffic_policy == TrafficPolicy::kLocal;
      const std::vector<Target>& internal = itp_local ? local : cluster;

      auto put = [&](SetKind kind, Element e) { emit(fam, SetId{kind}, std::move(e)); };
      bool affinity = svc.session_affinity_client_ip;
      uint32_t timeout = affinity_timeout(svc);
      auto put_backends = [&](const std::string& key, const std::vector<Target>& targets,
                              bool local_map) {
        auto n = static_cast<uint32_t>(targets.size());
        SetId id{local_map ? SetKind::kLocalBackends : SetKind::kBackends, n};
        for (uint32_t i = 0; i < n; ++i) {
          Element e;
          e.key.reserve(key.size() + 4);
          e.key.append(key).append(u32_field(i));
          std::string addr = addr_field(targets[i].addr);
          e.data.reserve(addr.size() + 4);
          e.data.append(addr).append(port_field(targets[i].port));
          if (affinity && !local_map) {
            // The VIP's current backends: a remembered one not among them is forgotten.
            Element b;
            b.key.reserve(key.size() + e.data.size());
            b.key.append(key).append(e.data);
            emit(fam, SetId{SetKind::kAffinityBackends, timeout}, std::move(b));
          }
          emit(fam, id, std::move(e));
          if (targets[i].on_this_node) {
            Element h;
            h.key.reserve(2 * addr.size());
            h.key.append(addr).append(addr);
            put(SetKind::kHairpin, std::move(h));
          }
        }
      };
      // service-ips and service-lb depend on the service alone, never on its endpoints, so an
      // endpoint change touches no verdict element (see rebuild_lb_chains). ClientIP affinity
      // is chosen by service-ips' target (svc-*-affinity end in lb-affinity); service-lb holds
      // only externalTrafficPolicy Local keys, whose chain chooses by source first.
      const char* lb_chain = affinity ? names::kLbAffinity : names::kLb;

      // Every frontend of this port in this family: cluster IPs, then external addresses
      // (externalIPs, load-balancer ingress IPs, node ports).
      bool has_ranges = !svc.load_balancer_source_ranges.empty();
      for (const Frontend& f : frontends(svc, sp, node_port_ips_)) {
        if (f.addr.family() != fam) continue;
        const bool internal_vip = f.kind == FrontendKind::kClusterIp;
        if (f.addr.is_unspecified() || f.addr.is_loopback()) {
          skip((internal_vip ? "cluster IP " : "external IP ") + f.addr.str() + " is not routable");
          continue;
        }
        std::string key = vip_key(f.addr, proto, f.port);
        if (internal_vip) {
          put(SetKind::kServiceIps,
              verdict_element(key, Verdict::kGoto,
                              affinity ? names::kSvcInternalAffinity : names::kSvcInternal));
          if (internal.empty()) {
            // kube-proxy: no endpoints at all -> reject; none on this node for
            // internalTrafficPolicy Local -> drop.
            bool drop = itp_local && !cluster.empty();
            if (drop) plan.no_local_internal[family_index(fam)] = true;
            put(drop ? SetKind::kNoEndpointDrop : SetKind::kNoEndpointReject,
                Element{key, {}, {}, Verdict::kNone, {}});
            continue;
          }
          put_backends(key, internal, false);
          continue;
        }
        if (f.kind == FrontendKind::kLoadBalancerIp && has_ranges) {
          put(SetKind::kFirewallIps, Element{key, {}, {}, Verdict::kNone, {}});
          for (const auto& r : ranges) {
            put(SetKind::kFirewallAllow,
                Element{key + addr_field(r.addr()), key + prefix_last(r), {}, Verdict::kNone, {}});
          }
          for (const auto& lb : svc.load_balancer_ips) {
            if (!allow_from_node || lb.family() != fam) continue;
            bool covered = std::any_of(ranges.begin(), ranges.end(),
                                       [&](const model::IpPrefix& r) { return r.contains(lb); });
            if (covered) continue;  // allowed already (and an overlap the kernel would refuse)
            std::string src = key + addr_field(lb);
            put(SetKind::kFirewallAllow, Element{src, src, {}, Verdict::kNone, {}});
          }
        }
        const char* external_chain = etp_local  ? names::kSvcExternalLocal
                                     : affinity ? names::kSvcExternalAffinity
                                                : names::kSvcExternal;
        put(SetKind::kServiceIps, verdict_element(key, Verdict::kGoto, external_chain));
        if (etp_local) put(SetKind::kServiceLb, verdict_element(key, Verdict::kGoto, lb_chain));
        if (cluster.empty()) {
          put(SetKind::kNoEndpointReject, Element{key, {}, {}, Verdict::kNone, {}});
          continue;
        }
        put_backends(key, cluster, false);
        if (!etp_local) continue;
        if (local.empty()) {
          plan.no_local_external[family_index(fam)] = true;  // local-lb ends in drop
          continue;
        }
        put_backends(key, local, true);
      }
    }
  }
}

TableChanges& Planner::changes_for(std::vector<TableChanges>* out, IpFamily f) {
  for (auto& c : *out) {
    if (c.family == f) return c;
  }
  out->push_back(TableChanges{});
  out->back().family = f;
  return out->back();
}

Set& Planner::set_for(IpFamily f, SetId id) {
  FamilyState& st = state(f);
  if (!sized(id.kind)) return *st.fixed[static_cast<size_t>(id.kind)];
  auto& sets = sized_sets(f, id.kind);
  auto it = sets.find(id.n);
  if (it != sets.end()) return *it->second;
  Set s = id.kind == SetKind::kAffinityBackends
              ? affinity_backends_set(id.n)
              : backends_set(id.kind == SetKind::kLocalBackends, id.n);
  std::string name = s.name;
  Set& created = table_mut(f).sets.emplace(std::move(name), std::move(s)).first->second;
  sets.emplace(id.n, &created);
  return created;
}

Status Planner::add_element(IpFamily f, SetId id, Element&& e, TableChanges* ch) {
  Set& s = set_for(f, id);
  if (auto* keys = state(f).redoing) keys->insert({s.name, e.key});
  auto put = s.elements.put(e);
  if (!put) {
    if (s.elements.empty() && sized(id.kind))
      drop_backends_set(f, id);  // created for this element alone
    return prefixed("map " + s.name, put.error());
  }
  if (auto& old = *put) {
    // Another service has this key too; the newest value wins here, and an update gives the
    // key the value of the last service in key order afterwards (resolve_shared).
    ++state(f).extra_refs[{s.name, e.key}];
    if (*old == e) return {};
    if (ch) ch->del_elements.emplace_back(s.name, std::move(*old));
  }
  if (ch) ch->add_elements.emplace_back(s.name, std::move(e));
  return {};
}

Status Planner::add_service(const ServiceState& st, bool count_skips, PlannedService& plan,
                            std::vector<TableChanges>* out) {
  size_t added = 0;
  Status failed;
  plan_service(st, count_skips ? &stats_ : nullptr, plan, [&](IpFamily f, SetId id, Element&& e) {
    if (!failed.ok()) return;
    failed = add_element(f, id, std::move(e), out ? &changes_for(out, f) : nullptr);
    if (failed.ok()) ++added;
  });
  if (failed.ok()) return failed;
  // The plan is a function of the state and the context, so planning it again yields the same
  // elements in the same order: take out the first `added`. Unrecorded: the changes then hold
  // additions of elements no longer in the table, which the normalisation in update() drops.
  size_t removed = 0;
  PlannedService ignored;
  plan_service(st, nullptr, ignored, [&](IpFamily f, SetId id, Element&& e) {
    if (removed++ < added) remove_element(f, id, e, nullptr);
  });
  return prefixed(st.key().str(), failed.error());
}

void Planner::reject(const Status& why) {
  ++stats_.rejected;
  stats_.rejections.push_back(why.error());
}

void Planner::remove_element(IpFamily f, SetId id, const Element& e, TableChanges* ch) {
  FamilyState& st = state(f);
  Set& s = set_for(f, id);
  assert(s.elements.contains(e.key));
  if (!st.extra_refs.empty()) {
    auto extra = st.extra_refs.find({s.name, e.key});
    if (extra != st.extra_refs.end()) {
      if (--extra->second == 0) st.extra_refs.erase(extra);
      // Another service keeps it, and the value in the table may be this one's, which leaves:
      // the others' is put back.
      if (has_value(e) && !(st.redoing && st.redoing->count({s.name, e.key})))
        st.contested.insert({s.name, e.key});
      return;
    }
  }
  if (ch) ch->del_elements.emplace_back(s.name, *s.elements.get(e.key));
  s.elements.erase(e.key);
  if (!s.elements.empty() || !sized(id.kind)) return;
  drop_backends_set(f, id);  // no element uses this size any more
}

void Planner::drop_backends_set(IpFamily f, SetId id) {
  auto& sets = sized_sets(f, id.kind);
  auto it = sets.find(id.n);
  if (it == sets.end()) return;
  std::string name = it->second->name;
  sets.erase(it);
  table_mut(f).sets.erase(name);
}

void Planner::keep_planned(PlannedService p, const Status& planned,
                           const std::map<model::ServiceKey, PlannedService>& previous) {
  if (!planned) {
    reject(planned);
    // The version planned before, when there was one and the tables take it.
    auto old = previous.find(p.state->key());
    if (old == previous.end() || old->second.state == p.state) return;
    p = PlannedService{old->second.state};
    if (!add_service(*p.state, false, p, nullptr)) return;
  }
  remember_service(p);
  services_.emplace_hint(services_.end(), p.state->key(), std::move(p));
}

void Planner::reset(const model::Snapshot& snap, bool helper) {
  stats_ = {};
  planned_ = ctx_;
  node_port_ips_ = node_port_ips(planned_);
  std::map<model::ServiceKey, PlannedService> previous = std::move(services_);
  services_.clear();
  base_table(IpFamily::kV4);
  base_table(IpFamily::kV6);
  for (size_t f = 0; f < 2; ++f) no_local_internal_[f] = no_local_external_[f] = 0;
  if (helper && snap.services.size() >= kHelperFrom) {
    reset_with_helper(snap, previous);
  } else {
    for (const auto& st : snap.services) {
      PlannedService p{st};
      Status s = add_service(*st, true, p, nullptr);
      keep_planned(std::move(p), s, previous);
    }
  }
  rebuild_lb_chains(IpFamily::kV4);
  rebuild_lb_chains(IpFamily::kV6);
  s4_.contested.clear();  // planned in key order: every shared key has its last service's value
  s6_.contested.clear();
}

std::string Planner::set_name(IpFamily f, SetId id) const {
  switch (id.kind) {
    case SetKind::kBackends:
      return names::backends(id.n);
    case SetKind::kLocalBackends:
      return names::local_backends(id.n);
    case SetKind::kAffinityBackends:
      return names::affinity_backends(id.n);
    default:
      return (f == IpFamily::kV4 ? s4_ : s6_).fixed[static_cast<size_t>(id.kind)]->name;
  }
}

void Planner::resolve_shared(IpFamily f, std::vector<TableChanges>* out) {
  FamilyState& st = state(f);
  if (st.contested.empty()) return;
  auto contested = std::move(st.contested);
  st.contested.clear();
  Table& t = table_mut(f);
  // The services that can put in these keys: those with a key's address (its first field) as a
  // cluster, external or load-balancer IP, or as a NodePort address. One pass over them all,
  // each candidate planned once; the last one in key order gives each key its value.
  const size_t addr_size = f == IpFamily::kV4 ? 4 : 16;
  std::set<std::string_view> addrs;
  for (const auto& [_, key] : contested)
    if (key.size() >= addr_size) addrs.insert(std::string_view(key).substr(0, addr_size));
  std::map<std::pair<std::string, std::string>, Element> last;
  for (const auto& [_, planned] : services_) {
    const model::Service& svc = planned.state->service;
    auto has = [&](const IpAddr& a) {
      return a.size() == addr_size &&
             addrs.count(std::string_view(reinterpret_cast<const char*>(a.data()), a.size()));
    };
    bool candidate = false;
    for (const auto& a : service_addresses(svc)) candidate |= has(a.addr);
    for (const auto& sp : svc.ports)
      if (node_port(svc, sp))
        for (const auto& a : node_port_ips_) candidate |= has(a);
    if (!candidate) continue;
    PlannedService ignored;
    plan_service(*planned.state, nullptr, ignored, [&](IpFamily ef, SetId id, Element&& e) {
      if (ef != f) return;
      std::pair<std::string, std::string> k{set_name(ef, id), e.key};
      if (contested.count(k)) last[k] = std::move(e);
    });
  }
  for (auto& [k, value] : last) {
    auto set = t.sets.find(k.first);
    if (set == t.sets.end()) continue;
    std::optional<Element> now = set->second.elements.get(k.second);
    if (!now || *now == value) continue;             // gone with its last service, or already right
    if (!set->second.elements.put(value)) continue;  // it held such a value before
    TableChanges& ch = changes_for(out, f);
    ch.del_elements.emplace_back(k.first, std::move(*now));
    ch.add_elements.emplace_back(k.first, std::move(value));
  }
}

void Planner::plan_ahead(const model::ServiceStatePtr& st, PlannedRun& run) const {
  PlannedService p{st};
  plan_service(*st, &run.skips, p, [&](IpFamily f, SetId id, Element&& e) {
    run.elements.push_back({f, id, std::move(e)});
  });
  run.services.emplace_back(std::move(p), run.elements.size());
}

std::vector<TableChanges> Planner::update(const model::Snapshot& snap, const model::Delta& delta) {
  stats_ = {};
  std::vector<TableChanges> out;
  // The backend-map sizes in use before, to find the maps (and lb rules) that come and go.
  auto sizes_of = [](const std::map<uint32_t, Set*>& m) {
    std::set<uint32_t> out;
    for (const auto& [n, _] : m) out.insert(n);
    return out;
  };
  // Per family: backends-N, local-backends-N, affinity-backends-T.
  std::set<uint32_t> before[2][3] = {
      {sizes_of(s4_.lb_sets), sizes_of(s4_.local_lb_sets), sizes_of(s4_.affinity_sets)},
      {sizes_of(s6_.lb_sets), sizes_of(s6_.local_lb_sets), sizes_of(s6_.affinity_sets)}};
  std::set<std::pair<std::string, std::string>> redoing[2];
  auto redo = [&](const model::ServiceKey& key) {
    PlannedService next{snap.find_ptr(key)};
    s4_.redoing = &redoing[0];
    s6_.redoing = &redoing[1];
    struct Done {
      Planner* p;
      std::set<std::pair<std::string, std::string>>* keys;
      // The keys the new plan put in that another service still shares: the value of the last
      // of them in key order is put back (the new plan's went in last).
      ~Done() {
        for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
          FamilyState& st = p->state(f);
          st.redoing = nullptr;
          auto& k = keys[family_index(f)];
          if (!st.extra_refs.empty()) {
            for (const auto& sk : k) {
              if (!st.extra_refs.count(sk)) continue;
              auto set = p->table(f).sets.find(sk.first);
              if (set == p->table(f).sets.end()) continue;
              auto now = set->second.elements.get(sk.second);
              if (now && has_value(*now))
                st.contested.insert(sk);  // a set's element without a value is the same for all
            }
          }
          k.clear();
        }
      }
    } done{this, redoing};
    // Add first, then remove: an element both plans carry never leaves the table.
    if (next.state) {
      if (Status s = add_service(*next.state, true, next, &out); !s) {
        reject(s);  // it keeps the version planned before, if any
        return;
      }
    }
    auto it = services_.find(key);
    if (it != services_.end()) {
      // The elements the old state put in are those it plans to again (same context).
      PlannedService old;
      plan_service(*it->second.state, nullptr, old, [&](IpFamily f, SetId id, Element&& e) {
        remove_element(f, id, e, &changes_for(&out, f));
      });
      forget_service(it->second);
    }
    if (next.state) {
      remember_service(next);
      if (it != services_.end()) {
        it->second = std::move(next);
      } else {
        services_.emplace(key, std::move(next));
      }
    } else if (it != services_.end()) {
      services_.erase(it);
    }
  };
  for (const auto& k : delta.removed) redo(k);
  for (const auto& k : delta.changed) redo(k);
  for (const auto& k : delta.added) redo(k);
  resolve_shared(IpFamily::kV4, &out);
  resolve_shared(IpFamily::kV6, &out);

  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    const auto& b = before[f == IpFamily::kV4 ? 0 : 1];
    const FamilyState& st = state(f);
    std::set<uint32_t> after[3] = {sizes_of(st.lb_sets), sizes_of(st.local_lb_sets),
                                   sizes_of(st.affinity_sets)};
    if (after[0] == b[0] && after[1] == b[1] && after[2] == b[2]) continue;
    TableChanges& ch = changes_for(&out, f);
    auto make = [](int kind, uint32_t n) {
      return kind == 2 ? affinity_backends_set(n) : backends_set(kind == 1, n);
    };
    for (int kind = 0; kind < 3; ++kind) {
      for (uint32_t n : after[kind]) {
        if (!b[kind].count(n)) ch.add_sets.push_back(make(kind, n));
      }
      for (uint32_t n : b[kind]) {
        if (!after[kind].count(n)) ch.del_sets.push_back(make(kind, n).name);
      }
    }
    rebuild_lb_chains(f);
    const Table& t = table(f);
    for (const char* c : {names::kLb, names::kLocalLb, names::kAffinityRecord})
      ch.replace_chains.push_back(t.chains.at(c));
    // Their jumps to affinity-record come and go with the first and last affinity timeout.
    if (after[2].empty() != b[2].empty()) {
      for (const char* c : {names::kNatPostrouting, names::kNatInput})
        ch.replace_chains.push_back(t.chains.at(c));
    }
  }

  // Normalise each family's changes: an element deleted and added again with the same value
  // is no change at all; sets created and deleted in one update cancel out.
  std::vector<TableChanges> result;
  for (auto& ch : out) {
    // Affinity pairs that left a set and are in none now (whole sets deleted included).
    std::set<std::string> forget;
    for (const auto& [s, e] : ch.del_elements) {
      if (s.rfind("affinity-backends-", 0) != 0) continue;
      bool routed = false;
      for (const auto& [_, set] : state(ch.family).affinity_sets)
        routed |= set->elements.contains(e.key);
      if (!routed) forget.insert(e.key);
    }
    std::map<std::pair<std::string, std::string>, Element> added;
    for (auto& [s, e] : ch.add_elements) added[{s, e.key}] = e;
    std::map<std::pair<std::string, std::string>, Element> deleted;
    for (auto& [s, e] : ch.del_elements) {
      if (!deleted.count({s, e.key})) deleted[{s, e.key}] = e;
    }
    TableChanges n;
    n.family = ch.family;
    const Table& t = table(ch.family);
    std::set<std::string> dels(ch.del_sets.begin(), ch.del_sets.end());
    std::set<std::string> delc(ch.del_chains.begin(), ch.del_chains.end());
    for (auto& s : ch.add_sets) {
      if (dels.erase(s.name) == 0) n.add_sets.push_back(s);
    }
    for (auto& c : ch.add_chains) {
      if (delc.erase(c.name) == 0) n.add_chains.push_back(c);
    }
    n.replace_chains = std::move(ch.replace_chains);
    // A set created and deleted within this update never reaches the kernel.
    std::set<std::string> fresh;
    for (const auto& s : n.add_sets) fresh.insert(s.name);
    for (auto& [k, e] : deleted) {
      if (dels.count(k.first) || fresh.count(k.first)) continue;  // its whole set goes, or is new
      auto a = added.find(k);
      if (a != added.end() && t.sets.count(k.first) &&
          t.sets.at(k.first).elements.get(k.second) == e) {
        added.erase(a);  // the same element went out and came back
        continue;
      }
      if (!t.sets.count(k.first)) continue;
      n.del_elements.emplace_back(k.first, e);
    }
    for (auto& [k, e] : added) {
      auto it = t.sets.find(k.first);
      if (it == t.sets.end()) continue;
      if (auto now = it->second.elements.get(k.second)) n.add_elements.emplace_back(k.first, *now);
    }
    n.del_sets.assign(dels.begin(), dels.end());
    n.del_chains.assign(delc.begin(), delc.end());
    n.forget_affinity.assign(forget.begin(), forget.end());
    // The content digest of every set whose elements change, in the same batch; a new set's
    // entry is added, a deleted set's deleted.
    std::set<std::string> touched(fresh);
    for (const auto& [name, _] : n.del_elements) touched.insert(name);
    for (const auto& [name, _] : n.add_elements) touched.insert(name);
    for (const auto& name : touched) {
      auto it = t.sets.find(name);
      if (it == t.sets.end()) continue;
      auto entry = digest_entry(it->second);
      if (!entry) continue;
      if (!fresh.count(name)) n.del_digests.push_back(entry->key);
      n.add_digests.push_back(std::move(*entry));
    }
    for (const auto& name : n.del_sets) {
      if (auto key = digest_key(name)) n.del_digests.push_back(*key);
    }
    if (!n.empty()) result.push_back(std::move(n));
  }
  return result;
}

}  // namespace endpointd::proxy
