// Builds the pre-encoded zone of a Snapshot (Kubernetes DNS-Based Service Discovery 1.1.0),
// whole or incrementally from a Delta: the names and records of each service, reverse and pod
// names, the apex, and the sharded index the lookup reads.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "dns/zone.h"
#include "dns/zone_block.h"
#include "dns/zone_names.h"

#include "model/routing.h"

namespace endpointd::dns {

using model::IpAddr;

std::optional<PodMode> parse_pod_mode(std::string_view s) {
  if (s == "disabled") return PodMode::kDisabled;
  if (s == "insecure") return PodMode::kInsecure;
  if (s == "verified") return PodMode::kVerified;
  return std::nullopt;
}

using names::must_name;
using names::NameBuf;
using names::reverse_name;
using names::wire_of;

namespace {

constexpr uint8_t kInAddrSuffix = 14;  // \7in-addr\4arpa\0
constexpr uint8_t kIp6Suffix = 10;     // \3ip6\4arpa\0

struct KeyHash {
  size_t operator()(const model::ServiceKey& k) const {
    return std::hash<std::string>{}(k.ns) * 0x9e3779b97f4a7c15ull ^
           std::hash<std::string>{}(k.name);
  }
};

}  // namespace

class ZoneBuilder::Impl {
 public:
  explicit Impl(ZoneOptions opts)
      : opts_(std::move(opts)), writer_(opts_.ttl), pod_answers_(std::make_shared<AnswerLog>()) {
    name_setup();
  }

  void name_setup() {
    apex_ = must_name(opts_.zone);
    svc_suffix_ = must_name("svc." + opts_.zone);
    pod_suffix_ = must_name("pod." + opts_.zone);
    mname_ = must_name("ns.dns." + opts_.zone);
    rname_ = must_name("hostmaster." + opts_.zone);
    other_apexes_.clear();
    for (const auto& z : opts_.other_zones) other_apexes_.push_back(must_name(z));
  }

  ZonePtr apply(const model::SnapshotPtr& snap, const model::Delta& delta) {
    stats_ = {};
    ops_.clear();
    cur_ = snap.get();
    if (!snap->synced) {
      clear_all();
      prev_ = nullptr;
      return publish(snap->generation, false);
    }
    if (!prev_) {
      stats_.full = true;
      services_.reserve(snap->services.size());
      for (const auto& sp : snap->services) add_service(sp);
      if (opts_.pod_mode != PodMode::kDisabled) update_pods(snap->pods);
    } else {
      bool follows = delta.from_generation == prev_->generation &&
                     delta.to_generation == snap->generation &&
                     prev_->generation != snap->generation;
      const model::Delta& d = follows ? delta : (diffed_ = model::diff(prev_.get(), *snap));
      touched_.clear();
      for (const auto& key : d.removed) {
        remove_service(key);
        touched_.push_back(key);
      }
      for (const auto* keys : {&d.changed, &d.added})
        for (const auto& key : *keys) {
          touched_.push_back(key);
          const model::ServiceStatePtr* sp = snap->services.find(key);
          if (!sp) {
            remove_service(key);
            continue;
          }
          auto it = services_.find(key);
          if (it != services_.end() && it->second.state == *sp) continue;
          remove_service(key);
          add_service(*sp);
        }
      rechase();
      if (d.pods_changed && opts_.pod_mode != PodMode::kDisabled) update_pods(snap->pods);
    }
    materialize();
    prev_ = snap;
    cur_ = nullptr;
    return publish(snap->generation, true);
  }

  // A new zone from the same snapshot under new options (a reloaded configuration): every
  // block is built again; what drain support remembers of the old ones stays.

  ZonePtr reconfigure(ZoneOptions opts) {
    uint64_t generation = zone_ ? zone_->generation() : 0;
    clear_all();
    opts_ = std::move(opts);
    writer_ = BlockWriter(opts_.ttl);
    name_setup();
    model::SnapshotPtr last = std::move(prev_);
    prev_ = nullptr;
    if (!last) return publish(generation, false);
    return apply(last, model::Delta{});
  }

  std::optional<int64_t> last_served_ns(const IpAddr& a) const {
    int64_t best = pod_answers_->last(a);
    if (auto it = departed_.find(a); it != departed_.end()) best = std::max(best, it->second);
    if (auto it = by_address_.find(a); it != by_address_.end())
      for (const RecordSet* s : it->second)
        best = std::max(best, s->last_served_ns.load(std::memory_order_relaxed));
    for (const auto& b : retired_)
      for (const RecordSet& s : b->sets())
        if (std::find(s.addresses.begin(), s.addresses.end(), a) != s.addresses.end())
          best = std::max(best, s.last_served_ns.load(std::memory_order_relaxed));
    if (best == 0) return std::nullopt;
    return best;
  }

  int64_t live_served_ns(const IpAddr& a) const {
    int64_t best = pod_answers_->last(a);
    if (auto it = by_address_.find(a); it != by_address_.end())
      for (const RecordSet* s : it->second)
        best = std::max(best, s->last_served_ns.load(std::memory_order_relaxed));
    return best;
  }

  void left_zone_stamps(int64_t horizon_ns, std::map<IpAddr, int64_t>& out) const {
    auto note = [&](const IpAddr& a, int64_t ns) {
      if (ns == 0 || ns < horizon_ns) return;
      int64_t& v = out[a];
      v = std::max(v, ns);
    };
    for (const auto& [a, ns] : departed_) note(a, ns);
    for (const auto& b : retired_)
      for (const RecordSet& s : b->sets()) {
        int64_t ns = s.last_served_ns.load(std::memory_order_relaxed);
        if (ns == 0 || ns < horizon_ns) continue;
        for (const IpAddr& a : s.addresses) note(a, ns);
      }
  }

  void harvest(int64_t horizon_ns) {
    for (auto it = retired_.begin(); it != retired_.end();) {
      // Only we hold it: no worker can stamp it any more, its record is final.
      if (it->use_count() == 1) {
        for (const RecordSet& s : (*it)->sets()) {
          int64_t ns = s.last_served_ns.load(std::memory_order_relaxed);
          if (ns == 0 || ns < horizon_ns) continue;  // never served, or expired
          for (const IpAddr& a : s.addresses) {
            int64_t& d = departed_[a];
            d = std::max(d, ns);
          }
        }
        *it = std::move(retired_.back());
        retired_.pop_back();
      } else {
        ++it;
      }
    }
    std::erase_if(departed_, [&](const auto& kv) { return kv.second < horizon_ns; });
  }

  ZonePtr zone_;
  Stats stats_;
  std::vector<BlockPtr> retired_;

 private:
  struct ServiceEntry {
    model::ServiceStatePtr state;
    BlockPtr block;
    std::vector<std::pair<IpAddr, std::string_view>> ptrs;  // targets: names in `block`
    std::vector<IpAddr> pod_addresses;
    std::optional<WireName> ns_name;  // "<ns>.svc.<zone>", counted while the block has names
    std::optional<model::ServiceKey> chases;  // ExternalName: the in-zone service it names
  };
  struct PtrName {
    std::vector<std::string_view> targets;
    BlockPtr block;
    bool dirty = false;
  };
  struct SharedName {  // namespace names (empty non-terminals) and pod names, counted
    uint32_t refs = 0;
    BlockPtr block;
    bool dirty = false;
    bool pod = false;
    IpAddr address;
    std::optional<WireName> parent;
  };
  struct Op {
    uint64_t hash;
    std::string_view name;
    const ZoneNode* remove;               // set: remove this node
    std::shared_ptr<const ZoneNode> add;  // otherwise: add this one
  };

  void clear_all() {
    for (auto& [k, e] : services_)
      if (e.block) remove_block(e.block);
    for (auto& [a, p] : ptrs_)
      if (p.block) remove_block(p.block);
    for (auto& [n, s] : shared_)
      if (s.block) remove_block(s.block);
    if (apex_block_) remove_block(apex_block_);
    services_.clear();
    ptrs_.clear();
    shared_.clear();
    pods_.clear();
    dirty_ptrs_.clear();
    dirty_shared_.clear();
    apex_block_ = nullptr;
    ops_.clear();
    zone_ = nullptr;
    by_address_.clear();
  }

  void add_block(const BlockPtr& b) {
    for (const ZoneNode& n : b->nodes())
      ops_.push_back({name_hash(n.name), n.name, nullptr, std::shared_ptr<const ZoneNode>(b, &n)});
    for (const RecordSet& s : b->sets())
      for (const IpAddr& a : s.addresses) {
        auto& v = by_address_[a];
        if (v.empty() || v.back() != &s) v.push_back(&s);
      }
  }
  void remove_block(const BlockPtr& b) {
    for (const ZoneNode& n : b->nodes()) ops_.push_back({name_hash(n.name), n.name, &n, nullptr});
    for (const RecordSet& s : b->sets())
      for (const IpAddr& a : s.addresses) {
        auto it = by_address_.find(a);
        if (it == by_address_.end()) continue;
        std::erase(it->second, &s);
        if (it->second.empty()) by_address_.erase(it);
      }
    retired_.push_back(b);
  }

  void add_service(const model::ServiceStatePtr& sp) {
    ++stats_.services;
    ServiceEntry e = build_service(*sp);
    e.state = sp;
    if (e.block) {
      add_block(e.block);
      e.ns_name = NameBuf().text(sp->key().ns).finish(svc_suffix_);
      if (e.ns_name) ref(*e.ns_name, +1, nullptr, nullptr);
      for (const auto& [a, target] : e.ptrs) {
        PtrName& p = ptrs_[a];
        p.targets.push_back(target);
        mark(a, p);
      }
    }
    for (const IpAddr& a : e.pod_addresses) ref_pod(sp->key().ns, a, +1);
    if (e.chases) chasers_[*e.chases].push_back(sp->key());
    services_.insert_or_assign(sp->key(), std::move(e));
  }

  // ExternalName services whose in-zone target changed in this apply: built again, so the
  // records that follow their CNAME are the target's as of this snapshot.
  void rechase() {
    if (chasers_.empty()) return;
    std::sort(touched_.begin(), touched_.end());
    rebuilt_.clear();
    for (const auto& key : touched_) {
      auto it = chasers_.find(key);
      if (it == chasers_.end()) continue;
      for (const auto& c : it->second)
        if (!std::binary_search(touched_.begin(), touched_.end(), c)) rebuilt_.push_back(c);
    }
    std::sort(rebuilt_.begin(), rebuilt_.end());
    rebuilt_.erase(std::unique(rebuilt_.begin(), rebuilt_.end()), rebuilt_.end());
    for (const auto& c : rebuilt_) {
      const model::ServiceStatePtr* sp = cur_->services.find(c);
      remove_service(c);
      if (sp) add_service(*sp);
    }
  }

  void remove_service(const model::ServiceKey& key) {
    auto it = services_.find(key);
    if (it == services_.end()) return;
    ++stats_.services;
    ServiceEntry& e = it->second;
    if (e.block) {
      remove_block(e.block);
      if (e.ns_name) ref(*e.ns_name, -1, nullptr, nullptr);
      for (const auto& [a, target] : e.ptrs) {
        auto pit = ptrs_.find(a);
        if (pit == ptrs_.end()) continue;
        auto& t = pit->second.targets;
        if (auto f = std::find(t.begin(), t.end(), target); f != t.end()) t.erase(f);
        mark(a, pit->second);
      }
    }
    for (const IpAddr& a : e.pod_addresses) ref_pod(key.ns, a, -1);
    if (e.chases) {
      auto c = chasers_.find(*e.chases);
      if (c != chasers_.end()) {
        std::erase(c->second, key);
        if (c->second.empty()) chasers_.erase(c);
      }
    }
    services_.erase(it);
  }

  void mark(const IpAddr& a, PtrName& p) {
    if (!p.dirty) {
      p.dirty = true;
      dirty_ptrs_.push_back(a);
    }
  }

  void ref(const WireName& name, int delta, const IpAddr* pod_address, const WireName* parent) {
    auto [it, inserted] = shared_.try_emplace(std::string(name.view()));
    SharedName& s = it->second;
    if (inserted && pod_address) {
      s.pod = true;
      s.address = *pod_address;
      if (parent) s.parent = *parent;
    }
    uint32_t before = s.refs;
    if (delta < 0 && s.refs == 0) return;
    s.refs = delta > 0 ? s.refs + 1 : s.refs - 1;
    if ((before == 0) == (s.refs == 0)) return;
    if (!s.dirty) {
      s.dirty = true;
      dirty_shared_.push_back(it->first);
    }
    if (s.parent) ref(*s.parent, s.refs ? +1 : -1, nullptr, nullptr);
  }

  void ref_pod(const std::string& ns, const IpAddr& a, int delta) {
    auto name = NameBuf().text(a.dashed()).text(ns).finish(pod_suffix_);
    auto parent = NameBuf().text(ns).finish(pod_suffix_);
    if (!name || !parent) return;
    ref(*name, delta, &a, &*parent);
  }

  void update_pods(const std::vector<model::PodPtr>& next) {
    auto contribute = [&](const model::Pod& p, int delta) {
      if (p.host_network || p.terminating || !opts_.exposes(p.key.ns)) return;
      for (const IpAddr& a : p.pod_ips) ref_pod(p.key.ns, a, delta);
    };
    size_t i = 0, j = 0;
    while (i < pods_.size() || j < next.size()) {
      if (j == next.size() || (i < pods_.size() && pods_[i]->key < next[j]->key)) {
        contribute(*pods_[i++], -1);
      } else if (i == pods_.size() || next[j]->key < pods_[i]->key) {
        contribute(*next[j++], +1);
      } else {
        if (pods_[i] != next[j]) {
          contribute(*pods_[i], -1);
          contribute(*next[j], +1);
        }
        ++i;
        ++j;
      }
    }
    pods_ = next;
  }

  void materialize() {
    for (const IpAddr& a : dirty_ptrs_) {
      auto it = ptrs_.find(a);
      if (it == ptrs_.end()) continue;
      PtrName& p = it->second;
      p.dirty = false;
      if (p.block) remove_block(p.block);
      p.block = nullptr;
      if (p.targets.empty()) {
        ptrs_.erase(it);
        continue;
      }
      p.block = build_ptr(a, p.targets);
      add_block(p.block);
    }
    dirty_ptrs_.clear();
    for (const std::string& key : dirty_shared_) {
      auto it = shared_.find(key);
      if (it == shared_.end()) continue;
      SharedName& s = it->second;
      s.dirty = false;
      if (s.refs > 0 && !s.block) {
        s.block = s.pod ? build_pod(wire_of(key), s.address) : build_exists(wire_of(key));
        add_block(s.block);
      } else if (s.refs == 0) {
        if (s.block) remove_block(s.block);
        shared_.erase(it);
      }
    }
    dirty_shared_.clear();
  }

  // --- blocks ---

  ServiceEntry build_service(const model::ServiceState& st) {
    ServiceEntry e;
    const model::Service& svc = st.service;
    if (!opts_.exposes(svc.key.ns)) return e;  // outside the namespaces filter: NXDOMAIN
    if (opts_.pod_mode != PodMode::kDisabled)
      for (const auto& ep : st.endpoints)
        if (!ep.conditions.terminating) e.pod_addresses.push_back(ep.address);
    auto base = NameBuf().text(svc.key.name).text(svc.key.ns).finish(svc_suffix_);
    if (!base) return e;  // a name DNS cannot carry
    writer_.clear(apex_.len);
    uint32_t b = writer_.name(*base);
    if (svc.type == model::ServiceType::kExternalName) {
      auto target = name_from_text(svc.external_name);
      if (!target) return e;
      writer_.set_cname(b);
      WireName lower = *target;
      lowercase_name({lower.bytes.data(), lower.len});
      auto key = service_named(lower);
      // A name of the zone is written as the zone has it (lower case), any other as given.
      uint32_t t = writer_.name(key ? lower : *target);
      writer_.name_record(b, type::kCNAME, t);
      if (!ours(lower)) writer_.chase_out(b, t);
      if (key) {
        // In the zone: A and AAAA answers carry the target's records after the CNAME, as
        // CoreDNS answers (the client need not ask again).
        e.chases = key;
        const model::ServiceStatePtr* tp = cur_ ? cur_->services.find(*key) : nullptr;
        std::vector<IpAddr> addrs = tp ? chased_addresses(**tp) : std::vector<IpAddr>{};
        for (uint16_t set_type : {type::kA, type::kAAAA}) {
          bool first = true;
          for (const IpAddr& a : addrs) {
            if ((a.is_v4() ? type::kA : type::kAAAA) != set_type) continue;
            if (first) writer_.name_record_in(b, set_type, type::kCNAME, t);
            first = false;
            writer_.chased_address(b, set_type, t, a);
          }
        }
      }
      e.block = writer_.finish();
      return e;
    }
    auto srv_names =
        [&](const model::ServicePort& p) -> std::optional<std::pair<uint32_t, uint32_t>> {
      auto proto = model::to_string(p.protocol);
      auto owner = NameBuf().text(p.name, '_').text(proto, '_').finish(*base);
      auto parent = NameBuf().text(proto, '_').finish(*base);
      if (!owner || !parent) return std::nullopt;
      uint32_t o = writer_.name(*owner);
      uint32_t pa = writer_.name(*parent);
      writer_.exists(pa);
      return std::make_pair(o, pa);
    };
    std::vector<std::pair<IpAddr, uint32_t>> ptrs;
    if (!svc.headless && !svc.cluster_ips.empty()) {
      if (opts_.ignore_empty_service && !any_ready(st)) return e;  // NXDOMAIN
      std::vector<IpAddr> ips;
      for (const auto& ip : svc.cluster_ips)
        if (std::find(ips.begin(), ips.end(), ip) == ips.end()) ips.push_back(ip);
      for (const auto& ip : ips) {
        writer_.address(b, ip);
        ptrs.emplace_back(ip, b);
      }
      for (const auto& p : svc.ports) {
        if (p.name.empty()) continue;
        auto names = srv_names(p);
        if (!names) continue;
        writer_.srv(names->first, 0, 100, p.port, b);
        for (const auto& ip : ips) writer_.additional_address(names->first, type::kSRV, b, ip);
      }
    } else {
      if (opts_.no_endpoints) return e;  // NXDOMAIN, as CoreDNS's noendpoints answers
      // Headless: the endpoints themselves, as the routing rule answers them (terminating ones
      // leave at once).
      std::vector<std::pair<const model::MergedEndpoint*, uint32_t>> eps;
      for (const auto& ep : st.endpoints) {
        if (!model::dns_answers(svc, ep)) continue;
        std::optional<WireName> hn;
        if (ep.hostname.empty() && opts_.endpoint_pod_names && ep.target_ref &&
            ep.target_ref->kind == "Pod" && !ep.target_ref->name.empty()) {
          hn = NameBuf().text(ep.target_ref->name).finish(*base);  // none: not a DNS label
        }
        if (!hn) {
          hn =
              NameBuf().text(ep.hostname.empty() ? ep.address.dashed() : ep.hostname).finish(*base);
        }
        if (!hn) continue;
        eps.emplace_back(&ep, writer_.name(*hn));
      }
      if (eps.empty()) return e;  // NXDOMAIN, as the spec asks
      for (const auto& [ep, hn] : eps) {
        writer_.address(b, ep->address);
        writer_.address(hn, ep->address);
        ptrs.emplace_back(ep->address, hn);
      }
      for (const auto& p : svc.ports) {
        if (p.name.empty()) continue;
        size_t with_port = 0;
        for (const auto& [ep, hn] : eps) with_port += ep->port_for(p).has_value();
        if (with_port == 0) continue;
        auto names = srv_names(p);
        if (!names) continue;
        auto weight = static_cast<uint16_t>(std::max<size_t>(1, 100 / with_port));
        for (const auto& [ep, hn] : eps) {
          auto port = ep->port_for(p);
          if (!port) continue;
          writer_.srv(names->first, 0, weight, *port, hn);
          writer_.additional_address(names->first, type::kSRV, hn, ep->address);
        }
      }
    }
    e.block = writer_.finish();
    if (opts_.reverse)
      for (const auto& [a, id] : ptrs) e.ptrs.emplace_back(a, writer_.node_name(id));
    return e;
  }

  // Whether `name` (lower case) is in this zone or in one of the agent's other zones.
  bool ours(const WireName& name) const {
    if (name_under(name, apex_)) return true;
    return std::any_of(other_apexes_.begin(), other_apexes_.end(),
                       [&](const WireName& z) { return name_under(name, z); });
  }

  // The service that `name` (lower case) names when it is <service>.<namespace>.svc.<zone>.
  std::optional<model::ServiceKey> service_named(const WireName& name) const {
    size_t l1 = name.bytes[0];
    if (l1 == 0 || 1 + l1 >= name.len) return std::nullopt;
    size_t l2 = name.bytes[1 + l1];
    size_t rest = 1 + l1 + 1 + l2;
    if (l2 == 0 || rest + svc_suffix_.len != name.len ||
        std::memcmp(name.bytes.data() + rest, svc_suffix_.bytes.data(), svc_suffix_.len) != 0)
      return std::nullopt;
    const char* p = reinterpret_cast<const char*>(name.bytes.data());  // our bytes
    return model::ServiceKey{std::string(p + 2 + l1, l2), std::string(p + 1, l1)};
  }

  // The addresses an A or AAAA query for the service `st` gets: its cluster IPs, or a headless
  // service's endpoints.
  std::vector<IpAddr> chased_addresses(const model::ServiceState& st) const {
    std::vector<IpAddr> out;
    const model::Service& svc = st.service;
    if (!opts_.exposes(svc.key.ns) || svc.type == model::ServiceType::kExternalName) return out;
    if (!svc.headless && !svc.cluster_ips.empty()) {
      if (opts_.ignore_empty_service && !any_ready(st)) return out;
      for (const auto& ip : svc.cluster_ips)
        if (std::find(out.begin(), out.end(), ip) == out.end()) out.push_back(ip);
    } else if (!opts_.no_endpoints) {
      for (const auto& ep : st.endpoints)
        if (model::dns_answers(svc, ep) &&
            std::find(out.begin(), out.end(), ep.address) == out.end())
          out.push_back(ep.address);
    }
    return out;
  }

  static bool any_ready(const model::ServiceState& st) {
    return std::any_of(st.endpoints.begin(), st.endpoints.end(),
                       [](const model::MergedEndpoint& ep) { return ep.conditions.ready; });
  }

  BlockPtr build_ptr(const IpAddr& a, std::vector<std::string_view> targets) {
    std::sort(targets.begin(), targets.end());
    targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
    writer_.clear(a.is_v4() ? kInAddrSuffix : kIp6Suffix);
    uint32_t n = writer_.name(reverse_name(a));
    for (auto t : targets) writer_.name_record(n, type::kPTR, writer_.name(wire_of(t)));
    return writer_.finish();
  }

  BlockPtr build_pod(const WireName& name, const IpAddr& a) {
    writer_.clear(apex_.len);
    writer_.address(writer_.name(name), a);
    return writer_.finish();
  }

  BlockPtr build_exists(const WireName& name) {
    writer_.clear(apex_.len);
    writer_.exists(writer_.name(name));
    return writer_.finish();
  }

  std::array<uint8_t, 20> soa_numbers(uint64_t generation) const {
    std::array<uint8_t, 20> v{};
    store_u32(v.data(), static_cast<uint32_t>(generation));
    store_u32(v.data() + 4, 7200);
    store_u32(v.data() + 8, 1800);
    store_u32(v.data() + 12, 86400);
    store_u32(v.data() + 16, opts_.negative_ttl);
    return v;
  }

  // Apex: SOA (its serial is the generation) and NS; dns-version; the svc and pod parents.
  BlockPtr build_apex(uint64_t generation) {
    writer_.clear(apex_.len);
    uint32_t apex = writer_.name(apex_);
    auto numbers = soa_numbers(generation);
    writer_.soa(apex, writer_.name(mname_), writer_.name(rname_), numbers);
    writer_.name_record(apex, type::kNS, writer_.name(mname_));
    writer_.txt(writer_.name(must_name("dns-version." + opts_.zone)), "1.1.0");
    writer_.exists(writer_.name(svc_suffix_));
    if (opts_.pod_mode != PodMode::kDisabled) writer_.exists(writer_.name(pod_suffix_));
    return writer_.finish();
  }

  void soa_tail(Zone& z, uint64_t generation) const {
    // type, class, ttl, rdlength, rdata (names uncompressed: the owner's place varies).
    std::vector<uint8_t>& t = z.soa_tail_;
    t.resize(10);
    store_u16(t.data(), type::kSOA);
    store_u16(t.data() + 2, kClassIN);
    store_u32(t.data() + 4, opts_.negative_ttl);
    auto rd = soa_numbers(generation);
    store_u16(t.data() + 8, static_cast<uint16_t>(mname_.len + rname_.len + rd.size()));
    t.insert(t.end(), mname_.bytes.begin(), mname_.bytes.begin() + mname_.len);
    t.insert(t.end(), rname_.bytes.begin(), rname_.bytes.begin() + rname_.len);
    t.insert(t.end(), rd.begin(), rd.end());
  }

  // --- the index ---

  ZonePtr publish(uint64_t generation, bool synced) {
    if (synced) {
      if (apex_block_) remove_block(apex_block_);
      apex_block_ = build_apex(generation);
      add_block(apex_block_);
    }
    auto z = std::make_shared<Zone>();
    z->opts_ = opts_;
    z->apex_ = apex_;
    z->pod_suffix_ = pod_suffix_;
    z->generation_ = generation;
    z->synced_ = synced;
    z->pod_answers_ = pod_answers_;
    soa_tail(*z, generation);
    if (zone_) {
      z->shards_ = zone_->shards_;
      z->name_count_ = zone_->name_count_;
    }
    // Group the operations by shard (counting sort, arrival order kept inside a shard).
    shard_start_.assign(Zone::kShards + 1, 0);
    for (const Op& op : ops_) ++shard_start_[(op.hash & (Zone::kShards - 1)) + 1];
    for (size_t s = 0; s < Zone::kShards; ++s) shard_start_[s + 1] += shard_start_[s];
    by_shard_.resize(ops_.size());
    {
      std::vector<uint32_t> next(shard_start_.begin(), shard_start_.end() - 1);
      for (uint32_t i = 0; i < ops_.size(); ++i)
        by_shard_[next[ops_[i].hash & (Zone::kShards - 1)]++] = i;
    }
    stats_.names += ops_.size();
    for (size_t s = 0; s < Zone::kShards; ++s) {
      if (shard_start_[s] == shard_start_[s + 1]) continue;
      ++stats_.shards;
      entries_.clear();
      if (const auto& old = z->shards_[s])
        for (const auto& e : old->slots)
          if (e.node) entries_.push_back(e);
      for (uint32_t k = shard_start_[s]; k < shard_start_[s + 1]; ++k) {
        Op& op = ops_[by_shard_[k]];
        if (op.remove) {
          for (size_t x = 0; x < entries_.size(); ++x)
            if (entries_[x].node.get() == op.remove) {
              entries_[x] = std::move(entries_.back());
              entries_.pop_back();
              --z->name_count_;
              break;
            }
        } else {
          // Two blocks with one name (only from names a cluster cannot have) both stay; a
          // lookup finds one of them.
          entries_.push_back({op.hash, std::move(op.add)});
          ++z->name_count_;
        }
      }
      z->shards_[s] = make_shard(entries_);
    }
    ops_.clear();
    zone_ = z;
    return z;
  }

  static std::shared_ptr<const Zone::Shard> make_shard(std::vector<Zone::Entry>& entries) {
    if (entries.empty()) return nullptr;
    auto shard = std::make_shared<Zone::Shard>();
    size_t cap = 4;
    while (cap < entries.size() * 2) cap *= 2;
    shard->slots.resize(cap);
    shard->count = entries.size();
    for (auto& e : entries) {
      size_t i = (e.hash >> Zone::kShardBits) & (cap - 1);
      while (shard->slots[i].node) i = (i + 1) & (cap - 1);
      shard->slots[i] = std::move(e);
    }
    return shard;
  }

  ZoneOptions opts_;
  BlockWriter writer_;
  std::shared_ptr<AnswerLog> pod_answers_;
  WireName apex_, svc_suffix_, pod_suffix_, mname_, rname_;
  std::vector<WireName> other_apexes_;  // opts_.other_zones, lower case
  model::SnapshotPtr prev_;
  const model::Snapshot* cur_ = nullptr;  // the snapshot apply() is building from
  model::Delta diffed_;
  // In-zone ExternalName targets → the ExternalName services naming them.
  std::unordered_map<model::ServiceKey, std::vector<model::ServiceKey>, KeyHash> chasers_;
  std::vector<model::ServiceKey> touched_, rebuilt_;
  std::unordered_map<model::ServiceKey, ServiceEntry, KeyHash> services_;
  std::unordered_map<IpAddr, PtrName, model::IpAddrHash> ptrs_;
  std::unordered_map<std::string, SharedName> shared_;
  std::vector<model::PodPtr> pods_;
  std::vector<IpAddr> dirty_ptrs_;
  std::vector<std::string> dirty_shared_;
  BlockPtr apex_block_;
  std::unordered_map<IpAddr, std::vector<const RecordSet*>, model::IpAddrHash> by_address_;
  std::unordered_map<IpAddr, int64_t, model::IpAddrHash> departed_;
  std::vector<Op> ops_;
  std::vector<uint32_t> shard_start_, by_shard_;
  std::vector<Zone::Entry> entries_;
};

ZoneBuilder::ZoneBuilder(ZoneOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}
ZoneBuilder::~ZoneBuilder() = default;
ZonePtr ZoneBuilder::apply(const model::SnapshotPtr& snap, const model::Delta& delta) {
  return impl_->apply(snap, delta);
}
ZonePtr ZoneBuilder::reconfigure(ZoneOptions opts) {
  return impl_->reconfigure(std::move(opts));
}
ZonePtr ZoneBuilder::current() const {
  return impl_->zone_;
}
const ZoneBuilder::Stats& ZoneBuilder::last_stats() const {
  return impl_->stats_;
}
std::optional<int64_t> ZoneBuilder::last_served_ns(const IpAddr& a) const {
  return impl_->last_served_ns(a);
}

void ZoneBuilder::left_zone_stamps(int64_t horizon_ns, std::map<IpAddr, int64_t>& out) const {
  impl_->left_zone_stamps(horizon_ns, out);
}

int64_t ZoneBuilder::live_served_ns(const IpAddr& a) const {
  return impl_->live_served_ns(a);
}
void ZoneBuilder::harvest(int64_t horizon_ns) {
  impl_->harvest(horizon_ns);
}
size_t ZoneBuilder::retired_blocks() const {
  return impl_->retired_.size();
}

// ---------------------------------------------------------------------------------------

std::shared_ptr<const Zone> Zone::build(const model::Snapshot& snap, const ZoneOptions& opts) {
  ZoneBuilder b(opts);
  // The builder keeps the snapshot it applied; a copy that shares its services suffices.
  return b.apply(std::make_shared<model::Snapshot>(snap));
}

std::shared_ptr<const Zone> Zone::with_also(const std::shared_ptr<const Zone>& first,
                                            std::vector<std::shared_ptr<const Zone>> also) {
  if (also.empty()) return first;
  auto z = std::make_shared<Zone>(*first);
  z->also_ = std::move(also);
  return z;
}

std::shared_ptr<const Zone> Zone::unsynced(const ZoneOptions& opts) {
  auto z = std::make_shared<Zone>();
  z->opts_ = opts;
  z->apex_ = must_name(opts.zone);
  z->pod_suffix_ = must_name("pod." + opts.zone);
  return z;
}

}  // namespace endpointd::dns
