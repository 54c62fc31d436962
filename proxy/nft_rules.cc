// A rule of the endpointd tables as nf_tables expressions: for each rule shape the expressions
// nft itself generates (see proxy/LAYOUT.md), appended to a batch as one NEWRULE message.
#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <libnftnl/expr.h>
#include <libnftnl/rule.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_conntrack_common.h>
#include <linux/netfilter/nf_nat.h>
#include <linux/netfilter/nf_tables.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "proxy/nft_builder.h"
#include "proxy/nftnl_util.h"

namespace endpointd::proxy::encode {
namespace {

using namespace nftnl;  // NOLINT: the handle types and family helpers

// nft's register naming: a 32-bit register whose index is a multiple of four is named by
// the 128-bit register it starts.
uint32_t reg_at(uint32_t byte_offset) {
  uint32_t i = byte_offset / 4;
  if (i % 4 == 0) return NFT_REG_1 + i / 4;
  return NFT_REG32_00 + i;
}

uint32_t saddr_off(IpFamily f) {
  return f == IpFamily::kV4 ? 12 : 8;
}
uint32_t daddr_off(IpFamily f) {
  return f == IpFamily::kV4 ? 16 : 24;
}

// ---- rules: the expressions nft generates for each shape ----

class RuleExprs {
 public:
  RuleExprs(IpFamily f, const std::string& chain) : f_(f), r_(nftnl_rule_alloc()) {
    nftnl_rule_set_str(r_.get(), NFTNL_RULE_TABLE, kTableName);
    nftnl_rule_set_str(r_.get(), NFTNL_RULE_CHAIN, chain.c_str());
    nftnl_rule_set_u32(r_.get(), NFTNL_RULE_FAMILY, nf_family(f));
  }
  nftnl_rule* get() { return r_.get(); }

  nftnl_expr* add(const char* name) {
    nftnl_expr* e = nftnl_expr_alloc(name);
    nftnl_rule_add_expr(r_.get(), e);  // the rule owns it from here
    return e;
  }
  void payload(uint32_t base, uint32_t off, uint32_t len, uint32_t dreg) {
    auto* e = add("payload");
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_BASE, base);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_OFFSET, off);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_LEN, len);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_DREG, dreg);
  }
  void meta(uint32_t key, uint32_t dreg) {
    auto* e = add("meta");
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_DREG, dreg);
  }
  void meta_set(uint32_t key, uint32_t sreg) {
    auto* e = add("meta");
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_SREG, sreg);
  }
  void ct(uint32_t key, uint32_t dreg) {
    auto* e = add("ct");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_DREG, dreg);
  }
  void bitwise(uint32_t reg, uint32_t mask, uint32_t xor_) {
    auto* e = add("bitwise");
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_SREG, reg);
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_DREG, reg);
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_LEN, 4);
    nftnl_expr_set_data(e, NFTNL_EXPR_BITWISE_MASK, &mask, 4);
    nftnl_expr_set_data(e, NFTNL_EXPR_BITWISE_XOR, &xor_, 4);
  }
  void cmp(uint32_t reg, uint32_t op, uint32_t value) {
    auto* e = add("cmp");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_SREG, reg);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_OP, op);
    nftnl_expr_set_data(e, NFTNL_EXPR_CMP_DATA, &value, 4);
  }
  // cmp eq with a value of any length (an address, a protocol byte, a port).
  void cmp_bytes(uint32_t reg, const std::string& value) {
    auto* e = add("cmp");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_SREG, reg);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_OP, NFT_CMP_EQ);
    nftnl_expr_set_data(e, NFTNL_EXPR_CMP_DATA, value.data(), static_cast<uint32_t>(value.size()));
  }
  void lookup(uint32_t sreg, const std::string& set, bool inverted, int dreg = -1) {
    auto* e = add("lookup");
    nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_SREG, sreg);
    nftnl_expr_set_str(e, NFTNL_EXPR_LOOKUP_SET, set.c_str());
    if (dreg >= 0) nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_DREG, static_cast<uint32_t>(dreg));
    if (inverted) nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
  }
  void verdict(int code, const std::string& chain = {}) {
    auto* e = add("immediate");
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_VERDICT);
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_VERDICT, static_cast<uint32_t>(code));
    if (!chain.empty()) nftnl_expr_set_str(e, NFTNL_EXPR_IMM_CHAIN, chain.c_str());
  }
  // <daddr> . meta l4proto . th dport into the registers from offset 0.
  void vip(bool interval_key = false) {
    uint32_t a = addr_len(f_);
    payload(NFT_PAYLOAD_NETWORK_HEADER, daddr_off(f_), a, reg_at(0));
    meta(NFT_META_L4PROTO, reg_at(a));
    if (interval_key) {
      auto* e = add("byteorder");
      nftnl_expr_set_u32(e, NFTNL_EXPR_BYTEORDER_SREG, reg_at(a));
      nftnl_expr_set_u32(e, NFTNL_EXPR_BYTEORDER_DREG, reg_at(a));
      nftnl_expr_set_u32(e, NFTNL_EXPR_BYTEORDER_OP, NFT_BYTEORDER_HTON);
      nftnl_expr_set_u32(e, NFTNL_EXPR_BYTEORDER_LEN, 1);
      nftnl_expr_set_u32(e, NFTNL_EXPR_BYTEORDER_SIZE, 2);
    }
    payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg_at(a + 4));
  }
  void ct_state_new() {
    ct(NFT_CT_STATE, NFT_REG_1);
    bitwise(NFT_REG_1, NF_CT_STATE_BIT(IP_CT_NEW), 0);
    cmp(NFT_REG_1, NFT_CMP_NEQ, 0);
  }
  // iifname "<name>" (all IFNAMSIZ = 16 bytes, NUL-padded), or iifname "<prefix>*" (the
  // prefix's bytes only), compared with `op`, as nft encodes them.
  void iifname(const std::string& pattern, uint32_t op) {
    meta(NFT_META_IIFNAME, NFT_REG_1);
    char name[16] = {};
    bool prefix = !pattern.empty() && pattern.back() == '*';
    size_t n = std::min(pattern.size() - (prefix ? 1 : 0), sizeof name - 1);
    std::memcpy(name, pattern.data(), n);
    auto* c = add("cmp");
    nftnl_expr_set_u32(c, NFTNL_EXPR_CMP_SREG, NFT_REG_1);
    nftnl_expr_set_u32(c, NFTNL_EXPR_CMP_OP, op);
    nftnl_expr_set_data(c, NFTNL_EXPR_CMP_DATA, name,
                        static_cast<uint32_t>(prefix ? n : sizeof name));
  }
  void fib_saddr_local() {
    auto* e = add("fib");
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_FLAGS, NFTA_FIB_F_SADDR);
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE);
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_DREG, NFT_REG_1);
    cmp(NFT_REG_1, NFT_CMP_EQ, 2 /* RTN_LOCAL */);
  }
  void dnat_map(const std::string& set) {
    lookup(reg_at(0), set, false, static_cast<int>(NFT_REG_1));
    dnat(0);
  }
  // dnat to the address . port in the registers from `off`.
  void dnat(uint32_t off) {
    auto* e = add("nat");
    nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_TYPE, NFT_NAT_DNAT);
    nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_FAMILY, nf_family(f_));
    nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_REG_ADDR_MIN, reg_at(off));
    nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_REG_PROTO_MIN, reg_at(off + addr_len(f_)));
  }
  // ct original <daddr> (the address before DNAT).
  void ct_original_daddr(uint32_t dreg) {
    auto* e = add("ct");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_KEY, f_ == IpFamily::kV4 ? NFT_CT_DST_IP : NFT_CT_DST_IP6);
    nftnl_expr_set_u8(e, NFTNL_EXPR_CT_DIR, IP_CT_DIR_ORIGINAL);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_DREG, dreg);
  }
  // ct original proto-dst (the port before DNAT).
  void ct_original_dport(uint32_t dreg) {
    auto* e = add("ct");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_KEY, NFT_CT_PROTO_DST);
    nftnl_expr_set_u8(e, NFTNL_EXPR_CT_DIR, IP_CT_DIR_ORIGINAL);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_DREG, dreg);
  }
  // update @set { <key at 0> timeout T : <data at data_off> }
  void dynset(uint32_t op, const std::string& set, uint32_t data_off, uint32_t timeout_s) {
    auto* e = add("dynset");
    nftnl_expr_set_str(e, NFTNL_EXPR_DYNSET_SET_NAME, set.c_str());
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_OP, op);
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_SREG_KEY, reg_at(0));
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_SREG_DATA, reg_at(data_off));
    if (timeout_s) nftnl_expr_set_u64(e, NFTNL_EXPR_DYNSET_TIMEOUT, uint64_t{timeout_s} * 1000);
  }

 private:
  IpFamily f_;
  RulePtr r_;
};

}  // namespace

void add_rule(Builder& b, IpFamily f, const std::string& chain, const Rule& r) {
  RuleExprs x(f, chain);
  uint32_t a = addr_len(f);
  switch (r.shape) {
    case RuleShape::kCtNewJump:
      x.ct_state_new();
      x.verdict(NFT_JUMP, r.target);
      break;
    case RuleShape::kAcceptEstablished:
      x.ct(NFT_CT_STATE, NFT_REG_1);
      x.bitwise(NFT_REG_1, NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED), 0);
      x.cmp(NFT_REG_1, NFT_CMP_NEQ, 0);
      x.verdict(NF_ACCEPT);
      break;
    case RuleShape::kAcceptDnat:
      x.ct(NFT_CT_STATUS, NFT_REG_1);
      x.bitwise(NFT_REG_1, IPS_DST_NAT, 0);
      x.cmp(NFT_REG_1, NFT_CMP_NEQ, 0);
      x.verdict(NF_ACCEPT);
      break;
    case RuleShape::kJump:
      x.verdict(NFT_JUMP, r.target);
      break;
    case RuleShape::kFirewallCheck:
      x.vip();
      x.lookup(reg_at(0), names::kFirewallIps, false);
      x.vip(true);
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, saddr_off(f), a, reg_at(a + 8));
      x.lookup(reg_at(0), names::kFirewallAllow, true);
      x.verdict(NF_DROP);
      break;
    case RuleShape::kVipVmap:
      x.vip();
      x.lookup(reg_at(0), r.set, false, NFT_REG_VERDICT);
      break;
    case RuleShape::kVipInSetGoto:
      x.vip();
      x.lookup(reg_at(0), r.set, false);
      x.verdict(NFT_GOTO, r.target);
      break;
    case RuleShape::kVipInSetDrop:
      x.vip();
      x.lookup(reg_at(0), r.set, false);
      x.verdict(NF_DROP);
      break;
    case RuleShape::kRejectTcpReset: {
      x.meta(NFT_META_L4PROTO, NFT_REG_1);
      auto* c = x.add("cmp");
      uint8_t tcp = IPPROTO_TCP;
      nftnl_expr_set_u32(c, NFTNL_EXPR_CMP_SREG, NFT_REG_1);
      nftnl_expr_set_u32(c, NFTNL_EXPR_CMP_OP, NFT_CMP_EQ);
      nftnl_expr_set_data(c, NFTNL_EXPR_CMP_DATA, &tcp, 1);
      auto* e = x.add("reject");
      nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, NFT_REJECT_TCP_RST);
      nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE, 0);
      break;
    }
    case RuleShape::kDrop:
      x.verdict(NF_DROP);
      break;
    case RuleShape::kReject: {
      auto* e = x.add("reject");
      nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, NFT_REJECT_ICMP_UNREACH);
      nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE,
                        f == IpFamily::kV4 ? 3 /* port unreach */ : 4 /* port unreach */);
      break;
    }
    case RuleShape::kMarkForMasquerade:
      x.meta(NFT_META_MARK, NFT_REG_1);
      x.bitwise(NFT_REG_1, ~kMasqueradeMark, kMasqueradeMark);
      x.meta_set(NFT_META_MARK, NFT_REG_1);
      break;
    case RuleShape::kHairpinMark:
      x.ct(NFT_CT_STATUS, NFT_REG_1);
      x.bitwise(NFT_REG_1, IPS_DST_NAT, 0);
      x.cmp(NFT_REG_1, NFT_CMP_NEQ, 0);
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, saddr_off(f), a, reg_at(0));
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, daddr_off(f), a, reg_at(a));
      x.lookup(reg_at(0), names::kHairpin, false);
      x.verdict(NFT_JUMP, r.target);
      break;
    case RuleShape::kMasqReturnUnmarked:
      x.meta(NFT_META_MARK, NFT_REG_1);
      x.bitwise(NFT_REG_1, kMasqueradeMark, 0);
      x.cmp(NFT_REG_1, NFT_CMP_EQ, 0);
      x.verdict(NFT_RETURN);
      break;
    case RuleShape::kMasqClearMark:
      x.meta(NFT_META_MARK, NFT_REG_1);
      x.bitwise(NFT_REG_1, 0xffffffff, kMasqueradeMark);
      x.meta_set(NFT_META_MARK, NFT_REG_1);
      break;
    case RuleShape::kMasquerade: {
      auto* e = x.add("masq");
      nftnl_expr_set_u32(e, NFTNL_EXPR_MASQ_FLAGS, NF_NAT_RANGE_PROTO_RANDOM_FULLY);
      break;
    }
    case RuleShape::kSaddrNotInJump:
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, saddr_off(f), a, NFT_REG_1);
      x.lookup(NFT_REG_1, r.set, true);
      x.verdict(NFT_JUMP, r.target);
      break;
    case RuleShape::kSaddrInVmap:
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, saddr_off(f), a, NFT_REG_1);
      x.lookup(NFT_REG_1, names::kClusterCidrs, false);
      x.vip();
      x.lookup(reg_at(0), r.set, false, NFT_REG_VERDICT);
      break;
    case RuleShape::kFibLocalJump:
      x.fib_saddr_local();
      x.verdict(NFT_JUMP, r.target);
      break;
    case RuleShape::kFibLocalVmap:
      x.fib_saddr_local();
      x.vip();
      x.lookup(reg_at(0), r.set, false, NFT_REG_VERDICT);
      break;
    case RuleShape::kDnatRandom: {
      x.vip();
      auto* e = x.add("numgen");
      nftnl_expr_set_u32(e, NFTNL_EXPR_NG_DREG, reg_at(a + 8));
      nftnl_expr_set_u32(e, NFTNL_EXPR_NG_MODULUS, r.modulus);
      nftnl_expr_set_u32(e, NFTNL_EXPR_NG_TYPE, NFT_NG_RANDOM);
      x.dnat_map(r.set);
      break;
    }
    case RuleShape::kAffinityStick:
      // <saddr> . <vip> from register 1, as nft lays out a concatenated map key.
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, saddr_off(f), a, reg_at(0));
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, daddr_off(f), a, reg_at(a));
      x.meta(NFT_META_L4PROTO, reg_at(2 * a));
      x.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg_at(2 * a + 4));
      x.lookup(reg_at(0), r.set, false, static_cast<int>(NFT_REG_1));
      x.dnat(0);
      break;
    case RuleShape::kAffinityRecord: {
      x.meta(NFT_META_L4PROTO, NFT_REG_1);
      auto* c = x.add("cmp");
      nftnl_expr_set_u32(c, NFTNL_EXPR_CMP_SREG, NFT_REG_1);
      nftnl_expr_set_u32(c, NFTNL_EXPR_CMP_OP, NFT_CMP_EQ);
      nftnl_expr_set_data(c, NFTNL_EXPR_CMP_DATA, &r.l4proto, 1);
      // After DNAT: ct original <vip> . <daddr> . th dport, a current backend of the VIP?
      x.ct_original_daddr(reg_at(0));
      x.meta(NFT_META_L4PROTO, reg_at(a));
      x.ct_original_dport(reg_at(a + 4));
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, daddr_off(f), a, reg_at(a + 8));
      x.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg_at(2 * a + 8));
      x.lookup(reg_at(0), r.set, false);
      // update @affinity { <saddr> . ct original <vip> timeout T : <daddr> . th dport }
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, saddr_off(f), a, reg_at(0));
      x.ct_original_daddr(reg_at(a));
      x.meta(NFT_META_L4PROTO, reg_at(2 * a));
      x.ct_original_dport(reg_at(2 * a + 4));
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, daddr_off(f), a, reg_at(2 * a + 8));
      x.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg_at(3 * a + 8));
      x.dynset(NFT_DYNSET_OP_UPDATE, r.affinity, 2 * a + 8, r.timeout_s);
      break;
    }
    case RuleShape::kGoto:
      x.verdict(NFT_GOTO, r.target);
      break;
    case RuleShape::kIifnameNotJump:
      x.iifname(r.iifname, NFT_CMP_NEQ);
      x.verdict(NFT_JUMP, r.target);
      break;
    case RuleShape::kIifnameVmap:
      x.iifname(r.iifname, NFT_CMP_EQ);
      x.vip();
      x.lookup(reg_at(0), r.set, false, NFT_REG_VERDICT);
      break;
    case RuleShape::kDaddrInSetGoto:
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, daddr_off(f), a, NFT_REG_1);
      x.lookup(NFT_REG_1, r.set, false);
      x.verdict(NFT_GOTO, r.target);
      break;
    case RuleShape::kDaddrInSetDrop:
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, daddr_off(f), a, NFT_REG_1);
      x.lookup(NFT_REG_1, r.set, false);
      x.verdict(NF_DROP);
      break;
    case RuleShape::kNotrackDaddr:
    case RuleShape::kNotrackSaddr: {
      // As nft writes `ip daddr A udp dport 53 notrack`: the address, the protocol (one byte),
      // the port (two bytes, network order), each compared in register 1.
      bool dst = r.shape == RuleShape::kNotrackDaddr;
      x.payload(NFT_PAYLOAD_NETWORK_HEADER, dst ? daddr_off(f) : saddr_off(f), a, NFT_REG_1);
      x.cmp_bytes(NFT_REG_1, r.addr);
      x.meta(NFT_META_L4PROTO, NFT_REG_1);
      x.cmp_bytes(NFT_REG_1, std::string(1, static_cast<char>(r.l4proto)));
      x.payload(NFT_PAYLOAD_TRANSPORT_HEADER, dst ? 2 : 0, 2, NFT_REG_1);
      x.cmp_bytes(NFT_REG_1, port_field(r.port).substr(0, 2));
      x.add("notrack");
      break;
    }
  }
  auto* nlh = b.header(NFT_MSG_NEWRULE, f, NLM_F_CREATE | NLM_F_APPEND, "add rule to " + chain);
  nftnl_rule_nlmsg_build_payload(nlh, x.get());
  b.done(nlh);
}

}  // namespace endpointd::proxy::encode
