// Answers a lookup against a built zone: the name's node in the index, or NODATA, NXDOMAIN,
// not ours, not synced, or (insecure pod mode) an address read from the name itself; and the
// record of the replies that carried pod addresses. The serving hot path: no allocation.
#include "dns/zone.h"

#include <algorithm>
#include <cstring>

#include <arpa/inet.h>

namespace endpointd::dns {

using model::IpAddr;

uint64_t name_hash(std::string_view wire) {
  return std::hash<std::string_view>{}(wire);
}

namespace {

uint64_t address_hash(const IpAddr& a) {
  uint64_t h = 0xcbf29ce484222325ull ^ a.size();
  for (size_t i = 0; i < a.size(); ++i) h = (h ^ a.data()[i]) * 0x100000001b3ull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

}  // namespace

void AnswerLog::stamp(const IpAddr& a, int64_t now_ns) const {
  uint64_t h = address_hash(a);
  for (size_t s : {h & (kSlots - 1), (h >> 32) & (kSlots - 1)}) {
    // Written only when it moves forward, so that workers rarely share the cache line.
    if (slots_[s].load(std::memory_order_relaxed) < now_ns)
      slots_[s].store(now_ns, std::memory_order_relaxed);
  }
}

int64_t AnswerLog::last(const IpAddr& a) const {
  uint64_t h = address_hash(a);
  return std::min(slots_[h & (kSlots - 1)].load(std::memory_order_relaxed),
                  slots_[(h >> 32) & (kSlots - 1)].load(std::memory_order_relaxed));
}

namespace {

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

bool name_under(const WireName& name, const WireName& apex) {
  return label_at_boundary_suffix(name, apex, nullptr);
}

std::vector<std::string> Zone::names() const {
  std::vector<std::string> out;
  for (const auto& s : shards_)
    if (s)
      for (const auto& e : s->slots)
        if (e.node)
          out.push_back(
              name_to_text({reinterpret_cast<const uint8_t*>(e.node->name.data()),  // our bytes
                            e.node->name.size()}));
  std::sort(out.begin(), out.end());
  return out;
}

bool Zone::in_zone(const WireName& q) const {
  return label_at_boundary_suffix(q, apex_, nullptr);
}

void Zone::prefetch(uint64_t h, int stage) const {
  const Shard* s = shards_[h & (kShards - 1)].get();
  if (!s) return;
  if (stage == 0) {
    __builtin_prefetch(s);
    return;
  }
  size_t mask = s->slots.size() - 1;
  const Entry& e = s->slots[(h >> kShardBits) & mask];
  if (stage == 1) {
    __builtin_prefetch(&e);
    return;
  }
  if (!e.node || e.hash != h) return;
  if (stage == 2) {
    __builtin_prefetch(e.node.get());
    return;
  }
  __builtin_prefetch(e.node->name.data());
  __builtin_prefetch(e.node->sets.data());
}

const ZoneNode* Zone::find(std::string_view name) const {
  return find_hashed(name, name_hash(name));
}

const ZoneNode* Zone::find_hashed(std::string_view name, uint64_t h) const {
  const Shard* s = shards_[h & (kShards - 1)].get();
  if (!s) return nullptr;
  size_t mask = s->slots.size() - 1;
  for (size_t i = (h >> kShardBits) & mask;; i = (i + 1) & mask) {
    const Entry& e = s->slots[i];
    if (!e.node) return nullptr;
    if (e.hash == h && e.node->name == name) return e.node.get();
  }
}

Zone::Lookup Zone::lookup(const WireName& q, uint16_t qtype) const {
  return lookup(q, qtype, name_hash(q.view()));
}

Zone::Lookup Zone::lookup(const WireName& q, uint16_t qtype, uint64_t h) const {
  Lookup r;
  if (const ZoneNode* n = find_hashed(q.view(), h)) {
    r.soa = n->soa_suffix != 0 && n->soa_suffix <= q.len;
    r.soa_at = static_cast<uint8_t>(r.soa ? q.len - n->soa_suffix : 0);
    if (n->cname && !n->sets.empty()) {
      // The set of the type asked (a CNAME and the in-zone target's records), else the CNAME.
      r.kind = Kind::kAnswer;
      for (const auto& [t, s] : n->sets)
        if (t == qtype || (t == type::kCNAME && !r.set)) r.set = s;
      if (!r.set) r.set = n->sets.front().set;
      if (n->chase_len && (qtype == type::kA || qtype == type::kAAAA)) r.chase = n->chase_target();
      return r;
    }
    for (const auto& [t, s] : n->sets) {
      if (t == qtype || qtype == type::kANY) {  // ANY: one RRset is enough (RFC 8482)
        r.kind = Kind::kAnswer;
        r.set = s;
        return r;
      }
    }
    r.kind = Kind::kNoData;
    return r;
  }
  if (!in_zone(q)) {
    for (const auto& z : also_)
      if (z->in_zone(q)) {
        Lookup l = z->lookup(q, qtype, h);
        if (!l.zone) l.zone = z.get();
        return l;
      }
    return r;  // kNotOurs
  }
  if (!synced_) {
    r.kind = Kind::kNotSynced;
    return r;
  }
  r.kind = Kind::kNxDomain;
  r.soa_at = static_cast<uint8_t>(q.len - apex_.len);
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
    if (!opts_.namespaces.empty() &&
        !opts_.exposes({reinterpret_cast<const char*>(q.bytes.data()) + 2 + l1, l2}))  // ours
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

}  // namespace endpointd::dns
