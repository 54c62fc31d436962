// DNS wire codec. Every length read from a packet is checked against the packet's end before
// use; bytes are copied out, never aliased as structs.
#include "dns/message.h"

#include <algorithm>
#include <cstring>

#include <arpa/inet.h>

namespace endpointd::dns {
namespace {

uint8_t lower(uint8_t c) {
  return static_cast<uint8_t>(c | (static_cast<unsigned>(c - 'A') < 26u ? 0x20 : 0));
}

// read_name's walk over a (possibly compressed) name. Copies it to `out` and, lower-cased, to
// `out_lower` where they are not null; sets `*len` to its uncompressed length.
bool walk_name(std::span<const uint8_t> pkt, size_t* pos, uint8_t* out, uint8_t* out_lower,
               size_t* len) {
  size_t p = *pos;
  size_t out_len = 0;
  size_t end_after = 0;  // where the name ends in its original place
  bool jumped = false;
  int jumps = 0;
  size_t lowest = p;  // pointers must go strictly below every place we have read from
  const uint8_t* d = pkt.data();
  while (true) {
    if (p >= pkt.size()) return false;
    uint8_t l = d[p];
    if ((l & 0xC0) == 0xC0) {
      if (p + 1 >= pkt.size()) return false;
      size_t target = (static_cast<size_t>(l & 0x3F) << 8) | d[p + 1];
      if (!jumped) end_after = p + 2;
      if (target >= lowest) return false;  // loops and forward pointers
      if (++jumps > 127) return false;
      jumped = true;
      lowest = target;
      p = target;
      continue;
    }
    if ((l & 0xC0) != 0) return false;  // 0x40 / 0x80: extended and reserved label types
    if (l == 0) {
      if (out_len + 1 > kMaxNameWire) return false;
      if (out) out[out_len] = 0;
      if (out_lower) out_lower[out_len] = 0;
      ++out_len;
      if (!jumped) end_after = p + 1;
      break;
    }
    if (p + 1 + l > pkt.size()) return false;
    if (out_len + 1 + l + 1 > kMaxNameWire) return false;
    if (out) {
      out[out_len] = l;
      std::memcpy(out + out_len + 1, d + p + 1, l);
    }
    if (out_lower) {
      out_lower[out_len] = l;
      for (size_t k = 1; k <= l; ++k) out_lower[out_len + k] = lower(d[p + k]);
    }
    out_len += 1 + l;
    p += 1 + l;
  }
  *len = out_len;
  *pos = end_after;
  return true;
}

}  // namespace

std::optional<WireName> name_from_text(std::string_view text) {
  WireName n;
  if (text == "." || text.empty()) {
    n.bytes[0] = 0;
    n.len = 1;
    return n;
  }
  if (text.back() == '.') text.remove_suffix(1);
  size_t pos = 0;
  while (true) {
    size_t dot = text.find('.');
    std::string_view label = text.substr(0, dot);
    if (label.empty() || label.size() > kMaxLabel) return std::nullopt;
    if (pos + 1 + label.size() + 1 > kMaxNameWire) return std::nullopt;
    n.bytes[pos++] = static_cast<uint8_t>(label.size());
    std::memcpy(n.bytes.data() + pos, label.data(), label.size());
    pos += label.size();
    if (dot == std::string_view::npos) break;
    text.remove_prefix(dot + 1);
  }
  n.bytes[pos++] = 0;
  n.len = static_cast<uint8_t>(pos);
  return n;
}

std::string name_to_text(std::span<const uint8_t> wire) {
  std::string out;
  size_t i = 0;
  while (i < wire.size() && wire[i] != 0) {
    size_t l = wire[i];
    if (i + 1 + l > wire.size()) break;
    for (size_t k = 0; k < l; ++k) {
      char c = static_cast<char>(wire[i + 1 + k]);
      if (c == '.' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    out.push_back('.');
    i += 1 + l;
  }
  if (out.empty()) out = ".";
  return out;
}

void lowercase_name(std::span<uint8_t> wire) {
  size_t i = 0;
  while (i < wire.size() && wire[i] != 0) {
    size_t l = wire[i];
    for (size_t k = 1; k <= l && i + k < wire.size(); ++k) wire[i + k] = lower(wire[i + k]);
    i += 1 + l;
  }
}

bool read_name(std::span<const uint8_t> pkt, size_t* pos, WireName* out) {
  size_t len = 0;
  if (!walk_name(pkt, pos, out->bytes.data(), nullptr, &len)) return false;
  out->len = static_cast<uint8_t>(len);
  return true;
}

uint16_t Query::udp_limit() const {
  if (!edns) return kMinUdpSize;
  return std::clamp<uint16_t>(edns_udp_size, kMinUdpSize, kMaxUdpSize);
}

Query parse_query(std::span<const uint8_t> pkt) {
  Query q;
  parse_query(pkt, &q);
  return q;
}

void parse_query(std::span<const uint8_t> pkt, Query* out) {
  Query& q = *out;
  q.status = ParseStatus::kDrop;
  q.id = q.flags = q.qtype = q.qclass = 0;
  q.qname.len = q.qname_lower.len = 0;
  q.edns = false;
  q.edns_udp_size = 0;
  q.edns_version = 0;
  q.edns_do = false;
  if (pkt.size() < kHeaderSize) return;  // kDrop
  const uint8_t* h = pkt.data();
  q.id = load_u16(h);
  q.flags = load_u16(h + 2);
  if (q.flags & flag::kQR) return;  // a response: answering it would make a reflection loop
  uint16_t qd = load_u16(h + 4), an = load_u16(h + 6), ns = load_u16(h + 8), ar = load_u16(h + 10);
  if (q.opcode() != 0) {
    q.status = ParseStatus::kNotImp;
    return;
  }
  q.status = ParseStatus::kFormErr;
  if (qd != 1) return;
  size_t pos = kHeaderSize;
  size_t len = 0;
  // The name as received (echoed in the reply) and lower-cased (looked up), in one pass.
  if (!walk_name(pkt, &pos, q.qname.bytes.data(), q.qname_lower.bytes.data(), &len)) return;
  q.qname.len = q.qname_lower.len = static_cast<uint8_t>(len);
  if (pos + 4 > pkt.size()) return;
  q.qtype = load_u16(h + pos);
  q.qclass = load_u16(h + pos + 2);
  pos += 4;
  if (q.qtype == type::kOPT) return;
  // Skip answer and authority records (a query should have none); look for OPT in additional.
  uint32_t total = uint32_t{an} + ns + ar;
  for (uint32_t i = 0; i < total; ++i) {
    size_t owner_len = 0;
    if (!walk_name(pkt, &pos, nullptr, nullptr, &owner_len)) return;
    if (pos + 10 > pkt.size()) return;
    uint16_t t = load_u16(h + pos);
    uint16_t cls = load_u16(h + pos + 2);
    uint32_t ttl = load_u32(h + pos + 4);
    uint16_t rdlen = load_u16(h + pos + 8);
    pos += 10;
    if (pos + rdlen > pkt.size()) return;
    if (t == type::kOPT) {
      if (i < uint32_t{an} + ns) return;  // OPT only in additional
      if (q.edns) return;                 // more than one OPT
      if (owner_len != 1) return;         // owner must be the root
      q.edns = true;
      q.edns_udp_size = cls;
      q.edns_version = static_cast<uint8_t>(ttl >> 16);
      q.edns_do = (ttl & 0x8000) != 0;
      // Options are not interpreted, but must be well formed.
      size_t o = pos, oend = pos + rdlen;
      while (o < oend) {
        if (o + 4 > oend) return;
        uint16_t olen = load_u16(h + o + 2);
        if (o + 4 + olen > oend) return;
        o += 4 + olen;
      }
    }
    pos += rdlen;
  }
  // Trailing garbage after the last record is tolerated, as most servers do.
  q.status = (q.edns && q.edns_version > 0) ? ParseStatus::kBadVers : ParseStatus::kOk;
}

bool Writer::fits(size_t n) {
  if (!ok_ || pos_ + n > cap_) {
    ok_ = false;
    return false;
  }
  return true;
}

void Writer::header(uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns,
                    uint16_t ar) {
  u16(id);
  u16(flags);
  u16(qd);
  u16(an);
  u16(ns);
  u16(ar);
}

void Writer::u8(uint8_t v) {
  if (fits(1)) buf_[pos_++] = v;
}
void Writer::u16(uint16_t v) {
  if (!fits(2)) return;
  store_u16(buf_ + pos_, v);
  pos_ += 2;
}
void Writer::u32(uint32_t v) {
  if (!fits(4)) return;
  store_u32(buf_ + pos_, v);
  pos_ += 4;
}
void Writer::bytes(std::span<const uint8_t> b) {
  if (!fits(b.size())) return;
  if (!b.empty()) std::memcpy(buf_ + pos_, b.data(), b.size());
  pos_ += b.size();
}
void Writer::patch_u16(size_t at, uint16_t v) {
  if (at + 2 <= pos_) store_u16(buf_ + at, v);
}

// Does the name stored at `at` in our buffer (possibly compressed) equal wire[from..]?
bool Writer::equal_suffix(size_t at, std::span<const uint8_t> wire, size_t from) const {
  size_t p = at, w = from;
  int jumps = 0;
  while (true) {
    if (p >= pos_) return false;
    uint8_t l = buf_[p];
    if ((l & 0xC0) == 0xC0) {
      if (p + 1 >= pos_ || ++jumps > 127) return false;
      p = (static_cast<size_t>(l & 0x3F) << 8) | buf_[p + 1];
      continue;
    }
    if (w >= wire.size() || wire[w] != l) return false;
    if (l == 0) return true;
    if (p + 1 + l > pos_ || w + 1 + l > wire.size()) return false;
    for (size_t k = 1; k <= l; ++k)
      if (lower(buf_[p + k]) != lower(wire[w + k])) return false;
    p += 1 + l;
    w += 1 + l;
  }
}

void Writer::remember(size_t at, std::span<const uint8_t> wire) {
  // Every label boundary of the name just written is a candidate target.
  size_t w = 0;
  while (w < wire.size() && wire[w] != 0 && n_names_ < kTable) {
    if (at + w < 0x3FFF) names_[n_names_++] = static_cast<uint16_t>(at + w);
    w += 1 + wire[w];
  }
}

void Writer::name(std::span<const uint8_t> wire, bool compress) {
  if (!ok_) return;
  size_t start = pos_;
  size_t w = 0;
  while (w < wire.size() && wire[w] != 0) {
    if (compress) {
      for (size_t i = 0; i < n_names_; ++i) {
        if (equal_suffix(names_[i], wire, w)) {
          bytes(wire.subspan(0, w));
          u16(static_cast<uint16_t>(0xC000 | names_[i]));
          if (ok_) remember(start, wire.subspan(0, w));
          return;
        }
      }
    }
    w += 1 + wire[w];
  }
  bytes(wire);
  if (ok_) remember(start, wire);  // even uncompressed, it can be a later pointer's target
}

size_t Writer::begin_rr(std::span<const uint8_t> owner, uint16_t type, uint16_t cls, uint32_t ttl) {
  name(owner);
  u16(type);
  u16(cls);
  u32(ttl);
  size_t at = pos_;
  u16(0);
  return at;
}

void Writer::end_rr(size_t rdlength_at) {
  if (!ok_) return;
  patch_u16(rdlength_at, static_cast<uint16_t>(pos_ - rdlength_at - 2));
}

void Writer::opt(uint16_t udp_size, uint8_t ext_rcode, uint8_t version, bool do_bit) {
  u8(0);
  u16(type::kOPT);
  u16(udp_size);
  u32((uint32_t{ext_rcode} << 24) | (uint32_t{version} << 16) | (do_bit ? 0x8000u : 0u));
  u16(0);
}

size_t write_header_only(std::span<const uint8_t> query, Rcode rc, uint8_t* out, size_t cap) {
  if (query.size() < kHeaderSize || cap < kHeaderSize) return 0;
  uint16_t qflags = load_u16(query.data() + 2);
  uint16_t flags =
      flag::kQR | (qflags & (0x7800 | flag::kRD | flag::kCD)) | static_cast<uint16_t>(rc);
  Writer w(out, cap);
  w.header(load_u16(query.data()), flags, 0, 0, 0, 0);
  return w.ok() ? w.size() : 0;
}

size_t write_query(uint16_t id, std::span<const uint8_t> qname, uint16_t qtype, bool rd,
                   uint16_t edns_size, uint8_t* out, size_t cap) {
  Writer w(out, cap);
  w.header(id, rd ? flag::kRD : 0, 1, 0, 0, edns_size ? 1 : 0);
  w.name(qname, false);
  w.u16(qtype);
  w.u16(kClassIN);
  if (edns_size) w.opt(edns_size, 0, 0, false);
  return w.ok() ? w.size() : 0;
}

namespace {

bool parse_rr(std::span<const uint8_t> pkt, size_t* pos, Record* r, bool* is_opt, Message* m) {
  WireName owner;
  if (!read_name(pkt, pos, &owner)) return false;
  size_t p = *pos;
  if (p + 10 > pkt.size()) return false;
  const uint8_t* d = pkt.data();
  r->name = name_to_text(owner.span());
  r->type = load_u16(d + p);
  r->cls = load_u16(d + p + 2);
  r->ttl_offset = p + 4;
  r->ttl = load_u32(d + p + 4);
  uint16_t rdlen = load_u16(d + p + 8);
  p += 10;
  if (p + rdlen > pkt.size()) return false;
  r->rdata_offset = p;
  r->rdata.assign(d + p, d + p + rdlen);
  *is_opt = r->type == type::kOPT;
  if (*is_opt) {
    m->edns = true;
    m->edns_udp_size = r->cls;
    m->rcode = static_cast<uint16_t>(m->rcode | ((r->ttl >> 24) << 4));
  }
  char buf[INET6_ADDRSTRLEN] = {};
  size_t np = p;
  WireName target;
  switch (r->type) {
    case type::kA:
      if (rdlen == 4 && inet_ntop(AF_INET, d + p, buf, sizeof buf)) r->text = buf;
      break;
    case type::kAAAA:
      if (rdlen == 16 && inet_ntop(AF_INET6, d + p, buf, sizeof buf)) r->text = buf;
      break;
    case type::kCNAME:
    case type::kPTR:
    case type::kNS:
      if (read_name(pkt, &np, &target)) r->text = name_to_text(target.span());
      break;
    case type::kSRV:
      if (rdlen >= 7) {
        r->srv_priority = load_u16(d + p);
        r->srv_weight = load_u16(d + p + 2);
        r->srv_port = load_u16(d + p + 4);
        np = p + 6;
        if (read_name(pkt, &np, &target)) r->text = name_to_text(target.span());
      }
      break;
    case type::kSOA:
      if (read_name(pkt, &np, &target)) r->text = name_to_text(target.span());
      break;
    case type::kTXT:
      for (size_t i = p; i < p + rdlen;) {
        size_t l = d[i];
        if (i + 1 + l > p + rdlen) break;
        for (size_t k = 0; k < l; ++k) r->text.push_back(static_cast<char>(d[i + 1 + k]));
        i += 1 + l;
      }
      break;
    default:
      break;
  }
  *pos = p + rdlen;
  return true;
}

}  // namespace

std::optional<Message> parse_message(std::span<const uint8_t> pkt) {
  if (pkt.size() < kHeaderSize) return std::nullopt;
  Message m;
  const uint8_t* d = pkt.data();
  m.id = load_u16(d);
  m.flags = load_u16(d + 2);
  m.rcode = m.flags & 0xF;
  uint16_t qd = load_u16(d + 4), an = load_u16(d + 6), ns = load_u16(d + 8), ar = load_u16(d + 10);
  size_t pos = kHeaderSize;
  for (uint16_t i = 0; i < qd; ++i) {
    WireName n;
    if (!read_name(pkt, &pos, &n) || pos + 4 > pkt.size()) return std::nullopt;
    if (i == 0) {
      m.qname = name_to_text(n.span());
      m.qtype = load_u16(d + pos);
      m.qclass = load_u16(d + pos + 2);
    }
    pos += 4;
  }
  auto section = [&](uint16_t count, std::vector<Record>* out) {
    for (uint16_t i = 0; i < count; ++i) {
      Record r;
      bool is_opt = false;
      if (!parse_rr(pkt, &pos, &r, &is_opt, &m)) return false;
      if (!is_opt) out->push_back(std::move(r));
    }
    return true;
  };
  if (!section(an, &m.answer) || !section(ns, &m.authority) || !section(ar, &m.additional))
    return std::nullopt;
  return m;
}

std::string_view type_name(uint16_t t) {
  switch (t) {
    case type::kA:
      return "A";
    case type::kNS:
      return "NS";
    case type::kCNAME:
      return "CNAME";
    case type::kSOA:
      return "SOA";
    case type::kPTR:
      return "PTR";
    case type::kTXT:
      return "TXT";
    case type::kAAAA:
      return "AAAA";
    case type::kSRV:
      return "SRV";
    case type::kANY:
      return "ANY";
    case type::kAXFR:
      return "AXFR";
    case type::kIXFR:
      return "IXFR";
    default:
      return "other";
  }
}

}  // namespace endpointd::dns
