// The batch builder and the message pieces the nf_tables encoding shares between its files:
// nft_encode.cc (tables, chains, sets, elements and digests as messages), nft_rules.cc (a rule's
// expressions) and nft_full_sync.cc (a full sync: what differs from the kernel's listing).
// Internal to proxy/.
#pragma once

#include <libmnl/libmnl.h>
#include <libnftnl/common.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/nft_encode.h"
#include "proxy/nftnl_util.h"
#include "proxy/table.h"

namespace endpointd::proxy::encode {

inline uint32_t addr_len(IpFamily f) {
  return f == IpFamily::kV4 ? 4 : 16;
}

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
    return nftnl_nlmsg_build_hdr(scratch_.get(), type, nftnl::nf_family(f), flags | NLM_F_ACK,
                                 seq_++);
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

nftnl::TablePtr table_obj(IpFamily f);
void add_table(Builder& b, IpFamily f);
void add_chain(Builder& b, IpFamily f, const Chain& c);
void del_chain(Builder& b, IpFamily f, const std::string& name);
void flush_chain(Builder& b, IpFamily f, const std::string& name);

// `size`: NFTA_SET_DESC_SIZE (0: none); the affinity map always has kAffinityMapSize.
void add_set(Builder& b, IpFamily f, const Set& s, uint32_t size = 0);
void del_set(Builder& b, IpFamily f, const std::string& name);
void flush_set(Builder& b, IpFamily f, const std::string& name);

// One element's attributes as libnftnl's nftnl_set_elem_nlmsg_build_payload lays them out
// (flags, key, key end, verdict or data), written into the message with libmnl: a full sync
// carries ~10^5 elements, and an nftnl_set_elem per element cost allocations and frees each.
// `chain` (a goto's target) must be followed by a NUL. `userdata`: NFTA_SET_ELEM_USERDATA.
void put_element(nlmsghdr* nlh, uint16_t index, std::string_view key, uint32_t flags,
                 std::string_view key_end, Verdict verdict = Verdict::kNone,
                 std::string_view chain = {}, std::string_view data = {},
                 std::string_view userdata = {});

// `a` becomes the address after it (bytes in network order); false when `a` was the last.
bool next_address(std::string& a);

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

// Elements of one set, in messages of bounded size. T: const Element* or ElementMap::View
// (both instantiated in nft_encode.cc).
template <typename T>
void elements(Builder& b, IpFamily f, const std::string& set_name, SetShape shape,
              const std::vector<T>& els, bool adding);

// The `digests` set (see Table's DigestEntry).
Set digest_set();
// A comment as nft writes it into an element's user data: NFTNL_UDATA_SET_ELEM_COMMENT (0),
// its length with the NUL, the text and a NUL.
std::string comment_udata(const std::string& text);
// Replaces digest entries: `del` keys first, then `add` entries.
void digest_changes(Builder& b, IpFamily f, const std::vector<uint32_t>& del,
                    const std::vector<DigestEntry>& add);

// Appends rule `r` to `chain` in the expressions nft generates for its shape (nft_rules.cc).
void add_rule(Builder& b, IpFamily f, const std::string& chain, const Rule& r);

}  // namespace endpointd::proxy::encode
