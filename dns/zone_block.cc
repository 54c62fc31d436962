// BlockWriter::finish: one block's records sorted into names and sets, each set encoded once
// as the bytes that follow the question.
#include "dns/zone_block.h"

#include <algorithm>
#include <numeric>

namespace endpointd::dns {

BlockPtr BlockWriter::finish() {
  order_.resize(recs_.size());
  std::iota(order_.begin(), order_.end(), 0u);
  std::sort(order_.begin(), order_.end(), [&](uint32_t x, uint32_t y) {
    const Rec& a = recs_[x];
    const Rec& b = recs_[y];
    if (a.set_owner != b.set_owner) {
      int c = names_[a.set_owner].view().compare(names_[b.set_owner].view());
      if (c != 0) return c < 0;
    }
    if (a.set_type != b.set_type) return a.set_type < b.set_type;
    return x < y;
  });
  // Runs of one owner name are nodes; runs of one type inside them are sets.
  nodes_.clear();
  sets_.clear();
  node_of_.assign(names_.size(), kNone);
  for (size_t k = 0; k < order_.size(); ++k) {
    const Rec& r = recs_[order_[k]];
    bool new_node =
        nodes_.empty() || names_[nodes_.back().name].view() != names_[r.set_owner].view();
    if (new_node) nodes_.push_back({r.set_owner, static_cast<uint32_t>(sets_.size()), 0, false});
    NodeSpec& n = nodes_.back();
    node_of_[r.set_owner] = static_cast<uint32_t>(nodes_.size() - 1);
    n.cname = n.cname || cname_[r.set_owner];
    if (chase_[r.set_owner] != kNone) n.chase = chase_[r.set_owner];
    if (r.section == kExists) continue;
    if (sets_.size() == n.set_begin || sets_.back().type != r.set_type)
      sets_.push_back({static_cast<uint32_t>(k), static_cast<uint32_t>(k), r.set_type});
    sets_.back().end = static_cast<uint32_t>(k + 1);
  }
  for (auto& n : nodes_) n.set_end = static_cast<uint32_t>(sets_.size());
  for (size_t i = 0; i + 1 < nodes_.size(); ++i) nodes_[i].set_end = nodes_[i + 1].set_begin;

  auto block = std::make_shared<NameBlock>();
  NameBlock& b = *block;
  b.set_count_ = sets_.size();
  b.sets_.reset(new RecordSet[sets_.size()]);
  b.typed_.resize(sets_.size());
  b.nodes_.resize(nodes_.size());
  spans_.resize(sets_.size());
  for (size_t i = 0; i < sets_.size(); ++i) encode(b, i);
  std::vector<uint32_t> name_at(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const WireName& n = names_[nodes_[i].name];
    name_at[i] = static_cast<uint32_t>(b.bytes_.size());
    b.bytes_.insert(b.bytes_.end(), n.bytes.begin(), n.bytes.begin() + n.len);
    if (nodes_[i].chase != kNone) {  // right after the name: ZoneNode::chase_target()
      const WireName& t = names_[nodes_[i].chase];
      b.bytes_.insert(b.bytes_.end(), t.bytes.begin(), t.bytes.begin() + t.len);
    }
  }
  // Every byte is in place: now the spans.
  for (size_t i = 0; i < sets_.size(); ++i) {
    RecordSet& s = b.sets_[i];
    s.body = {b.bytes_.data() + spans_[i].body_at, spans_[i].body_len};
    s.addresses = {b.addresses_.data() + spans_[i].addr_at, spans_[i].addr_len};
    b.typed_[i] = {sets_[i].type, &s};
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    ZoneNode& z = b.nodes_[i];
    z.name = {reinterpret_cast<const char*>(b.bytes_.data() + name_at[i]),  // our bytes
              names_[nodes_[i].name].len};
    z.sets = {b.typed_.data() + nodes_[i].set_begin, nodes_[i].set_end - nodes_[i].set_begin};
    z.cname = nodes_[i].cname;
    if (nodes_[i].chase != kNone) z.chase_len = names_[nodes_[i].chase].len;
    z.soa_suffix = soa_suffix_;
  }
  last_ = block;
  return block;
}

void BlockWriter::write_rr(Writer& w, const Rec& r) {
  size_t at = w.begin_rr(names_[r.owner].span(), r.type, kClassIN, ttl_);
  if (r.target != kNone && r.target_first) {
    w.name(names_[r.target].span(), r.compress);
    if (r.target2 != kNone) w.name(names_[r.target2].span(), r.compress);
    w.bytes({r.rdata.data(), r.rdlen});
  } else {
    w.bytes({r.rdata.data(), r.rdlen});
    if (r.target != kNone) w.name(names_[r.target].span(), r.compress);
  }
  w.end_rr(at);
}

void BlockWriter::encode(NameBlock& b, size_t i) {
  const SetSpec& s = sets_[i];
  answer_.clear();
  additional_.clear();
  SetSpans& sp = spans_[i];
  sp.addr_at = b.addresses_.size();
  for (uint32_t k = s.begin; k < s.end; ++k) {
    const Rec& r = recs_[order_[k]];
    (r.section == kAnswer ? answer_ : additional_).push_back(&r);
    if (r.has_address) b.addresses_.push_back(r.address);
  }
  sp.addr_len = b.addresses_.size() - sp.addr_at;
  const WireName& owner = names_[recs_[order_[s.begin]].set_owner];
  // A very large set may not fit one message: keep what fits.
  size_t keep_an = answer_.size(), keep_ar = additional_.size();
  RecordSet& rs = b.sets_[i];
  while (true) {
    Writer w(scratch_.data(), scratch_.size());
    w.header(0, 0, 1, 0, 0, 0);
    w.name(owner.span());
    w.u16(s.type);
    w.u16(kClassIN);
    size_t start = w.size();
    // Rotatable: A or AAAA records only, all of one size.
    bool same_size = (s.type == type::kA || s.type == type::kAAAA) && keep_an > 1 && keep_ar == 0;
    size_t rr_size = 0;
    for (size_t k = 0; k < keep_an; ++k) {
      size_t before = w.size();
      write_rr(w, *answer_[k]);
      same_size =
          same_size && answer_[k]->type == s.type && (k == 0 || w.size() - before == rr_size);
      rr_size = w.size() - before;
    }
    size_t answer_end = w.size();
    for (size_t k = 0; k < keep_ar; ++k) write_rr(w, *additional_[k]);
    if (w.ok()) {
      sp.body_at = b.bytes_.size();
      sp.body_len = w.size() - start;
      b.bytes_.insert(b.bytes_.end(), scratch_.begin() + static_cast<ptrdiff_t>(start),
                      scratch_.begin() + static_cast<ptrdiff_t>(w.size()));
      rs.answer_bytes = static_cast<uint32_t>(answer_end - start);
      rs.ancount = static_cast<uint16_t>(keep_an);
      rs.arcount = static_cast<uint16_t>(keep_ar);
      rs.rotate_rr = same_size ? static_cast<uint16_t>(rr_size) : 0;
      return;
    }
    if (keep_an <= 1 && keep_ar == 0) {  // cannot happen with names of at most 255 bytes
      sp.body_at = b.bytes_.size();
      sp.body_len = 0;
      return;
    }
    keep_an = std::max<size_t>(1, keep_an / 2);
    keep_ar /= 2;
  }
}

}  // namespace endpointd::dns
