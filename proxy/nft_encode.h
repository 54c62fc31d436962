// The endpointd tables as nf_tables netlink messages: one NFNL_MSG_BATCH_BEGIN..END batch per
// call, built as bytes with no socket, in the expressions nft itself generates for each rule
// shape (see proxy/LAYOUT.md). proxy/netlink.h sends them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proxy/backend.h"

namespace endpointd::proxy {

// A built batch: the bytes sent to the kernel, and what each sequence number carried.
struct Batch {
  std::string bytes;
  uint32_t first_seq = 0;
  std::vector<std::string> what;  // per message after BEGIN, for error messages
};

Batch build_full_sync_batch(const std::vector<const Table*>& tables,
                            const std::vector<std::string>& existing_chains4,
                            const std::vector<std::string>& existing_sets4,
                            const std::vector<std::string>& existing_chains6,
                            const std::vector<std::string>& existing_sets6, uint32_t seq);
Batch build_changes_batch(const std::vector<TableChanges>& changes, uint32_t seq);

// Deletes these records (keys) from the family's affinity map; one that expired meanwhile is
// no error (NFT_MSG_DESTROYSETELEM, Linux 6.3).
Batch build_forget_affinity_batch(IpFamily f, const std::vector<std::string>& keys, uint32_t seq);

// Deletes the family's endpointd table (for --cleanup).
Batch build_cleanup_batch(IpFamily f, uint32_t seq);

}  // namespace endpointd::proxy
