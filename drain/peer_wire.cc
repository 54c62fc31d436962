// Peer wire messages <-> the Aggregator's reports: what a received message may carry (valid
// node names, bounded lists) is decided here, before the Aggregator sees it.
#include "drain/peer_wire.h"

#include <algorithm>
#include <variant>

namespace endpointd::drain {

namespace pb = endpointd::v1;

namespace {

constexpr size_t kMaxName = 253;  // a node name is a DNS subdomain
constexpr size_t kMaxList = 100000;

bool valid_name(const std::string& s) {
  return !s.empty() && s.size() <= kMaxName;
}

void copy_names(const google::protobuf::RepeatedPtrField<std::string>& in,
                std::vector<std::string>& out) {
  out.reserve(std::min<size_t>(in.size(), kMaxList));
  for (const auto& s : in) {
    if (out.size() >= kMaxList) break;
    if (valid_name(s)) out.push_back(s);
  }
}

void copy_holdouts(const google::protobuf::RepeatedPtrField<pb::WatermarkHoldout>& in,
                   HoldoutList& out) {
  std::vector<Holdout> raw;
  for (const auto& h : in) {
    if (raw.size() >= kMaxHoldouts) break;
    if (!valid_name(h.node()) || !valid_name(h.client())) continue;
    raw.push_back(Holdout{h.node(), h.client(), h.revision(), h.reason().substr(0, kMaxName)});
  }
  out = HoldoutList::of(std::move(raw));
}

template <typename W>
void put_holdouts(const HoldoutList& in, W* w) {
  for (const auto& h : in) {
    auto* o = w->add_holdouts();
    o->set_node(h.node);
    o->set_client(h.client);
    o->set_revision(h.revision);
    o->set_reason(h.reason);
  }
}

}  // namespace

// A received message as the Aggregator takes it; an error names what was wrong.
Result<Message> from_wire(const pb::PeerMessage& m) {
  if (m.has_up()) {
    const auto& u = m.up();
    if (!valid_name(u.from())) return Error{"up report without a valid sender name"};
    UpReport r;
    r.from = u.from();
    r.watermark = u.watermark();
    r.covered.count = u.covered_count();
    r.covered.digest = u.covered_digest();
    copy_names(u.silent(), r.silent);
    copy_names(u.returning(), r.returning);
    r.leaving = u.leaving();
    r.probe = u.probe();
    copy_names(u.excluded(), r.excluded);
    r.epoch = u.epoch();
    r.dns_watermark = u.dns_watermark();
    copy_holdouts(u.holdouts(), r.holdouts);
    r.decision = u.decision();
    return Message{std::move(r)};
  }
  if (m.has_down()) {
    const auto& d = m.down();
    if (!valid_name(d.from())) return Error{"down report without a valid sender name"};
    DownReport r;
    r.from = d.from();
    r.watermark = d.watermark();
    copy_names(d.excluded(), r.excluded);
    r.epoch = d.epoch();
    r.covered.count = d.covered_count();
    r.covered.digest = d.covered_digest();
    r.dns_watermark = d.dns_watermark();
    copy_holdouts(d.holdouts(), r.holdouts);
    r.own = d.own_watermark();
    r.own_dns = d.own_dns_watermark();
    return Message{std::move(r)};
  }
  return Error{"a message with neither an up nor a down report"};
}

pb::PeerMessage to_wire(const Message& m) {
  pb::PeerMessage out;
  if (const auto* u = std::get_if<UpReport>(&m)) {
    auto* w = out.mutable_up();
    w->set_from(u->from);
    w->set_watermark(u->watermark);
    w->set_covered_count(u->covered.count);
    w->set_covered_digest(u->covered.digest);
    for (const auto& s : u->silent) w->add_silent(s);
    for (const auto& s : u->returning) w->add_returning(s);
    w->set_leaving(u->leaving);
    w->set_probe(u->probe);
    for (const auto& s : u->excluded) w->add_excluded(s);
    w->set_epoch(u->epoch);
    w->set_dns_watermark(u->dns_watermark);
    put_holdouts(u->holdouts, w);
    w->set_decision(u->decision);
  } else {
    const auto& d = std::get<DownReport>(m);
    auto* w = out.mutable_down();
    w->set_from(d.from);
    w->set_watermark(d.watermark);
    for (const auto& s : d.excluded) w->add_excluded(s);
    w->set_epoch(d.epoch);
    w->set_covered_count(d.covered.count);
    w->set_covered_digest(d.covered.digest);
    w->set_dns_watermark(d.dns_watermark);
    put_holdouts(d.holdouts, w);
    w->set_own_watermark(d.own);
    w->set_own_dns_watermark(d.own_dns);
  }
  return out;
}

const std::string& sender(const pb::PeerMessage& m) {
  return m.has_up() ? m.up().from() : m.down().from();
}

}  // namespace endpointd::drain
