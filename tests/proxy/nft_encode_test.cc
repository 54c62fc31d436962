// The batch encoder, checked without root: every batch the proxy would send is decoded back
// with libmnl (message walk) and libnftnl (each object), and what the kernel would be told is
// asserted: message order and sequence numbers, tables, base chains' hooks and priorities, set
// types, the exact elements added and deleted, and a rule's expressions.
#include "proxy/nft_encode.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/rule.h>
#include <libnftnl/table.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "proxy/nftnl_util.h"
#include "tests/proxy/fixtures.h"
#include "tests/proxy/nl_walk.h"

namespace endpointd::proxy {
namespace {

using namespace testing;  // NOLINT: the fixtures
namespace nl = nftnl;

std::string hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    auto b = static_cast<const unsigned char*>(p)[i];
    out += d[b >> 4];
    out += d[b & 15];
  }
  return out;
}

template <typename F>
void each_nested(const nlattr* a, F f) {
  each_attr(mnl_attr_get_payload(a), mnl_attr_get_payload_len(a), f);
}

struct Elem {
  std::string key, key_end, data, chain;
  int verdict = 0;
  bool has_verdict = false;
  std::string all() const { return key + "|" + key_end + "|" + data; }
};

// One decoded message of a batch.
struct Msg {
  uint16_t type = 0;  // NFT_MSG_* (or NFNL_MSG_BATCH_BEGIN / END)
  uint32_t seq = 0;
  uint16_t family = 0;
  std::string table, name;  // the object's table and name (chain, set, rule's chain)
  // Chains:
  bool base = false;
  uint32_t hook = 0;
  int32_t prio = 0;
  std::string chain_type;
  // Sets:
  uint32_t key_type = 0, set_flags = 0, data_type = 0;
  std::vector<Elem> elems;
  // Rules, as libnftnl prints their expressions.
  std::string rule;
};

std::vector<Msg> decode(const Batch& b) {
  std::vector<Msg> out;
  const auto* nlh = reinterpret_cast<const nlmsghdr*>(b.bytes.data());
  int left = static_cast<int>(b.bytes.size());
  while (mnl_nlmsg_ok(nlh, left)) {
    Msg m;
    m.seq = nlh->nlmsg_seq;
    if (nlh->nlmsg_type == NFNL_MSG_BATCH_BEGIN || nlh->nlmsg_type == NFNL_MSG_BATCH_END) {
      m.type = nlh->nlmsg_type;
    } else {
      EXPECT_EQ(NFNL_SUBSYS_ID(nlh->nlmsg_type), NFNL_SUBSYS_NFTABLES);
      EXPECT_TRUE(nlh->nlmsg_flags & NLM_F_ACK) << "every message is acknowledged";
      m.type = NFNL_MSG_TYPE(nlh->nlmsg_type);
      auto* nfg = static_cast<const nfgenmsg*>(mnl_nlmsg_get_payload(nlh));
      m.family = nfg->nfgen_family;
      switch (m.type) {
        case NFT_MSG_NEWTABLE:
        case NFT_MSG_DELTABLE: {
          nl::TablePtr t(nftnl_table_alloc());
          EXPECT_EQ(nftnl_table_nlmsg_parse(nlh, t.get()), 0);
          m.table = nftnl_table_get_str(t.get(), NFTNL_TABLE_NAME);
          break;
        }
        case NFT_MSG_NEWCHAIN:
        case NFT_MSG_DELCHAIN: {
          nl::ChainPtr c(nftnl_chain_alloc());
          EXPECT_EQ(nftnl_chain_nlmsg_parse(nlh, c.get()), 0);
          m.table = nftnl_chain_get_str(c.get(), NFTNL_CHAIN_TABLE);
          m.name = nftnl_chain_get_str(c.get(), NFTNL_CHAIN_NAME);
          if (nftnl_chain_is_set(c.get(), NFTNL_CHAIN_HOOKNUM)) {
            m.base = true;
            m.hook = nftnl_chain_get_u32(c.get(), NFTNL_CHAIN_HOOKNUM);
            m.prio = nftnl_chain_get_s32(c.get(), NFTNL_CHAIN_PRIO);
            m.chain_type = nftnl_chain_get_str(c.get(), NFTNL_CHAIN_TYPE);
          }
          break;
        }
        case NFT_MSG_NEWSET:
        case NFT_MSG_DELSET:
        case NFT_MSG_NEWSETELEM:
        case NFT_MSG_DELSETELEM: {
          // Sets and elements are read with libmnl: libnftnl 1.2.4's parser aborts on the
          // concatenation description (NFTA_SET_DESC_CONCAT) that nft itself sends, and refuses
          // elements carrying a key end and a verdict.
          const char* body =
              static_cast<const char*>(mnl_nlmsg_get_payload(nlh)) + sizeof(nfgenmsg);
          const size_t body_len = mnl_nlmsg_get_payload_len(nlh) - sizeof(nfgenmsg);
          if (m.type == NFT_MSG_NEWSET || m.type == NFT_MSG_DELSET) {
            each_attr(body, body_len, [&](const nlattr* a) {
              switch (mnl_attr_get_type(a)) {
                case NFTA_SET_TABLE:
                  m.table = mnl_attr_get_str(a);
                  break;
                case NFTA_SET_NAME:
                  m.name = mnl_attr_get_str(a);
                  break;
                case NFTA_SET_FLAGS:
                  m.set_flags = ntohl(mnl_attr_get_u32(a));
                  break;
                case NFTA_SET_KEY_TYPE:
                  m.key_type = ntohl(mnl_attr_get_u32(a));
                  break;
                case NFTA_SET_DATA_TYPE:
                  m.data_type = ntohl(mnl_attr_get_u32(a));
                  break;
                default:
                  break;
              }
            });
            break;
          }
          each_attr(body, body_len, [&](const nlattr* a) {
            switch (mnl_attr_get_type(a)) {
              case NFTA_SET_ELEM_LIST_TABLE:
                m.table = mnl_attr_get_str(a);
                break;
              case NFTA_SET_ELEM_LIST_SET:
                m.name = mnl_attr_get_str(a);
                break;
              case NFTA_SET_ELEM_LIST_ELEMENTS:
                each_nested(a, [&](const nlattr* el) {
                  Elem e;
                  each_nested(el, [&](const nlattr* f) {
                    if (mnl_attr_get_type(f) == NFTA_SET_ELEM_FLAGS) return;
                    each_nested(f, [&](const nlattr* v) {
                      if (mnl_attr_get_type(v) == NFTA_DATA_VALUE) {
                        std::string h = hex(mnl_attr_get_payload(v), mnl_attr_get_payload_len(v));
                        if (mnl_attr_get_type(f) == NFTA_SET_ELEM_KEY) e.key = h;
                        if (mnl_attr_get_type(f) == NFTA_SET_ELEM_KEY_END) e.key_end = h;
                        if (mnl_attr_get_type(f) == NFTA_SET_ELEM_DATA) e.data = h;
                      } else if (mnl_attr_get_type(v) == NFTA_DATA_VERDICT) {
                        each_nested(v, [&](const nlattr* vv) {
                          if (mnl_attr_get_type(vv) == NFTA_VERDICT_CODE) {
                            e.has_verdict = true;
                            e.verdict = static_cast<int>(ntohl(mnl_attr_get_u32(vv)));
                          } else if (mnl_attr_get_type(vv) == NFTA_VERDICT_CHAIN) {
                            e.chain = mnl_attr_get_str(vv);
                          }
                        });
                      }
                    });
                  });
                  m.elems.push_back(std::move(e));
                });
                break;
              default:
                break;
            }
          });
          break;
        }
        case NFT_MSG_NEWRULE:
        case NFT_MSG_DELRULE: {
          nl::RulePtr r(nftnl_rule_alloc());
          EXPECT_EQ(nftnl_rule_nlmsg_parse(nlh, r.get()), 0);
          m.table = nftnl_rule_get_str(r.get(), NFTNL_RULE_TABLE);
          m.name = nftnl_rule_get_str(r.get(), NFTNL_RULE_CHAIN);
          char buf[4096];
          nftnl_rule_snprintf(buf, sizeof(buf), r.get(), NFTNL_OUTPUT_DEFAULT, 0);
          m.rule = buf;
          break;
        }
        default:
          ADD_FAILURE() << "unexpected message type " << m.type;
      }
    }
    out.push_back(std::move(m));
    nlh = mnl_nlmsg_next(nlh, &left);
  }
  EXPECT_EQ(left, 0) << "trailing bytes after the last message";
  return out;
}

// The message framing every batch must have.
void expect_framed(const Batch& b, const std::vector<Msg>& ms, uint32_t seq) {
  ASSERT_GE(ms.size(), 2u);
  EXPECT_EQ(ms.front().type, NFNL_MSG_BATCH_BEGIN);
  EXPECT_EQ(ms.back().type, NFNL_MSG_BATCH_END);
  for (size_t i = 0; i < ms.size(); ++i) EXPECT_EQ(ms[i].seq, seq + i) << "message " << i;
  for (size_t i = 1; i + 1 < ms.size(); ++i) {
    EXPECT_NE(ms[i].type, NFNL_MSG_BATCH_BEGIN);
    EXPECT_NE(ms[i].type, NFNL_MSG_BATCH_END);
  }
  EXPECT_EQ(b.first_seq, seq + 1);
  EXPECT_EQ(b.what.size(), ms.size() - 2) << "one description per acknowledged message";
}

// Elements of messages of `type` that carry `bytes` (hex) in a key, key end or data.
size_t count_elems(const std::vector<Msg>& ms, uint16_t type, const std::string& bytes) {
  size_t n = 0;
  for (const auto& m : ms)
    if (m.type == type)
      for (const auto& e : m.elems)
        if (e.all().find(bytes) != std::string::npos) ++n;
  return n;
}
const Msg* find(const std::vector<Msg>& ms, uint16_t type, const std::string& name,
                uint16_t family = NFPROTO_IPV4) {
  for (const auto& m : ms)
    if (m.type == type && m.name == name && m.family == family) return &m;
  return nullptr;
}

// Addresses as the kernel sees them in keys and data.
const std::string kWebVip = "0a60000a";                           // 10.96.0.10
const std::string kWebVip6 = "fd960000000000000000000000000010";  // fd96::10
const std::string kWeb2 = "0af40102";                             // 10.244.1.2
const std::string kWeb3 = "0af40103";                             // 10.244.1.3
const std::string kNew = "0af40109";                              // 10.244.1.9
const std::string kDnsVip = "0a60000c";                           // 10.96.0.12
const std::string kPort8080 = "1f90";                             // 8080, network order

class Encode : public ::testing::Test {
 protected:
  Planner planner{node_context()};
  model::SnapshotPtr base = every_shape(1);
  std::vector<const Table*> tables() {
    std::vector<const Table*> ts;
    for (IpFamily f : planner.families()) ts.push_back(&planner.table(f));
    return ts;
  }
  // The state with web's endpoints replaced.
  model::SnapshotPtr with_web(uint64_t g, std::vector<model::MergedEndpoint> eps, bool drop) {
    std::vector<model::ServiceStatePtr> v;
    for (const auto& st : base->services) {
      if (st->service.key.name != "web")
        v.push_back(st);
      else if (!drop)
        v.push_back(state(st->service, eps));
    }
    return snapshot(g, std::move(v));
  }
  std::vector<Msg> change_to(const model::SnapshotPtr& next, uint32_t seq) {
    auto delta = model::diff(base.get(), *next);
    auto changes = planner.update(*next, delta);
    Batch b = build_changes_batch(changes, seq);
    auto ms = decode(b);
    expect_framed(b, ms, seq);
    // The batch counts the elements it carries (the sink's elements-written metric).
    size_t carried = 0;
    for (const auto& m : ms) {
      if (m.type == NFT_MSG_NEWSETELEM || m.type == NFT_MSG_DELSETELEM) carried += m.elems.size();
    }
    size_t planned = 0;
    for (const auto& c : changes) planned += c.add_elements.size() + c.del_elements.size();
    EXPECT_EQ(b.elements, planned);
    EXPECT_LE(planned, carried);  // an interval is two kernel elements, one planned
    // Every set whose elements change has its content digest replaced in the same batch, as
    // the table has it now: the old entry deleted by key, the new one added with its comment.
    for (const auto& c : changes) {
      std::set<std::string> touched;
      for (const auto& [set, _] : c.add_elements) touched.insert(set);
      for (const auto& [set, _] : c.del_elements) touched.insert(set);
      std::set<uint32_t> added;
      for (const auto& e : c.add_digests) added.insert(e.key);
      for (const auto& set : touched) {
        auto want = digest_entry(planner.table(c.family).sets.at(set));
        if (!want) continue;
        EXPECT_EQ(std::count(c.del_digests.begin(), c.del_digests.end(), want->key), 1) << set;
        EXPECT_EQ(std::count(c.add_digests.begin(), c.add_digests.end(), *want), 1) << set;
      }
      EXPECT_EQ(added.size(), c.add_digests.size());
      size_t sent = 0, deleted = 0;
      uint16_t fam = c.family == IpFamily::kV4 ? NFPROTO_IPV4 : NFPROTO_IPV6;
      for (const auto& m : ms) {
        if (m.name != "digests" || m.family != fam) continue;
        if (m.type == NFT_MSG_NEWSETELEM) sent += m.elems.size();
        if (m.type == NFT_MSG_DELSETELEM) deleted += m.elems.size();
      }
      EXPECT_EQ(sent, c.add_digests.size());
      EXPECT_EQ(deleted, c.del_digests.size());
    }
    return ms;
  }
};

TEST_F(Encode, FullSync) {
  planner.reset(*base);
  Batch b = build_full_sync_batch(tables(), {}, {}, 100);
  auto ms = decode(b);
  expect_framed(b, ms, 100);

  // Both families' tables, named endpointd.
  int tables_added = 0;
  for (const auto& m : ms)
    if (m.type == NFT_MSG_NEWTABLE) {
      EXPECT_EQ(m.table, "endpointd");
      ++tables_added;
    }
  EXPECT_EQ(tables_added, 2);

  // Base chains with kube-proxy's hooks and priorities.
  const Msg* pre = find(ms, NFT_MSG_NEWCHAIN, "nat-prerouting");
  ASSERT_NE(pre, nullptr);
  EXPECT_TRUE(pre->base);
  EXPECT_EQ(pre->hook, static_cast<uint32_t>(NF_INET_PRE_ROUTING));
  EXPECT_EQ(pre->prio, -100);
  EXPECT_EQ(pre->chain_type, "nat");
  const Msg* post = find(ms, NFT_MSG_NEWCHAIN, "nat-postrouting");
  ASSERT_NE(post, nullptr);
  EXPECT_EQ(post->hook, static_cast<uint32_t>(NF_INET_POST_ROUTING));
  EXPECT_EQ(post->prio, 100);
  const Msg* fpre = find(ms, NFT_MSG_NEWCHAIN, "filter-prerouting", NFPROTO_IPV6);
  ASSERT_NE(fpre, nullptr);
  EXPECT_EQ(fpre->prio, -110);
  EXPECT_EQ(fpre->chain_type, "filter");
  const Msg* services = find(ms, NFT_MSG_NEWCHAIN, "services");
  ASSERT_NE(services, nullptr);
  EXPECT_FALSE(services->base);

  // service-ips: a verdict map keyed by address . protocol . port.
  const Msg* sips = find(ms, NFT_MSG_NEWSET, "service-ips");
  ASSERT_NE(sips, nullptr);
  EXPECT_TRUE(sips->set_flags & NFT_SET_MAP);
  EXPECT_EQ(sips->data_type, static_cast<uint32_t>(NFT_DATA_VERDICT));
  EXPECT_EQ(sips->key_type, (7u << 12) | (12u << 6) | 13u)
      << "ipv4_addr . inet_proto . inet_service";

  // web's cluster IP in both families goes to a chain; its endpoints are in a backends map.
  bool vip_found = false;
  for (const auto& m : ms)
    if (m.type == NFT_MSG_NEWSETELEM && m.name == "service-ips")
      for (const auto& e : m.elems)
        if (e.key.rfind(kWebVip, 0) == 0) {
          vip_found = true;
          EXPECT_TRUE(e.has_verdict);
          EXPECT_EQ(e.verdict, NFT_GOTO);
          EXPECT_EQ(e.chain, "svc-internal");
        }
  EXPECT_TRUE(vip_found);
  EXPECT_GE(count_elems(ms, NFT_MSG_NEWSETELEM, kWebVip6), 1u);
  EXPECT_GE(count_elems(ms, NFT_MSG_NEWSETELEM, kWeb2 + kPort8080), 1u);
  EXPECT_GE(count_elems(ms, NFT_MSG_NEWSETELEM, kWeb3 + kPort8080), 1u);
  // Nothing is deleted on a first sync into an empty namespace.
  for (const auto& m : ms) {
    EXPECT_NE(m.type, NFT_MSG_DELSETELEM);
    EXPECT_NE(m.type, NFT_MSG_DELCHAIN);
  }

  // The services chain's rule: destination address . l4proto . dport looked up in the vmap.
  std::string rule;
  for (const auto& m : ms)
    if (m.type == NFT_MSG_NEWRULE && m.name == "services" && m.family == NFPROTO_IPV4)
      rule = m.rule;
  EXPECT_NE(rule.find("[ payload load 4b @ network header + 16 => reg 1 ]"), std::string::npos)
      << rule;
  EXPECT_NE(rule.find("[ lookup reg 1 set service-ips dreg 0"), std::string::npos) << rule;
}

TEST_F(Encode, FullSyncOverAnOlderRulesetFlushesAndDeletesWhatIsGone) {
  planner.reset(*base);
  Batch b = build_full_sync_batch(
      tables(), {{"services", "stale-chain"}, {"stale-set"}, {}, {}, {}, {}}, {}, 1);
  auto ms = decode(b);
  expect_framed(b, ms, 1);
  EXPECT_NE(find(ms, NFT_MSG_DELCHAIN, "stale-chain"), nullptr);
  EXPECT_NE(find(ms, NFT_MSG_DELSET, "stale-set"), nullptr);
  EXPECT_EQ(find(ms, NFT_MSG_DELCHAIN, "services"), nullptr) << "a chain still in use is kept";
}

// A set the backend found unchanged by its digest gets no element message; the digests set is
// created and holds one entry per set with a key, commented with the set's content; a kernel
// entry that differs is replaced, one the table no longer has is deleted.
TEST_F(Encode, FullSyncLeavesSetsWithTheSameDigestAlone) {
  planner.reset(*base);
  const Table& t4 = planner.table(IpFamily::kV4);
  auto entries = digest_entries(t4);
  ASSERT_GT(entries.size(), 5u);
  for (const auto& e : entries) {
    EXPECT_EQ(e.comment.rfind("v1 ", 0), 0u) << e.comment;
  }
  KernelTable k4;
  for (const auto& [name, c] : t4.chains) k4.chains.push_back(name);
  for (const auto& [name, set] : t4.sets) {
    k4.sets.push_back(name);
    if (digest_key(name)) k4.unchanged.insert(name);
  }
  k4.sets.push_back("digests");
  // The kernel's entries: the first as the table has it, the second stale, and one for a set
  // that is gone (key 0x01000063: backends-99).
  auto udata = [](const std::string& text) {
    return std::string(1, '\0') + static_cast<char>(text.size() + 1) + text + std::string(1, '\0');
  };
  auto key_bytes = [](uint32_t key) {
    std::string k(4, '\0');
    std::memcpy(k.data(), &key, 4);
    return k;
  };
  KernelElement same, stale, gone;
  same.key = key_bytes(entries[0].key);
  same.userdata = udata(entries[0].comment);
  stale.key = key_bytes(entries[1].key);
  stale.userdata = udata(entries[1].comment + "0");
  gone.key = key_bytes((1u << 24) | 99);
  gone.userdata = udata("v1 backends-99 3 0000000000000001");
  k4.digests = {same, stale, gone};
  Batch b = build_full_sync_batch({&t4}, k4, {}, 3);
  auto ms = decode(b);
  expect_framed(b, ms, 3);
  for (const auto& name : k4.unchanged) {
    EXPECT_EQ(find(ms, NFT_MSG_NEWSETELEM, name), nullptr) << name;
    EXPECT_EQ(find(ms, NFT_MSG_DELSETELEM, name), nullptr) << name;
  }
  const Msg* created = find(ms, NFT_MSG_NEWSET, "digests");
  ASSERT_NE(created, nullptr);
  EXPECT_EQ(created->key_type, 19u);  // mark
  const Msg* del = find(ms, NFT_MSG_DELSETELEM, "digests");
  ASSERT_NE(del, nullptr);
  EXPECT_EQ(del->elems.size(), 2u);  // the stale entry and the gone set's
  const Msg* add = find(ms, NFT_MSG_NEWSETELEM, "digests");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->elems.size(), entries.size() - 1);  // all but the one already right
  EXPECT_EQ(find(ms, NFT_MSG_DELSET, "digests"), nullptr);
}

// Different set names have different digest keys; names endpointd does not make have none.
TEST(DigestKeys, OnePerNameEndpointdMakes) {
  std::set<uint32_t> keys;
  std::vector<std::string> made = {
      "cluster-ips",        "hairpin",          "firewall-ips", "firewall-allow",
      "no-endpoint-reject", "no-endpoint-drop", "service-ips",  "service-lb"};
  for (uint32_t n : {1u, 2u, 10u, 16777215u}) {
    made.push_back(names::backends(n));
    made.push_back(names::local_backends(n));
    made.push_back(names::affinity_backends(n));
  }
  for (const auto& name : made) {
    auto k = digest_key(name);
    ASSERT_TRUE(k) << name;
    keys.insert(*k);
  }
  EXPECT_EQ(keys.size(), made.size());
  for (const char* other : {"cluster-cidrs", "service-cidrs", "affinity", "digests", "backends-",
                            "backends-010", "backends-16777216", "backends-x", "stranger"}) {
    EXPECT_FALSE(digest_key(other)) << other;
  }
}

// The digest of a set is its elements', in any order, and follows puts and erases.
TEST(DigestKeys, ContentDigestFollowsTheElements) {
  auto el = [](char k, char d) {
    Element e;
    e.key = std::string(8, k);
    e.data = std::string(8, d);
    return e;
  };
  ElementMap a, b;
  ASSERT_TRUE(a.put(el('a', '1')).ok());
  ASSERT_TRUE(a.put(el('b', '2')).ok());
  ASSERT_TRUE(b.put(el('b', '2')).ok());
  ASSERT_TRUE(b.put(el('a', '1')).ok());
  EXPECT_EQ(a.digest(), b.digest());
  ASSERT_TRUE(b.put(el('a', '3')).ok());  // replaced
  EXPECT_NE(a.digest(), b.digest());
  ASSERT_TRUE(b.put(el('a', '1')).ok());
  EXPECT_EQ(a.digest(), b.digest());
  b.erase(std::string(8, 'b'));
  EXPECT_NE(a.digest(), b.digest());
  a.erase(std::string(8, 'b'));
  EXPECT_EQ(a.digest(), b.digest());
  a.erase(std::string(8, 'a'));
  EXPECT_EQ(a.digest(), 0u);
}

// A full sync over a listing sends only the difference: a listed set that holds what the table
// has gets no message; a key the dump repeated is still kept (never deleted); someone else's
// element is deleted; an element with other data is replaced; a set that was not listed is
// flushed and filled.
TEST_F(Encode, FullSyncSendsOnlyTheDifferenceFromTheListing) {
  planner.reset(*base);
  const Table& t4 = planner.table(IpFamily::kV4);
  KernelTable k4;
  for (const auto& [name, c] : t4.chains) k4.chains.push_back(name);
  for (const auto& [name, set] : t4.sets) k4.sets.push_back(name);
  auto listed = [](const Set& set) {
    std::vector<KernelElement> out;
    for (const auto& e : set.elements) {
      KernelElement k;
      k.key = e.key;
      k.key_end = e.key_end;
      k.data = e.data;
      if (e.verdict == Verdict::kGoto) {
        k.verdict = NFT_GOTO;
        k.chain = e.chain;
      }
      if (e.verdict == Verdict::kDrop) k.verdict = NF_DROP;
      out.push_back(std::move(k));
    }
    return out;
  };
  // service-ips as the table has it, with its first element listed twice.
  auto ips = listed(t4.sets.at("service-ips"));
  ASSERT_GE(ips.size(), 2u);
  ips.push_back(ips.front());
  k4.elements["service-ips"] = ips;
  // service-lb with a stranger and one element pointing elsewhere.
  auto lb = listed(t4.sets.at("service-lb"));
  ASSERT_GE(lb.size(), 2u);
  KernelElement stranger = lb.front();
  stranger.key[0] = static_cast<char>(0x7f);
  lb.push_back(stranger);
  lb[1].chain = "somewhere-else";
  k4.elements["service-lb"] = lb;
  // Every other set listed as it is, except hairpin (not listed).
  for (const auto& [name, set] : t4.sets) {
    if (name != "service-ips" && name != "service-lb" && name != "hairpin" &&
        set.shape != SetShape::kAffinity && set.shape != SetShape::kAddrInterval)
      k4.elements[name] = listed(set);
  }
  Batch b = build_full_sync_batch({&t4}, k4, {}, 7);
  auto ms = decode(b);
  expect_framed(b, ms, 7);
  EXPECT_EQ(find(ms, NFT_MSG_DELSETELEM, "service-ips"), nullptr) << "a repeated key is kept";
  EXPECT_EQ(find(ms, NFT_MSG_NEWSETELEM, "service-ips"), nullptr);
  const Msg* del = find(ms, NFT_MSG_DELSETELEM, "service-lb");
  ASSERT_NE(del, nullptr);
  ASSERT_EQ(del->elems.size(), 2u);  // the stranger, and the one pointing elsewhere
  const Msg* add = find(ms, NFT_MSG_NEWSETELEM, "service-lb");
  ASSERT_NE(add, nullptr);
  ASSERT_EQ(add->elems.size(), 1u);
  std::string hex;  // the decoder prints bytes in hex
  for (unsigned char c : lb[1].key) {
    hex += "0123456789abcdef"[c >> 4];
    hex += "0123456789abcdef"[c & 15];
  }
  EXPECT_EQ(add->elems[0].key, hex);
  // Not listed (hairpin, and here the plain interval sets): flushed and filled whole.
  size_t whole = 0;
  for (const auto& [name, set] : t4.sets) {
    if (name == "hairpin" || set.shape == SetShape::kAddrInterval) whole += set.elements.size();
  }
  EXPECT_NE(find(ms, NFT_MSG_DELSETELEM, "hairpin"), nullptr) << "not listed: flushed";
  EXPECT_EQ(b.elements, 3 + whole);
  for (const auto& [name, set] : t4.sets) {
    if (k4.elements.count(name) && name != "service-lb") {
      EXPECT_EQ(find(ms, NFT_MSG_NEWSETELEM, name), nullptr) << name;
    }
  }
}

// ClientIP affinity (every_shape's dns, default timeout): a dynamic map the packet path
// fills, a lookup of it before balancing, and a record rule after DNAT.
TEST_F(Encode, AffinityMapAndRules) {
  planner.reset(*base);
  auto ms = decode(build_full_sync_batch(tables(), {}, {}, 5));
  const Msg* map = find(ms, NFT_MSG_NEWSET, "affinity");
  ASSERT_NE(map, nullptr);
  EXPECT_EQ(map->set_flags, static_cast<uint32_t>(NFT_SET_MAP | NFT_SET_TIMEOUT | NFT_SET_EVAL));
  EXPECT_EQ(map->key_type, (7u << 18) | (7u << 12) | (12u << 6) | 13u)
      << "ipv4_addr . ipv4_addr . inet_proto . inet_service";
  EXPECT_NE(find(ms, NFT_MSG_NEWSET, "affinity-backends-10800"), nullptr);
  std::string stick, record;
  for (const auto& m : ms) {
    if (m.type != NFT_MSG_NEWRULE || m.family != NFPROTO_IPV4) continue;
    if (m.name == "lb-affinity") stick += m.rule;
    if (m.name == "affinity-record") record += m.rule;
  }
  EXPECT_NE(stick.find("[ lookup reg 1 set affinity dreg 1 ]"), std::string::npos) << stick;
  EXPECT_NE(stick.find("goto -> lb"), std::string::npos) << stick;
  EXPECT_NE(record.find("[ ct load dst_ip => reg 1 , dir original ]"), std::string::npos) << record;
  EXPECT_NE(record.find("[ lookup reg 1 set affinity-backends-10800 ]"), std::string::npos)
      << record;
  EXPECT_NE(record.find("[ dynset update reg_key 1 set affinity sreg_data 2 timeout 10800000ms ]"),
            std::string::npos)
      << record;
  // A full sync over a ruleset that has the map keeps its records (no flush of it), while the
  // backend maps are flushed and filled again.
  ms = decode(
      build_full_sync_batch(tables(), {{}, {"affinity", "backends-3"}, {}, {}, {}, {}}, {}, 9));
  EXPECT_EQ(find(ms, NFT_MSG_DELSETELEM, "affinity"), nullptr);
  EXPECT_NE(find(ms, NFT_MSG_DELSETELEM, "backends-3"), nullptr);
}

// Node-local DNS: the two raw-priority base chains and their notrack rules, in the expressions
// nft writes for `ip daddr 169.254.20.10 udp dport 53 notrack` (netlink_test compares with nft).
TEST_F(Encode, NodeLocalDnsNotrackChains) {
  NodeContext c = node_context();
  c.dns_node_local = ip("169.254.20.10");
  c.dns_node_local_port = 53;
  Planner p(c);
  p.reset(*base);
  std::vector<const Table*> ts;
  for (IpFamily f : p.families()) ts.push_back(&p.table(f));
  auto ms = decode(build_full_sync_batch(ts, {}, {}, 7));
  const Msg* pre = find(ms, NFT_MSG_NEWCHAIN, "dns-notrack-prerouting");
  const Msg* out = find(ms, NFT_MSG_NEWCHAIN, "dns-notrack-output");
  ASSERT_NE(pre, nullptr);
  ASSERT_NE(out, nullptr);
  EXPECT_TRUE(pre->base);
  EXPECT_EQ(pre->hook, static_cast<uint32_t>(NF_INET_PRE_ROUTING));
  EXPECT_EQ(out->hook, static_cast<uint32_t>(NF_INET_LOCAL_OUT));
  EXPECT_EQ(pre->prio, -300);
  EXPECT_EQ(out->prio, -300);
  EXPECT_EQ(pre->chain_type, "filter");
  EXPECT_EQ(find(ms, NFT_MSG_NEWCHAIN, "dns-notrack-output", NFPROTO_IPV6), nullptr);
  std::vector<std::string> pre_rules, out_rules;
  for (const auto& m : ms) {
    if (m.type != NFT_MSG_NEWRULE || m.family != NFPROTO_IPV4) continue;
    if (m.name == "dns-notrack-prerouting") pre_rules.push_back(m.rule);
    if (m.name == "dns-notrack-output") out_rules.push_back(m.rule);
  }
  ASSERT_EQ(pre_rules.size(), 2u);
  ASSERT_EQ(out_rules.size(), 4u);
  const std::string& q = pre_rules[0];  // ip daddr 169.254.20.10 udp dport 53 notrack
  for (const char* expr :
       {"[ payload load 4b @ network header + 16 => reg 1 ]", "[ cmp eq reg 1 0x0a14fea9 ]",
        "[ meta load l4proto => reg 1 ]", "[ cmp eq reg 1 0x00000011 ]",
        "[ payload load 2b @ transport header + 2 => reg 1 ]", "[ cmp eq reg 1 0x00003500 ]",
        "[ notrack ]"})
    EXPECT_NE(q.find(expr), std::string::npos) << expr << " in " << q;
  EXPECT_NE(pre_rules[1].find("[ cmp eq reg 1 0x00000006 ]"), std::string::npos) << pre_rules[1];
  // The answers: saddr (offset 12) and the source port (transport header + 0).
  const std::string& a = out_rules[2];  // ip saddr 169.254.20.10 udp sport 53 notrack
  EXPECT_NE(a.find("[ payload load 4b @ network header + 12 => reg 1 ]"), std::string::npos) << a;
  EXPECT_NE(a.find("[ payload load 2b @ transport header + 0 => reg 1 ]"), std::string::npos) << a;
  // Without the option, a full sync over a table that has the chains deletes them.
  KernelTable k4;
  k4.chains = {"dns-notrack-prerouting", "dns-notrack-output"};
  planner.reset(*base);
  ms = decode(build_full_sync_batch(tables(), k4, {}, 9));
  EXPECT_NE(find(ms, NFT_MSG_DELCHAIN, "dns-notrack-prerouting"), nullptr);
  EXPECT_NE(find(ms, NFT_MSG_DELCHAIN, "dns-notrack-output"), nullptr);
}

// Forgetting records: one NFT_MSG_DESTROYSETELEM (no error for one that expired meanwhile)
// per 512 keys, on the family's affinity map.
TEST_F(Encode, ForgetAffinityRecords) {
  std::vector<std::string> keys;
  for (int i = 0; i < 600; ++i) keys.push_back(std::string(15, 'k') + static_cast<char>(i % 256));
  Batch b = build_forget_affinity_batch(IpFamily::kV4, keys, 3);
  const auto* nlh = reinterpret_cast<const nlmsghdr*>(b.bytes.data());
  int left = static_cast<int>(b.bytes.size());
  std::vector<uint16_t> types;
  for (; mnl_nlmsg_ok(nlh, left); nlh = mnl_nlmsg_next(nlh, &left))
    types.push_back(nlh->nlmsg_type);
  ASSERT_EQ(types.size(), 4u);  // begin, 512, 88, end
  EXPECT_EQ(types[1], (NFNL_SUBSYS_NFTABLES << 8) | 30);
  EXPECT_EQ(types[2], (NFNL_SUBSYS_NFTABLES << 8) | 30);
  EXPECT_EQ(b.what.size(), 2u);
}

TEST_F(Encode, EndpointAdded) {
  planner.reset(*base);
  auto next =
      with_web(2,
               {endpoint("10.244.1.2", 8080), endpoint("10.244.1.3", 8080),
                endpoint("10.244.1.9", 8080), endpoint("fd44::2", 8080), endpoint("fd44::3", 8080)},
               false);
  auto ms = change_to(next, 500);
  EXPECT_GE(count_elems(ms, NFT_MSG_NEWSETELEM, kNew + kPort8080), 1u);
  EXPECT_EQ(count_elems(ms, NFT_MSG_DELSETELEM, kNew), 0u);
  // Nothing of another service is touched, and no table or chain is rebuilt.
  EXPECT_EQ(count_elems(ms, NFT_MSG_NEWSETELEM, kDnsVip), 0u);
  EXPECT_EQ(count_elems(ms, NFT_MSG_DELSETELEM, kDnsVip), 0u);
  for (const auto& m : ms) {
    EXPECT_NE(m.type, NFT_MSG_NEWTABLE);
    EXPECT_NE(m.type, NFT_MSG_DELTABLE);
  }
}

TEST_F(Encode, EndpointRemoved) {
  planner.reset(*base);
  auto next = with_web(
      2, {endpoint("10.244.1.2", 8080), endpoint("fd44::2", 8080), endpoint("fd44::3", 8080)},
      false);
  auto ms = change_to(next, 7);
  // web's two-endpoint entries leave the backends map for two (a delete carries only the key:
  // vip . protocol . port . index), and the endpoint that stays is added to the map for one.
  size_t deleted = 0;
  for (const auto& m : ms)
    if (m.type == NFT_MSG_DELSETELEM && m.name == "backends-2")
      for (const auto& e : m.elems)
        if (e.key.rfind(kWebVip, 0) == 0) ++deleted;
  EXPECT_EQ(deleted, 2u);
  size_t added = 0;
  for (const auto& m : ms)
    if (m.type == NFT_MSG_NEWSETELEM && m.name == "backends-1")
      for (const auto& e : m.elems)
        if (e.key.rfind(kWebVip, 0) == 0) {
          ++added;
          EXPECT_EQ(e.data.rfind(kWeb2 + kPort8080, 0), 0u) << e.data;
        }
  EXPECT_EQ(added, 1u);
  EXPECT_EQ(count_elems(ms, NFT_MSG_NEWSETELEM, kWeb3), 0u);
  EXPECT_EQ(count_elems(ms, NFT_MSG_DELSETELEM, kDnsVip), 0u);
}

TEST_F(Encode, ServiceDeleted) {
  planner.reset(*base);
  auto ms = change_to(with_web(2, {}, true), 42);
  // Its cluster IPs leave service-ips in both families, its endpoints leave every map.
  EXPECT_GE(count_elems(ms, NFT_MSG_DELSETELEM, kWebVip), 1u);
  EXPECT_GE(count_elems(ms, NFT_MSG_DELSETELEM, kWebVip6), 1u);
  EXPECT_EQ(count_elems(ms, NFT_MSG_NEWSETELEM, kWebVip), 0u);
  EXPECT_EQ(count_elems(ms, NFT_MSG_NEWSETELEM, kWeb2), 0u);
  EXPECT_EQ(count_elems(ms, NFT_MSG_NEWSETELEM, kWeb3), 0u);
  EXPECT_EQ(count_elems(ms, NFT_MSG_DELSETELEM, kDnsVip), 0u);
}

TEST_F(Encode, Cleanup) {
  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    Batch b = build_cleanup_batch(f, 9);
    auto ms = decode(b);
    expect_framed(b, ms, 9);
    ASSERT_EQ(ms.size(), 3u);
    EXPECT_EQ(ms[1].type, NFT_MSG_DELTABLE);
    EXPECT_EQ(ms[1].table, "endpointd");
    EXPECT_EQ(ms[1].family, f == IpFamily::kV4 ? NFPROTO_IPV4 : NFPROTO_IPV6);
  }
}

}  // namespace
}  // namespace endpointd::proxy
