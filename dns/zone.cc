// Builds the pre-encoded zone of a Snapshot (Kubernetes DNS-Based Service Discovery 1.1.0)
// and answers lookups against it.
#include "dns/zone.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <arpa/inet.h>

namespace endpointd::dns {

using model::IpAddr;

std::optional<PodMode> parse_pod_mode(std::string_view s) {
  if (s == "disabled") return PodMode::kDisabled;
  if (s == "insecure") return PodMode::kInsecure;
  if (s == "verified") return PodMode::kVerified;
  return std::nullopt;
}

namespace {

WireName must_name(const std::string& text) {
  auto n = name_from_text(text);
  if (!n) return *name_from_text(".");
  lowercase_name({n->bytes.data(), n->len});
  return *n;
}

std::string key_of(const WireName& n) { return std::string(n.view()); }

std::string reverse_text(const IpAddr& a) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const uint8_t* b = a.data();
  if (a.is_v4()) {
    for (int i = 3; i >= 0; --i) out += std::to_string(b[i]) + ".";
    return out + "in-addr.arpa";
  }
  for (int i = 15; i >= 0; --i) {
    out.push_back(kHex[b[i] & 0xF]);
    out.push_back('.');
    out.push_back(kHex[b[i] >> 4]);
    out.push_back('.');
  }
  return out + "ip6.arpa";
}

struct Rr {
  uint16_t type = 0;
  WireName owner;
  std::vector<uint8_t> rdata;  // A, AAAA, TXT, and the fixed part of SOA / SRV
  std::optional<WireName> target;
  std::optional<WireName> target2;  // SOA rname
  bool target_first = true;         // SRV: the fixed part comes before the target
  bool compress_target = true;
};

struct PendingSet {
  std::vector<Rr> answer, authority, additional;
  std::vector<IpAddr> addresses;
};

struct PendingNode {
  WireName name;
  std::map<uint16_t, PendingSet> sets;
  bool cname = false;
  bool reverse = false;
};

Rr address_rr(const WireName& owner, const IpAddr& a) {
  Rr r;
  r.type = a.is_v4() ? type::kA : type::kAAAA;
  r.owner = owner;
  r.rdata.assign(a.data(), a.data() + a.size());
  return r;
}

Rr name_rr(uint16_t t, const WireName& owner, const WireName& target) {
  Rr r;
  r.type = t;
  r.owner = owner;
  r.target = target;
  return r;
}

Rr srv_rr(const WireName& owner, uint16_t prio, uint16_t weight, uint16_t port, const WireName& target) {
  Rr r;
  r.type = type::kSRV;
  r.owner = owner;
  r.rdata.resize(6);
  store_u16(r.rdata.data(), prio);
  store_u16(r.rdata.data() + 2, weight);
  store_u16(r.rdata.data() + 4, port);
  r.target = target;
  r.target_first = false;
  r.compress_target = false;  // RFC 2782: no compression in the SRV target
  return r;
}

void write_rr(Writer& w, const Rr& r, uint32_t ttl) {
  size_t at = w.begin_rr(r.owner.span(), r.type, kClassIN, ttl);
  if (r.target && r.target_first) {
    w.name(r.target->span(), r.compress_target);
    if (r.target2) w.name(r.target2->span(), r.compress_target);
    w.bytes(r.rdata);
  } else {
    w.bytes(r.rdata);
    if (r.target) w.name(r.target->span(), r.compress_target);
  }
  w.end_rr(at);
}

bool label_at_boundary_suffix(const WireName& name, const WireName& suffix, size_t* offset) {
  if (name.len < suffix.len) return false;
  size_t p = 0;
  while (p < name.len) {
    if (name.len - p == suffix.len) {
      if (std::memcmp(name.bytes.data() + p, suffix.bytes.data(), suffix.len) != 0) return false;
      if (offset) *offset = p;
      return true;
    }
    if (name.bytes[p] == 0) return false;
    p += 1 + name.bytes[p];
  }
  return false;
}

}  // namespace

class ZoneBuilder {
 public:
  ZoneBuilder(const ZoneOptions& opts) : opts_(opts) {
    apex_ = must_name(opts.zone);
    pod_suffix_ = must_name("pod." + opts.zone);
  }

  std::shared_ptr<Zone> build(const model::Snapshot* snap) {
    auto z = std::make_shared<Zone>();
    z->opts_ = opts_;
    z->apex_ = apex_;
    z->pod_suffix_ = pod_suffix_;
    z->generation_ = snap ? snap->generation : 0;
    z->synced_ = snap && snap->synced;
    soa_tail(*z);
    if (!z->synced_) return z;

    const std::string& zone = opts_.zone;
    // Apex: SOA and NS.
    {
      PendingSet& soa = set(apex_, type::kSOA);
      Rr r;
      r.type = type::kSOA;
      r.owner = apex_;
      r.target = must_name("ns.dns." + zone);
      r.target2 = must_name("hostmaster." + zone);
      r.rdata = soa_numbers(z->generation_);
      soa.answer.push_back(std::move(r));
      set(apex_, type::kNS).answer.push_back(name_rr(type::kNS, apex_, must_name("ns.dns." + zone)));
    }
    {
      WireName v = must_name("dns-version." + zone);
      Rr r;
      r.type = type::kTXT;
      r.owner = v;
      r.rdata = {5, '1', '.', '1', '.', '0'};
      set(v, type::kTXT).answer.push_back(std::move(r));
    }
    for (const auto& sp : snap->services) add_service(*sp);
    if (opts_.pod_mode != PodMode::kDisabled) {
      ensure(pod_suffix_);
      for (const auto& sp : snap->services)
        for (const auto& e : sp->endpoints)
          if (!e.conditions.terminating) add_pod(sp->key().ns, e.address);
      for (const auto& p : snap->pods)
        if (!p->host_network && !p->terminating)
          for (const auto& a : p->pod_ips) add_pod(p->key.ns, a);
    }
    encode(*z);
    return z;
  }

 private:
  PendingNode& node(const WireName& n) {
    auto [it, inserted] = pending_.try_emplace(key_of(n));
    PendingNode& pn = it->second;  // references survive rehashing, iterators do not
    if (inserted) {
      pn.name = n;
      ensure_ancestors(n);
    }
    return pn;
  }
  PendingSet& set(const WireName& n, uint16_t t) { return node(n).sets[t]; }

  // Names between a record's owner and the apex exist (empty non-terminals: NODATA).
  void ensure_ancestors(const WireName& n) {
    size_t off = 0;
    if (!label_at_boundary_suffix(n, apex_, &off) || off == 0) return;
    WireName parent;
    size_t skip = 1 + n.bytes[0];
    parent.len = static_cast<uint8_t>(n.len - skip);
    std::memcpy(parent.bytes.data(), n.bytes.data() + skip, parent.len);
    ensure(parent);
  }
  void ensure(const WireName& n) { node(n); }

  std::vector<uint8_t> soa_numbers(uint64_t generation) const {
    std::vector<uint8_t> v(20);
    store_u32(v.data(), static_cast<uint32_t>(generation));
    store_u32(v.data() + 4, 7200);
    store_u32(v.data() + 8, 1800);
    store_u32(v.data() + 12, 86400);
    store_u32(v.data() + 16, opts_.negative_ttl);
    return v;
  }

  void soa_tail(Zone& z) const {
    // type, class, ttl, rdlength, rdata (names uncompressed: the owner's place varies).
    WireName mname = must_name("ns.dns." + opts_.zone), rname = must_name("hostmaster." + opts_.zone);
    std::vector<uint8_t>& t = z.soa_tail_;
    t.resize(10);
    store_u16(t.data(), type::kSOA);
    store_u16(t.data() + 2, kClassIN);
    store_u32(t.data() + 4, opts_.negative_ttl);
    auto rd = soa_numbers(z.generation_);
    store_u16(t.data() + 8, static_cast<uint16_t>(mname.len + rname.len + rd.size()));
    t.insert(t.end(), mname.bytes.begin(), mname.bytes.begin() + mname.len);
    t.insert(t.end(), rname.bytes.begin(), rname.bytes.begin() + rname.len);
    t.insert(t.end(), rd.begin(), rd.end());
  }

  void add_reverse(const IpAddr& a, const WireName& target) {
    WireName r = must_name(reverse_text(a));
    PendingNode& n = node(r);
    n.reverse = true;
    PendingSet& s = n.sets[type::kPTR];
    for (const auto& rr : s.answer)
      if (rr.target && rr.target->view() == target.view()) return;
    s.answer.push_back(name_rr(type::kPTR, r, target));
  }

  void add_address(const WireName& owner, const IpAddr& a) {
    PendingSet& s = set(owner, a.is_v4() ? type::kA : type::kAAAA);
    for (const auto& x : s.addresses)
      if (x == a) return;
    s.answer.push_back(address_rr(owner, a));
    s.addresses.push_back(a);
  }

  void add_pod(const std::string& ns, const IpAddr& a) {
    add_address(must_name(a.dashed() + "." + ns + ".pod." + opts_.zone), a);
  }

  void add_service(const model::ServiceState& st) {
    const model::Service& svc = st.service;
    std::string base_text = svc.key.name + "." + svc.key.ns + ".svc." + opts_.zone;
    WireName base = must_name(base_text);
    if (svc.type == model::ServiceType::kExternalName) {
      auto target = name_from_text(svc.external_name);
      if (!target) return;
      PendingNode& n = node(base);
      n.cname = true;
      n.sets[type::kCNAME].answer.push_back(name_rr(type::kCNAME, base, *target));
      return;
    }
    auto srv_owner = [&](const model::ServicePort& p) {
      std::string proto(model::to_string(p.protocol));
      std::transform(proto.begin(), proto.end(), proto.begin(), [](char c) {
        return static_cast<char>((c >= 'A' && c <= 'Z') ? c + 32 : c);
      });
      return must_name("_" + p.name + "._" + proto + "." + base_text);
    };
    if (!svc.headless && !svc.cluster_ips.empty()) {
      for (const auto& ip : svc.cluster_ips) {
        add_address(base, ip);
        add_reverse(ip, base);
      }
      for (const auto& p : svc.ports) {
        if (p.name.empty()) continue;
        WireName owner = srv_owner(p);
        PendingSet& s = set(owner, type::kSRV);
        s.answer.push_back(srv_rr(owner, 0, 100, p.port, base));
        for (const auto& ip : svc.cluster_ips) {
          s.additional.push_back(address_rr(base, ip));
          s.addresses.push_back(ip);
        }
      }
      return;
    }
    // Headless: the endpoints themselves. Terminating ones leave at once.
    std::vector<const model::MergedEndpoint*> eps;
    for (const auto& e : st.endpoints) {
      if (e.conditions.terminating) continue;
      if (e.conditions.ready || svc.publish_not_ready_addresses) eps.push_back(&e);
    }
    if (eps.empty()) return;  // NXDOMAIN, as the spec asks
    std::vector<WireName> host_names;
    for (const auto* e : eps) {
      std::string host = e->hostname.empty() ? e->address.dashed() : e->hostname;
      WireName hn = must_name(host + "." + base_text);
      host_names.push_back(hn);
      add_address(base, e->address);
      add_address(hn, e->address);
      add_reverse(e->address, hn);
    }
    for (const auto& p : svc.ports) {
      if (p.name.empty()) continue;
      WireName owner = srv_owner(p);
      size_t with_port = 0;
      for (const auto* e : eps) with_port += e->port_for(p).has_value();
      if (with_port == 0) continue;
      uint16_t weight = static_cast<uint16_t>(std::max<size_t>(1, 100 / with_port));
      PendingSet& s = set(owner, type::kSRV);
      for (size_t i = 0; i < eps.size(); ++i) {
        auto port = eps[i]->port_for(p);
        if (!port) continue;
        s.answer.push_back(srv_rr(owner, 0, weight, *port, host_names[i]));
        s.additional.push_back(address_rr(host_names[i], eps[i]->address));
        s.addresses.push_back(eps[i]->address);
      }
    }
  }

  void encode(Zone& z) {
    std::vector<uint8_t> buf(65535);
    z.names_.reserve(pending_.size());
    for (auto& [key, pn] : pending_) {
      Zone::Node& n = z.names_[key];
      n.cname = pn.cname;
      n.reverse = pn.reverse;
      for (auto& [t, ps] : pn.sets) {
        auto rs = std::make_unique<RecordSet>();
        // A very large headless service may not fit one message: keep what fits.
        size_t keep_an = ps.answer.size(), keep_ar = ps.additional.size();
        while (true) {
          Writer w(buf.data(), buf.size());
          w.header(0, 0, 1, 0, 0, 0);
          w.name(pn.name.span());
          w.u16(t);
          w.u16(kClassIN);
          size_t start = w.size();
          for (size_t i = 0; i < keep_an; ++i) write_rr(w, ps.answer[i], opts_.ttl);
          size_t answer_end = w.size();
          for (size_t i = 0; i < keep_ar; ++i) write_rr(w, ps.additional[i], opts_.ttl);
          if (w.ok()) {
            rs->body.assign(buf.begin() + static_cast<ptrdiff_t>(start),
                            buf.begin() + static_cast<ptrdiff_t>(w.size()));
            rs->answer_bytes = static_cast<uint32_t>(answer_end - start);
            rs->ancount = static_cast<uint16_t>(keep_an);
            rs->arcount = static_cast<uint16_t>(keep_ar);
            break;
          }
          keep_an = std::max<size_t>(1, keep_an / 2);
          keep_ar = keep_ar / 2;
        }
        rs->addresses = ps.addresses;
        for (const auto& a : rs->addresses) z.by_address_[a].push_back(rs.get());
        n.sets.emplace_back(t, std::move(rs));
      }
    }
  }

  ZoneOptions opts_;
  WireName apex_, pod_suffix_;
  std::unordered_map<std::string, PendingNode> pending_;
};

std::shared_ptr<const Zone> Zone::build(const model::Snapshot& snap, const ZoneOptions& opts) {
  return ZoneBuilder(opts).build(&snap);
}

std::shared_ptr<const Zone> Zone::unsynced(const ZoneOptions& opts) {
  return ZoneBuilder(opts).build(nullptr);
}

bool Zone::in_zone(const WireName& q) const { return label_at_boundary_suffix(q, apex_, nullptr); }

Zone::Lookup Zone::lookup(const WireName& q, uint16_t qtype) const {
  Lookup r;
  auto it = names_.find(q.view());
  if (it != names_.end()) {
    const Node& n = it->second;
    r.soa = !n.reverse;
    if (n.cname && !n.sets.empty()) {
      r.kind = Kind::kAnswer;
      r.set = n.sets.front().second.get();
      return r;
    }
    for (const auto& [t, s] : n.sets) {
      if (t == qtype || qtype == type::kANY) {  // ANY: one RRset is enough (RFC 8482)
        r.kind = Kind::kAnswer;
        r.set = s.get();
        return r;
      }
    }
    r.kind = Kind::kNoData;
    return r;
  }
  if (!in_zone(q)) return r;  // kNotOurs
  if (!synced_) {
    r.kind = Kind::kNotSynced;
    return r;
  }
  r.kind = Kind::kNxDomain;
  if (opts_.pod_mode == PodMode::kInsecure) {
    // <dashed-ip>.<ns>.pod.<zone>: two labels, then the pod suffix.
    size_t l1 = q.bytes[0];
    if (l1 == 0 || l1 > 45 || 1u + l1 >= q.len) return r;
    size_t l2 = q.bytes[1 + l1];
    if (l2 == 0) return r;
    size_t rest = 1 + l1 + 1 + l2;
    if (rest + pod_suffix_.len != q.len ||
        std::memcmp(q.bytes.data() + rest, pod_suffix_.bytes.data(), pod_suffix_.len) != 0)
      return r;
    char text[64] = {};
    size_t dashes = 0;
    for (size_t i = 0; i < l1; ++i) dashes += q.bytes[1 + i] == '-';
    char sep = dashes == 3 ? '.' : ':';
    for (size_t i = 0; i < l1; ++i) {
      char c = static_cast<char>(q.bytes[1 + i]);
      text[i] = c == '-' ? sep : c;
    }
    uint8_t raw[16];
    if (sep == '.' && inet_pton(AF_INET, text, raw) == 1) {
      r.kind = Kind::kPodAddress;
      r.pod_address = IpAddr::from_bytes(model::IpFamily::kV4, raw);
    } else if (sep == ':' && inet_pton(AF_INET6, text, raw) == 1) {
      r.kind = Kind::kPodAddress;
      r.pod_address = IpAddr::from_bytes(model::IpFamily::kV6, raw);
    }
  }
  return r;
}

std::optional<int64_t> Zone::last_served_ns(const IpAddr& a) const {
  auto it = by_address_.find(a);
  if (it == by_address_.end()) return std::nullopt;
  int64_t best = 0;
  for (const RecordSet* s : it->second) best = std::max(best, s->last_served_ns.load(std::memory_order_relaxed));
  if (best == 0) return std::nullopt;
  return best;
}

std::vector<std::pair<IpAddr, int64_t>> Zone::served_addresses() const {
  std::vector<std::pair<IpAddr, int64_t>> out;
  for (const auto& [a, sets] : by_address_) {
    int64_t best = 0;
    for (const RecordSet* s : sets) best = std::max(best, s->last_served_ns.load(std::memory_order_relaxed));
    if (best) out.emplace_back(a, best);
  }
  return out;
}

}  // namespace endpointd::dns
