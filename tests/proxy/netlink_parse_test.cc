// The kernel's replies as endpointd reads them, from bytes built with libnftnl (no root): the
// chain and set names of endpointd's table, and the ruleset generation. A message without a
// table or a name attribute is skipped (found by reading while fuzzing: it was dereferenced).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/gen.h>
#include <libnftnl/set.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "proxy/netlink.h"
#include "proxy/nftnl_util.h"

namespace endpointd::proxy {
namespace {

// Appends one NFT_MSG_NEWCHAIN message (as a dump answers) with the given attributes.
void add_chain(std::vector<char>& buf, const char* table, const char* name) {
  std::vector<char> msg(4096);
  nlmsghdr* nlh = nftnl_nlmsg_build_hdr(msg.data(), NFT_MSG_NEWCHAIN, NFPROTO_IPV4, NLM_F_MULTI, 0);
  nftnl::ChainPtr c(nftnl_chain_alloc());
  if (table) nftnl_chain_set_str(c.get(), NFTNL_CHAIN_TABLE, table);
  if (name) nftnl_chain_set_str(c.get(), NFTNL_CHAIN_NAME, name);
  nftnl_chain_nlmsg_build_payload(nlh, c.get());
  buf.insert(buf.end(), msg.data(), msg.data() + nlh->nlmsg_len);
}

TEST(NetlinkParse, ChainNamesOfOurTableOnlyAndNoneWithoutAName) {
  std::vector<char> buf;
  add_chain(buf, "endpointd", "services");
  add_chain(buf, "filter", "input");      // another table
  add_chain(buf, "endpointd", nullptr);   // no name
  add_chain(buf, nullptr, "nat-output");  // no table
  add_chain(buf, "endpointd", "nodeports");
  std::vector<std::string> names;
  int ret = parse_dump_names(buf.data(), buf.size(), 0, 0, NFT_MSG_GETCHAIN, names);
  EXPECT_GE(ret, 0);
  EXPECT_EQ(names, (std::vector<std::string>{"services", "nodeports"}));
}

TEST(NetlinkParse, SetWithoutATableIsSkipped) {
  std::vector<char> msg(4096);
  nlmsghdr* nlh = nftnl_nlmsg_build_hdr(msg.data(), NFT_MSG_NEWSET, NFPROTO_IPV4, NLM_F_MULTI, 0);
  nftnl::SetPtr s(nftnl_set_alloc());
  nftnl_set_set_str(s.get(), NFTNL_SET_NAME, "service-ips");
  nftnl_set_nlmsg_build_payload(nlh, s.get());
  std::vector<std::string> names;
  EXPECT_GE(parse_dump_names(msg.data(), nlh->nlmsg_len, 0, 0, NFT_MSG_GETSET, names), 0);
  EXPECT_TRUE(names.empty());
}

// One NFT_MSG_NEWSETELEM message of `set` holding the given key/data pairs (data empty: none).
void add_elements(std::vector<char>& buf, const char* set,
                  const std::vector<std::pair<std::string, std::string>>& elems) {
  std::vector<char> msg(8192);
  nlmsghdr* nlh =
      nftnl_nlmsg_build_hdr(msg.data(), NFT_MSG_NEWSETELEM, NFPROTO_IPV4, NLM_F_MULTI, 0);
  nftnl::SetPtr s(nftnl_set_alloc());
  nftnl_set_set_str(s.get(), NFTNL_SET_TABLE, "endpointd");
  nftnl_set_set_str(s.get(), NFTNL_SET_NAME, set);
  for (const auto& [key, data] : elems) {
    nftnl_set_elem* e = nftnl_set_elem_alloc();
    nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, key.data(), static_cast<uint32_t>(key.size()));
    if (!data.empty())
      nftnl_set_elem_set(e, NFTNL_SET_ELEM_DATA, data.data(), static_cast<uint32_t>(data.size()));
    nftnl_set_elem_add(s.get(), e);
  }
  nftnl_set_elems_nlmsg_build_payload(nlh, s.get());
  buf.insert(buf.end(), msg.data(), msg.data() + nlh->nlmsg_len);
}

TEST(NetlinkParse, SetElementsKeysAndData) {
  std::vector<char> buf;
  std::string k1("\x0a\x00\x00\x01\x0a\x60\x00\x0a", 8), d1("\x0a\xf4\x00\x05\x1f\x90\x00\x00", 8);
  std::string k2("\x0a\x00\x00\x02\x0a\x60\x00\x0a", 8);
  add_elements(buf, "affinity", {{k1, d1}});
  add_elements(buf, "affinity", {{k2, ""}});
  std::vector<KernelElement> got;
  EXPECT_GE(parse_set_elements(buf.data(), buf.size(), 0, 0, got), 0);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].key, k1);
  EXPECT_EQ(got[0].data, d1);
  EXPECT_FALSE(got[0].verdict);
  EXPECT_EQ(got[1].key, k2);
  EXPECT_TRUE(got[1].data.empty());
  // Cut short: nothing read past the bytes, at most the elements that fit.
  got.clear();
  parse_set_elements(buf.data(), buf.size() - 7, 0, 0, got);
  EXPECT_LE(got.size(), 1u);
}

TEST(NetlinkParse, GarbageYieldsNothing) {
  // A first message whose length runs past the buffer ends the loop: nothing is read.
  std::vector<char> junk(64, '\x7f');
  std::vector<std::string> names;
  std::optional<uint32_t> id;
  parse_dump_names(junk.data(), junk.size(), 0, 0, NFT_MSG_GETCHAIN, names);
  parse_generation(junk.data(), junk.size(), 0, 0, id);
  EXPECT_TRUE(names.empty());
  EXPECT_FALSE(id);
}

// Found by fuzz_netlink: a length above 2^31 passed libmnl's signed check and the loop walked
// out of the buffer. Such a buffer is refused before libmnl sees it.
TEST(NetlinkParse, ALengthPastTheBufferIsRefused) {
  std::vector<char> buf;
  add_chain(buf, "endpointd", "services");
  uint32_t huge = 0xffffffcbu;
  std::memcpy(buf.data(), &huge, sizeof huge);
  std::vector<std::string> names;
  EXPECT_LT(parse_dump_names(buf.data(), buf.size(), 0, 0, NFT_MSG_GETCHAIN, names), 0);
  EXPECT_EQ(errno, EBADMSG);
  EXPECT_TRUE(names.empty());
  std::optional<uint32_t> id;
  EXPECT_LT(parse_generation(buf.data(), buf.size(), 0, 0, id), 0);
}

// The ruleset generation, and (found by fuzz_netlink) a generation attribute of the wrong size:
// libnftnl's parser would exit() the process ("kernel ABI is broken"); it is skipped instead.
TEST(NetlinkParse, GenerationAndAnAttributeOfTheWrongShape) {
  auto gen_msg = [](uint16_t attr_len) {
    std::vector<uint32_t> buf(16);  // aligned
    auto* nlh = reinterpret_cast<nlmsghdr*>(buf.data());
    nlh->nlmsg_len = static_cast<uint32_t>(sizeof(nlmsghdr) + 4 + 8);
    nlh->nlmsg_type = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN;
    auto* attr =
        reinterpret_cast<nlattr*>(reinterpret_cast<char*>(buf.data()) + sizeof(nlmsghdr) + 4);
    attr->nla_len = attr_len;
    attr->nla_type = NFTA_GEN_ID;
    uint32_t v = htonl(42);
    std::memcpy(reinterpret_cast<char*>(attr) + 4, &v, 4);
    return buf;
  };
  std::optional<uint32_t> id;
  auto good = gen_msg(8);
  EXPECT_GE(parse_generation(good.data(), sizeof(nlmsghdr) + 12, 0, 0, id), 0);
  EXPECT_EQ(id, 42u);
  id.reset();
  auto bad = gen_msg(7);
  EXPECT_GE(parse_generation(bad.data(), sizeof(nlmsghdr) + 12, 0, 0, id), 0);
  EXPECT_FALSE(id);
}

}  // namespace
}  // namespace endpointd::proxy
