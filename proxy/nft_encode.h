// The endpointd tables as nf_tables netlink messages: one NFNL_MSG_BATCH_BEGIN..END batch per
// call, built as bytes with no socket, in the expressions nft itself generates for each rule
// shape (see proxy/LAYOUT.md). proxy/netlink.h sends them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "proxy/backend.h"

namespace endpointd::proxy {

// The size a set has once a batch is committed (0: none, no limit).
struct SetSize {
  IpFamily family = IpFamily::kV4;
  std::string set;
  uint32_t size = 0;
};

// A built batch: the bytes sent to the kernel, and what each sequence number carried.
struct Batch {
  std::string bytes;
  uint32_t first_seq = 0;
  std::vector<std::string> what;  // per message after BEGIN, for error messages
  size_t elements = 0;            // set elements the batch adds or deletes
  // The sizes of the sets the batch makes (a full sync: of every set the tables keep).
  std::vector<SetSize> sizes;
};

// One set element as the kernel lists it (NFT_MSG_GETSETELEM).
struct KernelElement {
  std::string key;
  std::string key_end;             // NFTA_SET_ELEM_KEY_END (concatenated intervals)
  std::string data;                // the value of NFTA_SET_ELEM_DATA, when it is data
  uint32_t flags = 0;              // NFTA_SET_ELEM_FLAGS (NFT_SET_ELEM_INTERVAL_END)
  std::optional<int32_t> verdict;  // NFTA_VERDICT_CODE, when the data is a verdict
  std::string chain;               // NFTA_VERDICT_CHAIN (a goto's target)
  std::string userdata;            // NFTA_SET_ELEM_USERDATA (a comment, as nft writes it)
  friend bool operator==(const KernelElement&, const KernelElement&) = default;
};

// What the kernel holds of one family's endpointd table before a full sync: its chains, its
// sets, and the elements of the sets that were listed.
struct KernelTable {
  std::vector<std::string> chains;
  std::vector<std::string> sets;
  // By set name. A set that is not here was not listed: it is flushed and filled again,
  // unless it is in `unchanged`.
  std::map<std::string, std::vector<KernelElement>> elements;
  // Sets not listed because the kernel's digest entry for them is the table's own: they hold
  // what the table wants, and the full sync leaves them alone.
  std::set<std::string> unchanged;
  // The elements of the `digests` set (empty when the table has none yet).
  std::vector<KernelElement> digests;
  // Each set's size (NFTA_SET_DESC_SIZE; 0 or missing: none). A set the table keeps that
  // outgrows its size (see table.h) is not listed: the full sync makes it anew, larger.
  std::map<std::string, uint32_t> sizes;
};

// Makes the kernel's tables equal to `tables` in one batch, sending only what differs from
// what the kernel holds: a set element already right is neither deleted nor added again (a
// restart over rules in place changes no element). Chains keep their names and get their
// rules anew (a few dozen rules); sets and chains endpointd no longer has are deleted; the
// affinity map's records (the packet path's) are left alone.
Batch build_full_sync_batch(const std::vector<const Table*>& tables, const KernelTable& kernel4,
                            const KernelTable& kernel6, uint32_t seq);
Batch build_changes_batch(const std::vector<TableChanges>& changes, uint32_t seq);

// Deletes these records (keys) from the family's affinity map; one that expired meanwhile is
// no error (NFT_MSG_DESTROYSETELEM, Linux 6.3).
Batch build_forget_affinity_batch(IpFamily f, const std::vector<std::string>& keys, uint32_t seq);

// Deletes the family's endpointd table (for --cleanup).
Batch build_cleanup_batch(IpFamily f, uint32_t seq);

}  // namespace endpointd::proxy
