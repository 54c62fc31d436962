// The endpointd tables as nf_tables netlink messages: pure encoding, no socket. Every nftnl
// handle is owned by a unique_ptr; a batch is built as bytes (a value) that proxy/netlink.cc
// sends, and that tests/proxy/nft_encode_test.cc decodes with libnftnl without root.
#include "proxy/nft_encode.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/expr.h>
#include <libnftnl/rule.h>
#include <libnftnl/set.h>
#include <libnftnl/table.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_conntrack_common.h>
#include <linux/netfilter/nf_nat.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "proxy/nftnl_util.h"

namespace endpointd::proxy {
namespace {

using namespace nftnl;  // NOLINT: the handle types and family helpers

// nft's register naming: a 32-bit register whose index is a multiple of four is named by
// the 128-bit register it starts.
uint32_t reg_at(uint32_t byte_offset) {
  uint32_t i = byte_offset / 4;
  if (i % 4 == 0) return NFT_REG_1 + i / 4;
  return NFT_REG32_00 + i;
}

uint32_t addr_len(IpFamily f) {
  return f == IpFamily::kV4 ? 4 : 16;
}
uint32_t saddr_off(IpFamily f) {
  return f == IpFamily::kV4 ? 12 : 8;
}
uint32_t daddr_off(IpFamily f) {
  return f == IpFamily::kV4 ? 16 : 24;
}

// ---- set definitions: key/data types as nft computes them, user data as nft writes it ----

constexpr uint32_t kTypeInteger = 4;
constexpr uint32_t kTypeIpv4 = 7;
constexpr uint32_t kTypeIpv6 = 8;
constexpr uint32_t kTypeInetProto = 12;
constexpr uint32_t kTypeInetService = 13;
constexpr uint32_t kTypeMark = 19;
constexpr uint32_t concat(std::initializer_list<uint32_t> types) {
  uint32_t t = 0;
  for (uint32_t x : types) t = (t << 6) | x;
  return t;
}

std::string hex_bytes(const char* hex) {
  std::string out;
  for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) {
    auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    out.push_back(static_cast<char>(nib(hex[i]) * 16 + nib(hex[i + 1])));
  }
  return out;
}

// User data nft 1.0.6 attaches to each set shape (byte order, and the typeof expressions
// for the backend maps, which record the numgen modulus). Observed with `nft --debug=mnl`.
std::string set_udata(IpFamily f, SetShape shape, uint32_t modulus) {
  switch (shape) {
    case SetShape::kAddrInterval:
    case SetShape::kAddrSet:
      return hex_bytes("000402000000");
    case SetShape::kDigest:  // host byte order
      return hex_bytes("000401000000");
    case SetShape::kAddrPair:
    case SetShape::kVipSet:
    case SetShape::kVipSrcInterval:
    case SetShape::kVipBackendSet:
      return hex_bytes("000400000000030800040d0000000100");
    case SetShape::kAffinity:
      return hex_bytes(
          "000400000000010400000000030800040d0000000100040800040d0000000100060400000000");
    case SetShape::kVipVerdictMap:
      return hex_bytes("000400000000010400000000030800040d0000000100060400000000");
    case SetShape::kBackends: {
      // key typeof: concat(payload daddr, meta l4proto, payload th dport, numgen random mod N);
      // data typeof: concat(payload daddr, payload th dport).
      const char* v4 =
          "000400000000010400000000036000040d00000001580014000407000000010c00040c00000001040c000000"
          "010e"
          "00040900000001060004100000000214000407000000010c00040b000000010402000000031a000417000000"
          "01120004"
          "01000000010402000000020400000000043400040d000000012c0014000407000000010c00040c0000000104"
          "0c00000001"
          "14000407000000010c00040b00000001040200000006040000000000";
      const char* v6 =
          "000400000000010400000000036000040d00000001580014000407000000010c00040d000000010409000000"
          "010e"
          "00040900000001060004100000000214000407000000010c00040b000000010402000000031a000417000000"
          "01120004"
          "01000000010402000000020400000000043400040d000000012c0014000407000000010c00040d0000000104"
          "090000000114"
          "000407000000010c00040b00000001040200000006040000000000";
      std::string u = hex_bytes(f == IpFamily::kV4 ? v4 : v6);
      u.resize(170);
      // The modulus sits in the numgen typeof record: "01 04 <u32 mod>" after "00 04 01000000".
      const std::string marker = hex_bytes("1a0004170000000112000401000000010402000000");
      size_t at = u.find(marker);
      if (at != std::string::npos) std::memcpy(u.data() + at + marker.size() - 4, &modulus, 4);
      return u;
    }
  }
  return {};
}

struct SetDef {
  uint32_t flags;
  uint32_t key_type;
  uint32_t key_len;
  uint32_t data_type = 0;
  uint32_t data_len = 0;
  bool has_data = false;
  std::vector<uint8_t> concat_fields;  // interval concatenations only
};

SetDef set_def(IpFamily f, SetShape shape) {
  uint32_t at = f == IpFamily::kV4 ? kTypeIpv4 : kTypeIpv6;
  uint32_t a = addr_len(f);
  switch (shape) {
    case SetShape::kAddrInterval:
      return {NFT_SET_INTERVAL, at, a, 0, 0, false, {}};
    case SetShape::kAddrSet:
      return {0, at, a, 0, 0, false, {}};
    case SetShape::kDigest:
      return {0, kTypeMark, 4, 0, 0, false, {}};
    case SetShape::kAddrPair:
      return {0, concat({at, at}), 2 * a, 0, 0, false, {}};
    case SetShape::kVipSet:
      return {0, concat({at, kTypeInetProto, kTypeInetService}), a + 8, 0, 0, false, {}};
    case SetShape::kVipSrcInterval:
      return {NFT_SET_INTERVAL | NFT_SET_CONCAT,
              concat({at, kTypeInetProto, kTypeInetService, at}),
              2 * a + 8,
              0,
              0,
              false,
              {static_cast<uint8_t>(a), 1, 2, static_cast<uint8_t>(a)}};
    case SetShape::kVipVerdictMap:
      return {NFT_SET_MAP, concat({at, kTypeInetProto, kTypeInetService}),
              a + 8,       NFT_DATA_VERDICT,
              0,           true,
              {}};
    case SetShape::kBackends:
      return {NFT_SET_MAP, concat({at, kTypeInetProto, kTypeInetService, kTypeInteger}),
              a + 12,      concat({at, kTypeInetService}),
              a + 4,       true,
              {}};
    case SetShape::kVipBackendSet:
      return {0,          concat({at, kTypeInetProto, kTypeInetService, at, kTypeInetService}),
              2 * a + 12, 0,
              0,          false,
              {}};
    case SetShape::kAffinity:
      return {NFT_SET_MAP | NFT_SET_TIMEOUT | NFT_SET_EVAL,
              concat({at, at, kTypeInetProto, kTypeInetService}),
              2 * a + 8,
              concat({at, kTypeInetService}),
              a + 4,
              true,
              {}};
  }
  return {0, 0, 0, 0, 0, false, {}};
}

// ---- message building ----

constexpr size_t kScratch = 1 << 20;

class Builder {
 public:
  explicit Builder(uint32_t seq) : seq_(seq) { append(nftnl_batch_begin(scratch_.get(), seq_++)); }

  Batch finish() {
    append(nftnl_batch_end(scratch_.get(), seq_++));
    batch_.first_seq = first_;
    return std::move(batch_);
  }

  nlmsghdr* header(uint16_t type, IpFamily f, uint16_t flags, std::string what) {
    if (first_ == 0) first_ = seq_;
    batch_.what.push_back(std::move(what));
    return nftnl_nlmsg_build_hdr(scratch_.get(), type, nf_family(f), flags | NLM_F_ACK, seq_++);
  }
  void done(nlmsghdr* nlh) { batch_.bytes.append(scratch_.get(), nlh->nlmsg_len); }
  void sized(IpFamily f, const std::string& set, uint32_t size) {
    batch_.sizes.push_back({f, set, size});
  }

 private:
  void append(const nlmsghdr* nlh) { batch_.bytes.append(scratch_.get(), nlh->nlmsg_len); }
  // One message at a time is built here (not zero-filled: a small batch stays cheap).
  std::unique_ptr<char[]> scratch_{new char[kScratch]};
  Batch batch_;
  uint32_t seq_;
  uint32_t first_ = 0;
};

TablePtr table_obj(IpFamily f) {
  TablePtr t(nftnl_table_alloc());
  nftnl_table_set_str(t.get(), NFTNL_TABLE_NAME, kTableName);
  nftnl_table_set_u32(t.get(), NFTNL_TABLE_FAMILY, nf_family(f));
  return t;
}

void add_table(Builder& b, IpFamily f) {
  auto t = table_obj(f);
  auto* nlh =
      b.header(NFT_MSG_NEWTABLE, f, NLM_F_CREATE, std::string("add table ") + family_name(f));
  nftnl_table_nlmsg_build_payload(nlh, t.get());
  b.done(nlh);
}

ChainPtr chain_obj(IpFamily f, const std::string& name) {
  ChainPtr c(nftnl_chain_alloc());
  nftnl_chain_set_str(c.get(), NFTNL_CHAIN_TABLE, kTableName);
  nftnl_chain_set_str(c.get(), NFTNL_CHAIN_NAME, name.c_str());
  nftnl_chain_set_u32(c.get(), NFTNL_CHAIN_FAMILY, nf_family(f));
  return c;
}

uint32_t hook_num(const std::string& h) {
  if (h == "prerouting") return NF_INET_PRE_ROUTING;
  if (h == "input") return NF_INET_LOCAL_IN;
  if (h == "forward") return NF_INET_FORWARD;
  if (h == "output") return NF_INET_LOCAL_OUT;
  return NF_INET_POST_ROUTING;
}

void add_chain(Builder& b, IpFamily f, const Chain& c) {
  auto obj = chain_obj(f, c.name);
  if (c.base) {
    nftnl_chain_set_u32(obj.get(), NFTNL_CHAIN_HOOKNUM, hook_num(c.base->hook));
    nftnl_chain_set_s32(obj.get(), NFTNL_CHAIN_PRIO, c.base->priority);
    nftnl_chain_set_str(obj.get(), NFTNL_CHAIN_TYPE, c.base->type.c_str());
    nftnl_chain_set_u32(obj.get(), NFTNL_CHAIN_POLICY, NF_ACCEPT);
  }
  auto* nlh = b.header(NFT_MSG_NEWCHAIN, f, NLM_F_CREATE, "add chain " + c.name);
  nftnl_chain_nlmsg_build_payload(nlh, obj.get());
  b.done(nlh);
}

void del_chain(Builder& b, IpFamily f, const std::string& name) {
  auto obj = chain_obj(f, name);
  auto* nlh = b.header(NFT_MSG_DELCHAIN, f, 0, "delete chain " + name);
  nftnl_chain_nlmsg_build_payload(nlh, obj.get());
  b.done(nlh);
}

void flush_chain(Builder& b, IpFamily f, const std::string& name) {
  RulePtr r(nftnl_rule_alloc());
  nftnl_rule_set_str(r.get(), NFTNL_RULE_TABLE, kTableName);
  nftnl_rule_set_str(r.get(), NFTNL_RULE_CHAIN, name.c_str());
  nftnl_rule_set_u32(r.get(), NFTNL_RULE_FAMILY, nf_family(f));
  auto* nlh = b.header(NFT_MSG_DELRULE, f, 0, "flush chain " + name);
  nftnl_rule_nlmsg_build_payload(nlh, r.get());
  b.done(nlh);
}

SetPtr set_obj(IpFamily f, const std::string& name) {
  SetPtr s(nftnl_set_alloc());
  nftnl_set_set_str(s.get(), NFTNL_SET_TABLE, kTableName);
  nftnl_set_set_str(s.get(), NFTNL_SET_NAME, name.c_str());
  nftnl_set_set_u32(s.get(), NFTNL_SET_FAMILY, nf_family(f));
  return s;
}

uint32_t g_set_id = 1;

// `size`: NFTA_SET_DESC_SIZE (0: none); the affinity map always has kAffinityMapSize.
void add_set(Builder& b, IpFamily f, const Set& s, uint32_t size = 0) {
  auto obj = set_obj(f, s.name);
  SetDef d = set_def(f, s.shape);
  nftnl_set_set_u32(obj.get(), NFTNL_SET_FLAGS, d.flags);
  nftnl_set_set_u32(obj.get(), NFTNL_SET_KEY_TYPE, d.key_type);
  nftnl_set_set_u32(obj.get(), NFTNL_SET_KEY_LEN, d.key_len);
  if (d.has_data) {
    nftnl_set_set_u32(obj.get(), NFTNL_SET_DATA_TYPE,
                      d.data_type == NFT_DATA_VERDICT ? NFT_DATA_VERDICT : d.data_type);
    nftnl_set_set_u32(obj.get(), NFTNL_SET_DATA_LEN, d.data_len);
  }
  if (!d.concat_fields.empty()) {
    nftnl_set_set_data(obj.get(), NFTNL_SET_DESC_CONCAT, d.concat_fields.data(),
                       static_cast<uint32_t>(d.concat_fields.size()));
  }
  // Its records carry their own timeouts (the record rules').
  if (s.shape == SetShape::kAffinity) size = kAffinityMapSize;
  if (size) nftnl_set_set_u32(obj.get(), NFTNL_SET_DESC_SIZE, size);
  nftnl_set_set_u32(obj.get(), NFTNL_SET_ID, g_set_id++);
  std::string ud = set_udata(f, s.shape, s.modulus);
  nftnl_set_set_data(obj.get(), NFTNL_SET_USERDATA, ud.data(), static_cast<uint32_t>(ud.size()));
  auto* nlh = b.header(NFT_MSG_NEWSET, f, NLM_F_CREATE, "add set " + s.name);
  nftnl_set_nlmsg_build_payload(nlh, obj.get());
  b.done(nlh);
}

void del_set(Builder& b, IpFamily f, const std::string& name) {
  auto obj = set_obj(f, name);
  auto* nlh = b.header(NFT_MSG_DELSET, f, 0, "delete set " + name);
  nftnl_set_nlmsg_build_payload(nlh, obj.get());
  b.done(nlh);
}

void flush_set(Builder& b, IpFamily f, const std::string& name) {
  auto obj = set_obj(f, name);
  auto* nlh = b.header(NFT_MSG_DELSETELEM, f, 0, "flush set " + name);
  nftnl_set_elems_nlmsg_build_payload(nlh, obj.get());
  b.done(nlh);
}

// One element's attributes as libnftnl's nftnl_set_elem_nlmsg_build_payload lays them out
// (flags, key, key end, verdict or data), written into the message with libmnl: a full sync
// carries ~10^5 elements, and an nftnl_set_elem per element cost allocations and frees each.
// `chain` (a goto's target) must be followed by a NUL. `userdata`: NFTA_SET_ELEM_USERDATA.
void put_element(nlmsghdr* nlh, uint16_t index, std::string_view key, uint32_t flags,
                 std::string_view key_end, Verdict verdict = Verdict::kNone,
                 std::string_view chain = {}, std::string_view data = {},
                 std::string_view userdata = {}) {
  auto put_value = [nlh](uint16_t type, std::string_view bytes) {
    nlattr* nest = mnl_attr_nest_start(nlh, type);
    mnl_attr_put(nlh, NFTA_DATA_VALUE, bytes.size(), bytes.data());
    mnl_attr_nest_end(nlh, nest);
  };
  nlattr* el = mnl_attr_nest_start(nlh, index);
  if (flags) mnl_attr_put_u32(nlh, NFTA_SET_ELEM_FLAGS, htonl(flags));
  put_value(NFTA_SET_ELEM_KEY, key);
  if (!key_end.empty()) put_value(NFTA_SET_ELEM_KEY_END, key_end);
  if (verdict != Verdict::kNone) {
    nlattr* d = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_DATA);
    nlattr* v = mnl_attr_nest_start(nlh, NFTA_DATA_VERDICT);
    bool go = verdict == Verdict::kGoto;
    mnl_attr_put_u32(nlh, NFTA_VERDICT_CODE,
                     htonl(go ? static_cast<uint32_t>(NFT_GOTO) : static_cast<uint32_t>(NF_DROP)));
    if (go) mnl_attr_put(nlh, NFTA_VERDICT_CHAIN, chain.size() + 1, chain.data());  // with NUL
    mnl_attr_nest_end(nlh, v);
    mnl_attr_nest_end(nlh, d);
  } else if (!data.empty()) {
    put_value(NFTA_SET_ELEM_DATA, data);
  }
  if (!userdata.empty())
    mnl_attr_put(nlh, NFTA_SET_ELEM_USERDATA, userdata.size(), userdata.data());
  mnl_attr_nest_end(nlh, el);
}

// Elements come from TableChanges (Element) or straight from a table (ElementMap::View).
const Element& ref(const Element* e) {
  return *e;
}
const ElementMap::View& ref(const ElementMap::View& v) {
  return v;
}
std::string_view chain_of(const Element& e) {
  return {e.chain.c_str(), e.chain.size()};
}
std::string_view chain_of(const ElementMap::View& v) {
  return v.chain;
}

// `a` becomes the address after it (bytes in network order); false when `a` was the last.
bool next_address(std::string& a) {
  for (int i = static_cast<int>(a.size()) - 1; i >= 0; --i) {
    auto v = static_cast<uint8_t>(a[i]);
    if (v != 0xff) {
      a[i] = static_cast<char>(v + 1);
      return true;
    }
    a[i] = 0;
  }
  return false;
}

// The kernel form of one model element. Plain intervals (rbtree) become a start element and
// an end element flagged NFT_SET_ELEM_INTERVAL_END, as nft sends them. `index` numbers the
// elements of one message from 1.
template <typename E>
void put_model_element(nlmsghdr* nlh, uint16_t& index, SetShape shape, const E& e, bool adding) {
  if (shape == SetShape::kAddrInterval) {
    put_element(nlh, ++index, e.key, 0, {});
    // The end element is the first address after the range, unless the range ends at the top.
    std::string end(e.key_end);
    if (next_address(end)) put_element(nlh, ++index, end, NFT_SET_ELEM_INTERVAL_END, {});
    return;
  }
  if (!adding) {
    put_element(nlh, ++index, e.key, 0, e.key_end);
    return;
  }
  put_element(nlh, ++index, e.key, 0, e.key_end, e.verdict, chain_of(e), e.data);
}

constexpr size_t kElementsPerMessage = 512;

// `n` elements of one set in messages of bounded size: NEWSETELEM (`adding`) or `del_type`.
// put(nlh, index, from, to) writes elements [from, to) into one message's list.
template <typename Put>
void element_messages(Builder& b, IpFamily f, const std::string& set_name, size_t n, bool adding,
                      const std::string& what, Put put, uint16_t del_type = NFT_MSG_DELSETELEM) {
  for (size_t i = 0; i < n; i += kElementsPerMessage) {
    size_t end = std::min(n, i + kElementsPerMessage);
    auto* nlh = b.header(adding ? static_cast<uint16_t>(NFT_MSG_NEWSETELEM) : del_type, f,
                         adding ? NLM_F_CREATE : 0, what + " of " + set_name);
    // nftnl_set_elem_nlmsg_build_def's attributes: the set, then its table.
    mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_SET, set_name.c_str());
    mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_TABLE, kTableName);
    nlattr* list = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_LIST_ELEMENTS);
    uint16_t index = 0;
    put(nlh, index, i, end);
    mnl_attr_nest_end(nlh, list);
    b.done(nlh);
  }
}

// Elements of one set, in messages of bounded size. T: const Element* or ElementMap::View.
template <typename T>
void elements(Builder& b, IpFamily f, const std::string& set_name, SetShape shape,
              const std::vector<T>& els, bool adding) {
  auto put = [&](nlmsghdr* nlh, uint16_t& index, size_t i, size_t end) {
    if (shape != SetShape::kAddrInterval) {
      for (size_t j = i; j < end; ++j) put_model_element(nlh, index, shape, ref(els[j]), adding);
      return;
    }
    // nft sends a plain interval set's elements sorted, led by an end element at 0 when the
    // first range does not start there.
    std::vector<const T*> sorted;
    for (size_t j = i; j < end; ++j) sorted.push_back(&els[j]);
    std::sort(sorted.begin(), sorted.end(), [](auto* x, auto* y) {
      return std::string_view(ref(*x).key) < std::string_view(ref(*y).key);
    });
    if (adding && !sorted.empty()) {
      std::string_view first = ref(*sorted.front()).key;
      if (first != std::string(first.size(), '\0')) {
        std::string zero(first.size(), '\0');
        put_element(nlh, ++index, zero, NFT_SET_ELEM_INTERVAL_END, {});
      }
    }
    for (const T* e : sorted) put_model_element(nlh, index, shape, ref(*e), adding);
  };
  element_messages(b, f, set_name, els.size(), adding,
                   std::string(adding ? "add" : "delete") + " elements", put);
}

// ---- content digests (see Table's DigestEntry) ----

Set digest_set() {
  Set s;
  s.name = names::kDigests;
  s.shape = SetShape::kDigest;
  return s;
}

std::string digest_key_bytes(uint32_t key) {
  std::string out(4, '\0');
  std::memcpy(out.data(), &key, 4);  // a mark: host byte order
  return out;
}

// A comment as nft writes it into an element's user data: NFTNL_UDATA_SET_ELEM_COMMENT (0),
// its length with the NUL, the text and a NUL.
std::string comment_udata(const std::string& text) {
  std::string out;
  out.push_back('\0');
  out.push_back(static_cast<char>(text.size() + 1));
  out += text;
  out.push_back('\0');
  return out;
}

// Replaces digest entries: `del` keys first, then `add` entries.
void digest_changes(Builder& b, IpFamily f, const std::vector<uint32_t>& del,
                    const std::vector<DigestEntry>& add) {
  const std::string set = names::kDigests;
  element_messages(b, f, set, del.size(), false, "delete digests",
                   [&](nlmsghdr* nlh, uint16_t& index, size_t i, size_t end) {
                     for (size_t j = i; j < end; ++j)
                       put_element(nlh, ++index, digest_key_bytes(del[j]), 0, {});
                   });
  element_messages(b, f, set, add.size(), true, "add digests",
                   [&](nlmsghdr* nlh, uint16_t& index, size_t i, size_t end) {
                     for (size_t j = i; j < end; ++j) {
                       put_element(nlh, ++index, digest_key_bytes(add[j].key), 0, {},
                                   Verdict::kNone, {}, {}, comment_udata(add[j].comment));
                     }
                   });
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

void changes(Builder& b, const TableChanges& ch, const Table* shapes_from) {
  (void)shapes_from;
  IpFamily f = ch.family;
  for (const auto& s : ch.add_sets) {
    // Made without a size (no limit): a set that appears between full syncs (backends-N for a
    // new endpoint count) often grows fast from few elements, and outgrowing a size costs a
    // full sync. It keeps the resizable table until the table is made anew.
    add_set(b, f, s, 0);
    b.sized(f, s.name, 0);
  }
  for (const auto& c : ch.add_chains) add_chain(b, f, c);
  for (const auto& c : ch.add_chains) {
    for (const auto& r : c.rules) add_rule(b, f, c.name, r);
  }
  for (const auto& c : ch.replace_chains) {
    flush_chain(b, f, c.name);
    for (const auto& r : c.rules) add_rule(b, f, c.name, r);
  }
  auto shape_of = [](const std::string& set) {
    if (set == names::kClusterCidrs || set == names::kServiceCidrs) return SetShape::kAddrInterval;
    if (set == names::kClusterIps) return SetShape::kAddrSet;
    if (set == names::kHairpin) return SetShape::kAddrPair;
    if (set == names::kFirewallIps || set == names::kNoEndpointReject ||
        set == names::kNoEndpointDrop) {
      return SetShape::kVipSet;
    }
    if (set == names::kFirewallAllow) return SetShape::kVipSrcInterval;
    if (set.rfind("affinity-backends-", 0) == 0) return SetShape::kVipBackendSet;
    if (set.find("backends-") != std::string::npos) return SetShape::kBackends;
    return SetShape::kVipVerdictMap;
  };
  auto grouped = [&](const std::vector<std::pair<std::string, Element>>& list, bool adding) {
    std::map<std::string, std::vector<const Element*>> by_set;
    for (const auto& [s, e] : list) by_set[s].push_back(&e);
    for (const auto& [s, els] : by_set) elements(b, f, s, shape_of(s), els, adding);
  };
  grouped(ch.del_elements, false);
  grouped(ch.add_elements, true);
  digest_changes(b, f, ch.del_digests, ch.add_digests);
  for (const auto& c : ch.del_chains) flush_chain(b, f, c);
  for (const auto& s : ch.del_sets) del_set(b, f, s);
  for (const auto& c : ch.del_chains) del_chain(b, f, c);
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

Batch build_changes_batch(const std::vector<TableChanges>& list, uint32_t seq) {
  Builder b(seq);
  size_t elements = 0;
  for (const auto& ch : list) {
    changes(b, ch, nullptr);
    elements += ch.del_elements.size() + ch.add_elements.size();
  }
  Batch out = b.finish();
  out.elements = elements;
  return out;
}

Batch build_forget_affinity_batch(IpFamily f, const std::vector<std::string>& keys, uint32_t seq) {
  constexpr uint16_t kDestroySetElem = 30;  // NFT_MSG_DESTROYSETELEM (Linux 6.3 uapi)
  Builder b(seq);
  element_messages(
      b, f, names::kAffinity, keys.size(), false,
      std::string("forget records (") + family_name(f) + ")",
      [&](nlmsghdr* nlh, uint16_t& index, size_t i, size_t end) {
        for (size_t j = i; j < end; ++j) put_element(nlh, ++index, keys[j], 0, {});
      },
      kDestroySetElem);
  return b.finish();
}

Batch build_cleanup_batch(IpFamily f, uint32_t seq) {
  Builder b(seq);
  auto t = table_obj(f);
  auto* nlh = b.header(NFT_MSG_DELTABLE, f, 0, std::string("delete table ") + family_name(f));
  nftnl_table_nlmsg_build_payload(nlh, t.get());
  b.done(nlh);
  return b.finish();
}

}  // namespace endpointd::proxy
