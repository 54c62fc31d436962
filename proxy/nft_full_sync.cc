// A full sync as one batch: the tables made whole again, sending only what differs from the
// kernel's listing of them (a set element already right is neither deleted nor added again;
// a set whose digest entry is the table's own is not looked at; a set that outgrew its size is
// made anew, larger).
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "proxy/nft_builder.h"
#include "proxy/nft_encode.h"

namespace endpointd::proxy {
namespace {

using namespace encode;  // NOLINT: the builder and the message pieces

const Table* find_table(const std::vector<const Table*>& ts, IpFamily f) {
  for (const auto* t : ts) {
    if (t->family == f) return t;
  }
  return nullptr;
}

// Whether the kernel's element is the table's element: same key, key end and data or verdict.
bool same_element(const ElementMap::View& want, const KernelElement& have) {
  if (want.key_end != have.key_end) return false;
  switch (want.verdict) {
    case Verdict::kGoto:
      return have.verdict == NFT_GOTO && have.chain == want.chain;
    case Verdict::kDrop:
      return have.verdict == NF_DROP;
    case Verdict::kNone:
      break;
  }
  return !have.verdict && have.data == want.data;
}

// A plain interval set as the kernel holds it: sorted (key, is an end element) pairs, led by
// an end element at 0 when the first range does not start there (as `elements` sends them).
std::vector<std::pair<std::string, bool>> interval_form(const ElementMap& els) {
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& e : els) {
    if (out.empty() && e.key != std::string(e.key.size(), '\0'))
      out.emplace_back(std::string(e.key.size(), '\0'), true);
    out.emplace_back(std::string(e.key), false);
    std::string end(e.key_end);
    if (next_address(end)) out.emplace_back(std::move(end), true);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool same_intervals(const ElementMap& want, const std::vector<KernelElement>& have) {
  std::vector<std::pair<std::string, bool>> k;
  k.reserve(have.size());
  for (const auto& e : have) k.emplace_back(e.key, (e.flags & NFT_SET_ELEM_INTERVAL_END) != 0);
  std::sort(k.begin(), k.end());
  return k == interval_form(want);
}

// Deletes these kernel elements (by key and key end), in messages of bounded size.
void delete_elements(Builder& b, IpFamily f, const std::string& set_name,
                     const std::vector<const KernelElement*>& els) {
  element_messages(b, f, set_name, els.size(), false, "delete elements",
                   [&](nlmsghdr* nlh, uint16_t& index, size_t i, size_t end) {
                     for (size_t j = i; j < end; ++j)
                       put_element(nlh, ++index, els[j]->key, els[j]->flags, els[j]->key_end);
                   });
}

size_t full_sync_table(Builder& b, const Table& t, const KernelTable& k) {
  IpFamily f = t.family;
  std::set<std::string> kchains(k.chains.begin(), k.chains.end());
  std::set<std::string> ksets(k.sets.begin(), k.sets.end());
  add_table(b, f);
  for (const auto& [_, c] : t.chains) add_chain(b, f, c);
  // Sets: a new one is made with room for its elements; one the kernel has keeps its size
  // (NEWSET without EXCL, the same size), unless it outgrew it: that one is deleted and made
  // anew, larger, once the chains that refer to it are flushed (below).
  std::set<std::string> remade;
  for (const auto& [name, s] : t.sets) {
    auto ks = k.sizes.find(name);
    uint32_t have = ks == k.sizes.end() ? 0 : ks->second;
    if (!ksets.count(name)) {
      uint32_t size = sized(s.shape) ? set_size_for(s.elements.size()) : 0;
      add_set(b, f, s, size);
      b.sized(f, name, size);
    } else if (sized(s.shape) && outgrows(have, s.elements.size())) {
      remade.insert(name);
    } else {
      add_set(b, f, s, have);
      b.sized(f, name, have);
    }
  }
  add_set(b, f, digest_set());
  // Everything happens inside one transaction: packets see the old table until commit.
  for (const auto& name : kchains) flush_chain(b, f, name);
  for (const auto& name : remade) {
    const Set& s = t.sets.at(name);
    uint32_t size = set_size_for(s.elements.size());
    del_set(b, f, name);
    add_set(b, f, s, size);
    b.sized(f, name, size);
  }
  // Per set: its elements to delete, and its elements to add (all of them: `whole`).
  struct Plan {
    const Set* set;
    std::vector<const KernelElement*> del;
    std::vector<ElementMap::View> add;
    bool whole = false;
  };
  std::vector<Plan> plans;
  size_t changed = 0;
  for (const auto& [name, s] : t.sets) {
    if (s.shape == SetShape::kAffinity) continue;  // the packet path's records stay
    Plan p{&s, {}, {}, false};
    auto listed = k.elements.find(name);
    if (remade.count(name)) {
      p.whole = true;  // made anew: empty
    } else if (k.unchanged.count(name)) {
      continue;  // the kernel's digest of the set is this one's: it holds these elements
    } else if (!ksets.count(name)) {
      p.whole = true;  // a new set
    } else if (listed == k.elements.end()) {
      flush_set(b, f, name);  // not listed: flushed and filled again
      p.whole = true;
    } else if (s.shape == SetShape::kAddrInterval) {
      // A start and an end element per range: compared whole, replaced whole (a few ranges).
      if (!same_intervals(s.elements, listed->second)) {
        flush_set(b, f, name);
        changed += listed->second.size();
        p.whole = true;
      }
    } else {
      // Both in key order, walked side by side.
      std::vector<const KernelElement*> have;
      have.reserve(listed->second.size());
      for (const auto& e : listed->second) have.push_back(&e);
      std::sort(have.begin(), have.end(), [](auto* x, auto* y) { return x->key < y->key; });
      // A key listed twice (a dump the kernel disturbed) is looked at once.
      have.erase(
          std::unique(have.begin(), have.end(), [](auto* x, auto* y) { return x->key == y->key; }),
          have.end());
      auto h = have.begin();
      for (const auto& want : s.elements) {
        for (; h != have.end() && (*h)->key < want.key; ++h) p.del.push_back(*h);
        if (h != have.end() && (*h)->key == want.key) {
          if (!same_element(want, **h)) {
            p.del.push_back(*h);
            p.add.push_back(want);
          }
          ++h;
        } else {
          p.add.push_back(want);
        }
      }
      for (; h != have.end(); ++h) p.del.push_back(*h);
    }
    if (p.whole) {
      for (const auto& e : s.elements) p.add.push_back(e);
    }
    changed += p.del.size() + p.add.size();
    plans.push_back(std::move(p));
  }
  for (const auto& p : plans) delete_elements(b, f, p.set->name, p.del);
  for (const auto& p : plans) elements(b, f, p.set->name, p.set->shape, p.add, true);
  // Digest entries: those the kernel has and the table does not want as they are go, the
  // table's new or changed ones come.
  std::map<uint32_t, std::string> have_digests;
  for (const auto& e : k.digests) {
    if (e.key.size() != 4) continue;
    uint32_t key = 0;
    std::memcpy(&key, e.key.data(), 4);
    have_digests[key] = e.userdata;
  }
  std::vector<uint32_t> del_digests;
  std::vector<DigestEntry> add_digests;
  auto want_digests = digest_entries(t);
  std::map<uint32_t, std::string> want_udata;
  for (const auto& e : want_digests) want_udata[e.key] = comment_udata(e.comment);
  for (const auto& [key, udata] : have_digests) {
    auto w = want_udata.find(key);
    if (w == want_udata.end() || w->second != udata) del_digests.push_back(key);
  }
  for (const auto& e : want_digests) {
    auto h = have_digests.find(e.key);
    if (h == have_digests.end() || h->second != want_udata[e.key]) add_digests.push_back(e);
  }
  digest_changes(b, f, del_digests, add_digests);
  for (const auto& [_, c] : t.chains) {
    for (const auto& r : c.rules) add_rule(b, f, c.name, r);
  }
  for (const auto& name : ksets) {
    if (!t.sets.count(name) && name != names::kDigests) del_set(b, f, name);
  }
  for (const auto& name : kchains) {
    if (!t.chains.count(name)) del_chain(b, f, name);
  }
  return changed;
}

}  // namespace

Batch build_full_sync_batch(const std::vector<const Table*>& tables, const KernelTable& kernel4,
                            const KernelTable& kernel6, uint32_t seq) {
  Builder b(seq);
  size_t changed = 0;
  if (const Table* t = find_table(tables, IpFamily::kV4))
    changed += full_sync_table(b, *t, kernel4);
  if (const Table* t = find_table(tables, IpFamily::kV6))
    changed += full_sync_table(b, *t, kernel6);
  Batch out = b.finish();
  out.elements = changed;
  return out;
}

}  // namespace endpointd::proxy
