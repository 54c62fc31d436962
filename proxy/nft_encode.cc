// The endpointd tables as nf_tables netlink messages: pure encoding, no socket. Every nftnl
// handle is owned by a unique_ptr; a batch is built as bytes (a value) that proxy/netlink.cc
// sends, and that tests/proxy/nft_encode_test.cc decodes with libnftnl without root. Here: the
// messages for tables, chains, sets, elements and digests, and the incremental batch; a rule's
// expressions are in nft_rules.cc, a full sync's difference from the kernel in nft_full_sync.cc.
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

#include "proxy/nft_builder.h"
#include "proxy/nftnl_util.h"

namespace endpointd::proxy::encode {
namespace {

using namespace nftnl;  // NOLINT: the handle types and family helpers

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

SetPtr set_obj(IpFamily f, const std::string& name) {
  SetPtr s(nftnl_set_alloc());
  nftnl_set_set_str(s.get(), NFTNL_SET_TABLE, kTableName);
  nftnl_set_set_str(s.get(), NFTNL_SET_NAME, name.c_str());
  nftnl_set_set_u32(s.get(), NFTNL_SET_FAMILY, nf_family(f));
  return s;
}

uint32_t g_set_id = 1;

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

std::string digest_key_bytes(uint32_t key) {
  std::string out(4, '\0');
  std::memcpy(out.data(), &key, 4);  // a mark: host byte order
  return out;
}

}  // namespace

// ---- message building ----

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

void add_set(Builder& b, IpFamily f, const Set& s, uint32_t size) {
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

void put_element(nlmsghdr* nlh, uint16_t index, std::string_view key, uint32_t flags,
                 std::string_view key_end, Verdict verdict, std::string_view chain,
                 std::string_view data, std::string_view userdata) {
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

template void elements(Builder& b, IpFamily f, const std::string& set_name, SetShape shape,
                       const std::vector<const Element*>& els, bool adding);
template void elements(Builder& b, IpFamily f, const std::string& set_name, SetShape shape,
                       const std::vector<ElementMap::View>& els, bool adding);

// ---- content digests (see Table's DigestEntry) ----

Set digest_set() {
  Set s;
  s.name = names::kDigests;
  s.shape = SetShape::kDigest;
  return s;
}

std::string comment_udata(const std::string& text) {
  std::string out;
  out.push_back('\0');
  out.push_back(static_cast<char>(text.size() + 1));
  out += text;
  out.push_back('\0');
  return out;
}

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

}  // namespace endpointd::proxy::encode

namespace endpointd::proxy {
namespace {

using namespace encode;  // NOLINT: the builder and the message pieces

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
