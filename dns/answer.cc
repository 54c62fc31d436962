// The hot path: parse result + zone lookup -> a reply in the caller's buffer.
#include "dns/answer.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

namespace endpointd::dns {
namespace {

constexpr size_t kOptSize = 11;

uint16_t reply_flags(const Query& q, bool aa, uint16_t rcode) {
  return static_cast<uint16_t>(flag::kQR | (aa ? flag::kAA : 0) | flag::kRA |
                               (q.flags & (flag::kRD | flag::kCD)) | (rcode & 0xF));
}

void question(Writer& w, const Query& q) {
  w.name(q.qname.span(), false);
  w.u16(q.qtype);
  w.u16(q.qclass);
}

void stamp(const RecordSet* s, int64_t now_ns) {
  // Written only when it moves forward, so that workers rarely share the cache line.
  if (s->last_served_ns.load(std::memory_order_relaxed) < now_ns)
    s->last_served_ns.store(now_ns, std::memory_order_relaxed);
}

}  // namespace

Reply error_reply(std::span<const uint8_t> pkt, const Query& q, uint16_t rcode, uint8_t* out,
                  size_t cap) {
  Reply r;
  r.action = Reply::Action::kSend;
  r.rcode = rcode;
  size_t need = kHeaderSize + q.qname.len + 4 + (q.edns ? kOptSize : 0);
  if (need <= pkt.size() && need <= cap) {
    Writer w(out, cap);
    w.header(q.id, reply_flags(q, false, rcode), 1, 0, 0, q.edns ? 1 : 0);
    question(w, q);
    if (q.edns) w.opt(kOurUdpSize, static_cast<uint8_t>(rcode >> 4), 0, false);
    if (w.ok()) {
      r.size = w.size();
      return r;
    }
  }
  r.size = write_header_only(pkt, static_cast<Rcode>(rcode & 0xF), out, cap);
  if (r.size == 0) r.action = Reply::Action::kDrop;
  return r;
}

Reply answer(const Zone& zone, std::span<const uint8_t> pkt, const Query& q, uint8_t* out,
             size_t cap, size_t limit, int64_t now_ns) {
  Reply r;
  switch (q.status) {
    case ParseStatus::kDrop:
      return r;
    case ParseStatus::kFormErr:
    case ParseStatus::kNotImp:
      r.rcode = static_cast<uint16_t>(q.status == ParseStatus::kFormErr ? Rcode::kFormErr
                                                                        : Rcode::kNotImp);
      r.size = write_header_only(pkt, static_cast<Rcode>(r.rcode), out, cap);
      r.action = r.size ? Reply::Action::kSend : Reply::Action::kDrop;
      return r;
    case ParseStatus::kBadVers:
      return error_reply(pkt, q, kRcodeBadVers, out, cap);
    case ParseStatus::kOk:
      break;
  }
  if (!wants_lookup(q))  // another class, or a zone transfer
    return error_reply(pkt, q, static_cast<uint16_t>(Rcode::kRefused), out, cap);
  return answer_lookup(zone, zone.lookup(q.qname_lower, q.qtype), pkt, q, out, cap, limit, now_ns);
}

bool wants_lookup(const Query& q) {
  return q.status == ParseStatus::kOk && (q.qclass == kClassIN || q.qclass == kClassANY) &&
         q.qtype != type::kAXFR && q.qtype != type::kIXFR;
}

void prefetch_answer(const Zone::Lookup& lk) {
  if (lk.kind != Zone::Kind::kAnswer) return;
  __builtin_prefetch(lk.set);
  __builtin_prefetch(lk.set->body.data());
}

Reply answer_lookup(const Zone& asked, const Zone::Lookup& lk_in, std::span<const uint8_t> pkt,
                    const Query& q, uint8_t* out, size_t cap, size_t limit, int64_t now_ns) {
  Reply r;
  Zone::Lookup lk = lk_in;
  const Zone& zone = lk.zone ? *lk.zone : asked;  // an additional zone's own SOA and TTL
  if (lk.kind == Zone::Kind::kNotOurs) {
    r.action = Reply::Action::kForward;
    return r;
  }
  if (lk.kind == Zone::Kind::kNotSynced)
    return error_reply(pkt, q, static_cast<uint16_t>(Rcode::kServFail), out, cap);

  limit = std::min(limit, cap);
  const size_t head = kHeaderSize + q.qname.len + 4;
  const size_t opt = q.edns ? kOptSize : 0;
  r.action = Reply::Action::kSend;
  Writer w(out, cap);

  if (lk.kind == Zone::Kind::kAnswer) {
    const RecordSet& s = *lk.set;
    size_t body = s.body.size();
    uint16_t ar = s.arcount;
    if (head + body + opt > limit) {
      body = s.answer_bytes;  // drop the additional section first: no TC needed for it
      ar = 0;
    }
    if (head + body + opt > limit) {
      r.truncated = true;
      w.header(q.id, static_cast<uint16_t>(reply_flags(q, true, 0) | flag::kTC), 1, 0, 0,
               q.edns ? 1 : 0);
      question(w, q);
    } else {
      w.header(q.id, reply_flags(q, true, 0), 1, s.ancount, s.nscount,
               static_cast<uint16_t>(ar + (q.edns ? 1 : 0)));
      question(w, q);
      if (s.rotate_rr && zone.loadbalance() && body == s.answer_bytes) {
        // loadbalance: the records from the k-th on, then the first k (each worker in turn).
        thread_local uint32_t turn = 0;
        size_t at = (turn++ % s.ancount) * size_t{s.rotate_rr};
        w.bytes({s.body.data() + at, body - at});
        w.bytes({s.body.data(), at});
      } else {
        w.bytes({s.body.data(), body});
      }
      stamp(&s, now_ns);
      r.chase = lk.chase;
    }
  } else if (lk.kind == Zone::Kind::kPodAddress) {
    w.header(q.id, reply_flags(q, true, 0), 1, 1, 0, q.edns ? 1 : 0);
    question(w, q);
    w.u16(0xC000 | kHeaderSize);
    w.u16(lk.pod_address.is_v4() ? type::kA : type::kAAAA);
    w.u16(kClassIN);
    w.u32(zone.ttl());
    w.u16(static_cast<uint16_t>(lk.pod_address.size()));
    w.bytes({lk.pod_address.data(), lk.pod_address.size()});
    if ((lk.pod_address.is_v4() ? type::kA : type::kAAAA) != q.qtype && q.qtype != type::kANY) {
      // The name exists, the type does not: NODATA.
      w = Writer(out, cap);
      lk.kind = Zone::Kind::kNoData;
    } else if (const AnswerLog* log = zone.pod_answers()) {
      log->stamp(lk.pod_address, now_ns);  // drain support: this reply carried the address
    }
  }
  if (lk.kind == Zone::Kind::kNoData || lk.kind == Zone::Kind::kNxDomain) {
    uint16_t rcode = static_cast<uint16_t>(lk.kind == Zone::Kind::kNxDomain ? Rcode::kNxDomain
                                                                            : Rcode::kNoError);
    r.rcode = rcode;
    bool soa = lk.soa;
    size_t soa_size = soa ? 2 + zone.soa_tail().size() : 0;
    if (head + soa_size + opt > limit) soa = false;
    w.header(q.id, reply_flags(q, true, rcode), 1, 0, soa ? 1 : 0, q.edns ? 1 : 0);
    question(w, q);
    if (soa) {
      // Owner: a pointer to the apex inside the question name.
      w.u16(static_cast<uint16_t>(0xC000 | (kHeaderSize + lk.soa_at)));
      w.bytes(zone.soa_tail());
    }
  }
  if (q.edns) w.opt(kOurUdpSize, 0, 0, false);
  if (!w.ok()) {
    r.action = Reply::Action::kDrop;
    return r;
  }
  r.size = w.size();
  return r;
}

Query chase_query(const Query& q, std::string_view target) {
  Query t;
  t.status = ParseStatus::kOk;
  t.id = q.id;
  t.flags = flag::kRD;
  t.qname.len = static_cast<uint8_t>(std::min(target.size(), kMaxNameWire));
  std::memcpy(t.qname.bytes.data(), target.data(), t.qname.len);
  t.qname_lower = t.qname;
  lowercase_name({t.qname_lower.bytes.data(), t.qname_lower.len});
  t.qtype = q.qtype;
  t.qclass = kClassIN;
  t.edns = q.edns;
  t.edns_udp_size = q.edns_udp_size;
  return t;
}

size_t chase_reply(const Query& q, std::span<const uint8_t> cname,
                   std::span<const uint8_t> upstream, uint8_t* out, size_t cap) {
  auto mine = parse_message(cname);
  auto theirs = parse_message(upstream);
  if (!mine || !theirs || mine->answer.empty() || mine->answer.front().type != type::kCNAME)
    return 0;
  const Record& alias = mine->answer.front();
  auto target = name_from_text(alias.text);
  if (!target) return 0;
  // What the upstream adds: the target's addresses and the CNAMEs on the way to them.
  std::vector<std::pair<const Record*, std::optional<WireName>>> add;
  for (const Record& rr : theirs->answer) {
    bool wanted = rr.type == type::kCNAME || rr.type == q.qtype;
    if (rr.cls != kClassIN || !wanted) continue;
    if (rr.type != type::kCNAME && rr.rdata.size() != (rr.type == type::kA ? 4u : 16u)) continue;
    auto owner = name_from_text(rr.name);
    if (!owner) return 0;
    add.emplace_back(&rr, owner);
  }
  Writer w(out, cap);
  w.header(q.id, load_u16(cname.data() + 2), 1, static_cast<uint16_t>(1 + add.size()), 0,
           q.edns ? 1 : 0);
  question(w, q);
  size_t at = w.begin_rr(q.qname.span(), type::kCNAME, kClassIN, alias.ttl);
  w.name(target->span());
  w.end_rr(at);
  for (const auto& [rr, owner] : add) {
    at = w.begin_rr(owner->span(), rr->type, kClassIN, rr->ttl);
    if (rr->type == type::kCNAME) {
      auto t = name_from_text(rr->text);
      if (!t) return 0;
      w.name(t->span());
    } else {
      w.bytes(rr->rdata);
    }
    w.end_rr(at);
  }
  if (q.edns) w.opt(kOurUdpSize, 0, 0, false);
  return w.ok() ? w.size() : 0;
}

}  // namespace endpointd::dns
