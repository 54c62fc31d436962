// Encodes the records of one NameBlock as pre-encoded answers: the zone builder adds
// records name by name, finish() sorts them into names and sets. Private to dns/zone_*.cc.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "dns/message.h"
#include "dns/zone.h"

namespace endpointd::dns {

// Collects the records of one block, then sorts them into names and sets and encodes each
// set once. Reused from block to block: its scratch vectors keep their capacity.
class BlockWriter {
 public:
  explicit BlockWriter(uint32_t ttl) : ttl_(ttl), scratch_(65535) {}

  void clear(uint8_t soa_suffix) {
    names_.clear();
    recs_.clear();
    cname_.clear();
    chase_.clear();
    soa_suffix_ = soa_suffix;
  }
  uint32_t name(const WireName& n) {
    names_.push_back(n);
    cname_.push_back(false);
    chase_.push_back(kNone);
    return static_cast<uint32_t>(names_.size() - 1);
  }
  void set_cname(uint32_t node) { cname_[node] = true; }
  // The CNAME of `node` leads out of the zone, to name `target`: see ZoneNode::chase_len.
  void chase_out(uint32_t node, uint32_t target) { chase_[node] = target; }
  // The name exists even without records (an empty non-terminal: NODATA, not NXDOMAIN).
  void exists(uint32_t node) {
    Rec& r = add(node, 0, kExists, 0, node);
    (void)r;
  }
  void address(uint32_t node, const model::IpAddr& a) {
    address_in(node, a.is_v4() ? type::kA : type::kAAAA, kAnswer, node, a);
  }
  void additional_address(uint32_t node, uint16_t set_type, uint32_t owner,
                          const model::IpAddr& a) {
    address_in(node, set_type, kAdditional, owner, a);
  }
  // An address owned by another name, in the answer of `node`'s `set_type` set: the records a
  // CNAME leads to, answered with it.
  void chased_address(uint32_t node, uint16_t set_type, uint32_t owner, const model::IpAddr& a) {
    address_in(node, set_type, kAnswer, owner, a);
  }
  void name_record(uint32_t node, uint16_t t, uint32_t target) {
    add(node, t, kAnswer, t, node).target = target;
  }
  // A record of type `t` in `node`'s `set_type` set (a CNAME before the records it leads to).
  void name_record_in(uint32_t node, uint16_t set_type, uint16_t t, uint32_t target) {
    add(node, set_type, kAnswer, t, node).target = target;
  }
  void srv(uint32_t node, uint16_t prio, uint16_t weight, uint16_t port, uint32_t target) {
    Rec& r = add(node, type::kSRV, kAnswer, type::kSRV, node);
    store_u16(r.rdata.data(), prio);
    store_u16(r.rdata.data() + 2, weight);
    store_u16(r.rdata.data() + 4, port);
    r.rdlen = 6;
    r.target = target;
    r.target_first = false;
    r.compress = false;  // RFC 2782: no compression in the SRV target
  }
  void txt(uint32_t node, std::string_view text) {
    Rec& r = add(node, type::kTXT, kAnswer, type::kTXT, node);
    r.rdata[0] = static_cast<uint8_t>(text.size());
    std::memcpy(r.rdata.data() + 1, text.data(), text.size());
    r.rdlen = static_cast<uint8_t>(1 + text.size());
  }
  void soa(uint32_t node, uint32_t mname, uint32_t rname, std::span<const uint8_t, 20> numbers) {
    Rec& r = add(node, type::kSOA, kAnswer, type::kSOA, node);
    r.target = mname;
    r.target2 = rname;
    std::memcpy(r.rdata.data(), numbers.data(), numbers.size());
    r.rdlen = 20;
  }

  BlockPtr finish();

  // After finish(): the name of the node that name id `id` became (empty: not a node).
  std::string_view node_name(uint32_t id) const {
    if (id >= node_of_.size() || node_of_[id] == kNone) return {};
    return last_->nodes()[node_of_[id]].name;
  }

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};
  static constexpr uint8_t kAnswer = 0, kAdditional = 1, kExists = 2;
  struct Rec {
    uint32_t set_owner = 0;
    uint32_t owner = 0;
    uint32_t target = kNone, target2 = kNone;
    uint16_t set_type = 0;
    uint16_t type = 0;
    uint8_t section = 0;
    uint8_t rdlen = 0;
    bool target_first = true;
    bool compress = true;
    bool has_address = false;
    std::array<uint8_t, 20> rdata{};
    model::IpAddr address;
  };
  struct NodeSpec {
    uint32_t name, set_begin, set_end;
    bool cname;
    uint32_t chase = kNone;
  };
  struct SetSpec {
    uint32_t begin, end;  // in order_
    uint16_t type;
  };
  struct SetSpans {
    size_t body_at = 0, body_len = 0, addr_at = 0, addr_len = 0;
  };

  Rec& add(uint32_t set_owner, uint16_t set_type, uint8_t section, uint16_t t, uint32_t owner) {
    Rec& r = recs_.emplace_back();
    r.set_owner = set_owner;
    r.set_type = set_type;
    r.section = section;
    r.type = t;
    r.owner = owner;
    return r;
  }
  void address_in(uint32_t node, uint16_t set_type, uint8_t section, uint32_t owner,
                  const model::IpAddr& a) {
    Rec& r = add(node, set_type, section, a.is_v4() ? type::kA : type::kAAAA, owner);
    std::memcpy(r.rdata.data(), a.data(), a.size());
    r.rdlen = static_cast<uint8_t>(a.size());
    r.has_address = true;
    r.address = a;
  }

  void write_rr(Writer& w, const Rec& r);
  void encode(NameBlock& b, size_t i);

  uint32_t ttl_;
  uint8_t soa_suffix_ = 0;
  std::vector<uint8_t> scratch_;
  std::vector<WireName> names_;
  std::vector<bool> cname_;
  std::vector<uint32_t> chase_;
  std::vector<Rec> recs_;
  std::vector<uint32_t> order_;
  std::vector<NodeSpec> nodes_;
  std::vector<SetSpec> sets_;
  std::vector<SetSpans> spans_;
  std::vector<uint32_t> node_of_;
  std::vector<const Rec*> answer_, additional_;
  BlockPtr last_;
};

}  // namespace endpointd::dns
