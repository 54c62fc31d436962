// Register-layout helpers and names for the endpointd table model.
#include "proxy/table.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace endpointd::proxy {

Element ElementMap::View::element() const {
  Element e;
  e.key = key;
  e.key_end = key_end;
  e.data = data;
  e.verdict = verdict;
  e.chain = chain;
  return e;
}

ElementMap::View ElementMap::view(const Items::value_type& item) const {
  const Value& v = item.second;
  View out;
  out.key = item.first.view();
  (v.is_key_end ? out.key_end : out.data) = v.bytes.view();
  out.verdict = v.verdict;
  out.chain = chains_[v.chain];
  return out;
}

// FNV-1a over the bytes with each field's length mixed in, then a 64-bit finalizer so that
// the sum of many is spread: stable across builds and versions (a restarted agent compares it
// with what the previous one wrote into the kernel).
uint64_t ElementMap::element_digest(std::string_view key, std::string_view key_end,
                                    std::string_view data, Verdict verdict,
                                    std::string_view chain) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto byte = [&h](uint8_t b) { h = (h ^ b) * 0x100000001b3ull; };
  for (std::string_view field : {key, key_end, data, chain}) {
    byte(static_cast<uint8_t>(field.size()));
    for (char c : field) byte(static_cast<uint8_t>(c));
  }
  byte(static_cast<uint8_t>(verdict));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

uint64_t ElementMap::digest_of(const Items::value_type& item) const {
  View v = view(item);
  return element_digest(v.key, v.key_end, v.data, v.verdict, v.chain);
}

std::optional<Element> ElementMap::get(std::string_view key) const {
  auto it = items_.find(key);
  if (it == items_.end()) return std::nullopt;
  return view(*it).element();
}

Result<std::optional<Element>> ElementMap::put(const Element& e) {
  // The planner's field helpers never make a field longer than kMaxBytes, nor an element with
  // both data and a key end, and it uses a handful of goto targets; an element that breaks
  // these is refused whole, before the map changes.
  std::string_view value = e.key_end.empty() ? std::string_view(e.data) : e.key_end;
  for (auto [what, field] : {std::pair<const char*, std::string_view>{"key", e.key},
                             {e.key_end.empty() ? "data" : "key end", value}}) {
    if (field.size() > kMaxBytes) {
      return Error{"element " + std::string(what) + " of " + std::to_string(field.size()) +
                   " bytes, longer than the " + std::to_string(kMaxBytes) + " a field can hold"};
    }
  }
  if (!e.key_end.empty() && !e.data.empty()) return Error{"element with both data and a key end"};
  auto bytes = [](std::string_view s) {
    Bytes b;
    b.size = static_cast<uint8_t>(s.size());
    std::memcpy(b.bytes, s.data(), s.size());
    return b;
  };
  Value v;
  v.is_key_end = !e.key_end.empty();
  v.bytes = bytes(value);
  v.verdict = e.verdict;
  if (!e.chain.empty()) {
    size_t i = 1;
    while (i < chains_.size() && chains_[i] != e.chain) ++i;
    if (i == chains_.size()) {
      if (i > kMaxChains) {
        return Error{"goto " + e.chain + " would be goto target " + std::to_string(i) +
                     " of one map, more than the " + std::to_string(kMaxChains) + " it can hold"};
      }
      chains_.push_back(e.chain);
    }
    v.chain = static_cast<uint8_t>(i);
  }
  auto [it, fresh] = items_.try_emplace(bytes(e.key), v);
  if (fresh) {
    digest_ += digest_of(*it);
    return std::optional<Element>();
  }
  Element old = view(*it).element();
  digest_ -= digest_of(*it);
  it->second = v;
  digest_ += digest_of(*it);
  return std::optional<Element>(std::move(old));
}

size_t Table::element_count() const {
  size_t n = 0;
  for (const auto& [_, s] : sets) n += s.elements.size();
  return n;
}

std::string addr_field(const model::IpAddr& a) {
  std::string s(a.size(), '\0');
  std::memcpy(s.data(), a.data(), a.size());
  return s;
}

std::string proto_field(uint8_t l4proto) {
  std::string s(4, '\0');
  s[0] = static_cast<char>(l4proto);
  return s;
}

std::string port_field(uint16_t port) {
  std::string s(4, '\0');
  s[0] = static_cast<char>(port >> 8);
  s[1] = static_cast<char>(port & 0xff);
  return s;
}

std::string u32_field(uint32_t v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);
  return s;
}

std::string prefix_last(const model::IpPrefix& p) {
  std::string bytes = addr_field(p.addr());
  int bits = p.length();
  for (size_t i = 0; i < bytes.size(); ++i) {
    int keep = bits - static_cast<int>(i) * 8;
    uint8_t mask = keep >= 8 ? 0xff : keep <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - keep));
    bytes[i] = static_cast<char>(static_cast<uint8_t>(bytes[i]) | static_cast<uint8_t>(~mask));
  }
  return bytes;
}

bool sized(SetShape shape) {
  switch (shape) {
    case SetShape::kAddrSet:
    case SetShape::kAddrPair:
    case SetShape::kVipSet:
    case SetShape::kVipVerdictMap:
    case SetShape::kBackends:
    case SetShape::kVipBackendSet:
      return true;
    case SetShape::kAddrInterval:
    case SetShape::kVipSrcInterval:
    case SetShape::kAffinity:
    case SetShape::kDigest:
      return false;
  }
  return false;
}

uint32_t set_size_for(size_t elements) {
  uint64_t want = std::max<uint64_t>(2 * static_cast<uint64_t>(elements), kMinSetSize);
  uint64_t size = kMinSetSize;
  while (size < want && size < (1ull << 31)) size <<= 1;
  return static_cast<uint32_t>(size);
}

std::optional<uint32_t> digest_key(std::string_view name) {
  static constexpr const char* kFixed[] = {
      names::kClusterIps,       names::kHairpin,        names::kFirewallIps, names::kFirewallAllow,
      names::kNoEndpointReject, names::kNoEndpointDrop, names::kServiceIps,  names::kServiceLb};
  for (uint32_t i = 0; i < std::size(kFixed); ++i) {
    if (name == kFixed[i]) return i + 1;
  }
  // <prefix><n>, n in canonical decimal below 2^24: (kind << 24) | n.
  static constexpr const char* kNumbered[] = {"backends-", "local-backends-", "affinity-backends-"};
  for (uint32_t kind = 0; kind < std::size(kNumbered); ++kind) {
    std::string_view prefix(kNumbered[kind]);
    if (name.substr(0, prefix.size()) != prefix) continue;
    std::string_view digits = name.substr(prefix.size());
    uint32_t n = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec != std::errc{} || end != digits.data() + digits.size() || n >= (1u << 24) ||
        std::to_string(n) != digits) {
      return std::nullopt;
    }
    return ((kind + 1) << 24) | n;
  }
  return std::nullopt;
}

std::optional<DigestEntry> digest_entry(const Set& s) {
  auto key = digest_key(s.name);
  if (!key) return std::nullopt;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, s.elements.digest());
  return DigestEntry{*key, "v1 " + s.name + " " + std::to_string(s.elements.size()) + " " + hex};
}

std::vector<DigestEntry> digest_entries(const Table& t) {
  std::vector<DigestEntry> out;
  for (const auto& [_, s] : t.sets) {
    if (auto e = digest_entry(s)) out.push_back(std::move(*e));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  return out;
}

namespace names {
std::string backends(uint32_t n) {
  return "backends-" + std::to_string(n);
}
std::string local_backends(uint32_t n) {
  return "local-backends-" + std::to_string(n);
}
std::string affinity_backends(uint32_t timeout_s) {
  return "affinity-backends-" + std::to_string(timeout_s);
}
}  // namespace names

}  // namespace endpointd::proxy
