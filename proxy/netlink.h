// The netlink backend: endpointd's tables programmed through libnftnl + libmnl, one atomic
// NFNL_MSG_BATCH_BEGIN..END batch per call, with per-message acknowledgements. Emits the
// expressions nft itself generates for each rule shape (see proxy/LAYOUT.md).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/result.h"
#include "proxy/backend.h"
#include "proxy/nft_encode.h"

namespace endpointd::proxy {

// The parts of the kernel's replies endpointd reads, as pure functions of the bytes (fuzzed by
// tests/fuzz/fuzz_netlink.cc). Each runs libmnl's message loop over one received buffer and
// returns its result: MNL_CB_OK (more to come), MNL_CB_STOP (done), or -1 with errno set.
// A seq or portid of 0 is not checked.
//   parse_dump_names: the names of endpointd's table's chains (msg_type NFT_MSG_GETCHAIN) or
//                     sets (NFT_MSG_GETSET), appended to `names`; with `sizes`, each set's
//                     size (NFTA_SET_DESC_SIZE, 0 when it has none) appended in step.
//   parse_generation: the ruleset generation (NFT_MSG_GETGEN), into `id`.
int parse_dump_names(const void* buf, size_t len, uint32_t seq, uint32_t portid, uint16_t msg_type,
                     std::vector<std::string>& names, std::vector<uint32_t>* sizes = nullptr);
int parse_generation(const void* buf, size_t len, uint32_t seq, uint32_t portid,
                     std::optional<uint32_t>& id);
//   parse_set_elements: each element (key, key end, data or verdict, flags) in a dump of one
//                       set's elements (NFT_MSG_GETSETELEM), appended to `elements`.
int parse_set_elements(const void* buf, size_t len, uint32_t seq, uint32_t portid,
                       std::vector<KernelElement>& elements);

class NetlinkBackend : public Backend {
 public:
  // Opens a netfilter netlink socket in the caller's network namespace.
  static Result<std::unique_ptr<NetlinkBackend>> open();
  ~NetlinkBackend() override;

  Result<BatchStats> full_sync(const std::vector<const Table*>& tables) override;
  Result<BatchStats> apply(const std::vector<TableChanges>& changes) override;
  bool fits(const std::vector<TableChanges>& changes) const override;
  // Deletes the ip and ip6 endpointd tables (for --cleanup). Missing tables are fine.
  Result<BatchStats> cleanup();
  // The port id of the socket (the monitor ignores notifications caused by it).
  uint32_t port_id() const;
  // The namespace's nf_tables ruleset generation (NFT_MSG_GETGEN): every committed batch,
  // anyone's, moves it by one.
  Result<uint32_t> ruleset_generation();

  // Quiet full syncs: `listen(false)` just before a full sync's batch and `listen(true)` right
  // after it (the Monitor leaves its notification group, so the kernel does not build a
  // notification per element of endpointd's own batch). If the ruleset generation moved by
  // more than that one batch meanwhile, someone else committed while nobody listened:
  // `foreign()` is called (the sink must resync; never call into the sink synchronously: the
  // sink holds its lock around full_sync) and the next full sync keeps listening, so a
  // neighbour committing all the time cannot keep endpointd resyncing. Any thread.
  void set_quiet_full_sync(std::function<bool(bool)> listen, std::function<void()> foreign);
  struct QuietStats {
    uint64_t quiet = 0;    // full syncs that ran without the monitor listening
    uint64_t foreign = 0;  // of which saw someone else's commit in their window
  };
  QuietStats quiet_stats() const;
  // Set dumps taken again because they repeated an element (see list_table).
  uint64_t unsettled_dumps() const { return unsettled_dumps_; }
  // Full syncs compare each set's content digest (Table's DigestEntry) with the kernel's and
  // list only the sets that differ. After someone else changed the ruleset (the monitor saw
  // it, or a quiet full sync's window did) the kernel's sets may no longer be what their
  // digests say: the next full sync lists every set. Any thread.
  void distrust_digests();

 private:
  struct Socket;
  explicit NetlinkBackend(std::unique_ptr<Socket> s);
  Result<BatchStats> send(const Batch& b);
  // Chain or set names; with `sizes`, each set's size in step (0: none).
  Result<std::vector<std::string>> list_names(uint16_t msg_type, IpFamily f,
                                              std::vector<uint32_t>* sizes = nullptr);
  std::map<std::pair<IpFamily, std::string>, long> counts_after(
      const std::vector<TableChanges>& changes) const;
  // The elements of one set of the family's table (none when it has no such set).
  Result<std::vector<KernelElement>> list_elements(IpFamily f, const std::string& set_name);
  // The family's chains and sets, the digests set's entries, and the elements of each set `t`
  // (may be null) keeps whose digest differs from the kernel's (every set unless
  // `trust_digests`). Sets whose dump repeated an element (the kernel resized the set while
  // dumping it) are listed again, up to three times, else left out (flushed and filled again).
  Result<KernelTable> list_table(const Table* t, IpFamily f, bool trust_digests);
  // ClientIP affinity: deletes the records of the family's affinity map whose <vip> . <backend>
  // `stale` says is no longer routed (the map is listed: records are the packet path's).
  Status forget_affinity(IpFamily f, const std::function<bool(std::string_view)>& stale);
  Result<BatchStats> forget_unrouted_affinity(const std::vector<const Table*>& tables,
                                              BatchStats committed);
  std::unique_ptr<Socket> sock_;
  uint32_t seq_ = 1;
  uint64_t unsettled_dumps_ = 0;
  // The kernel's sets as the last committed batch left them: size (0: none) and elements.
  struct Room {
    uint32_t size = 0;
    size_t count = 0;
  };
  std::map<std::pair<IpFamily, std::string>, Room> room_;
  mutable std::mutex quiet_mu_;  // guards the five below
  std::function<bool(bool)> listen_;
  std::function<void()> foreign_;
  bool listen_next_ = false;    // the last quiet window saw a foreign commit: listen this time
  bool distrust_next_ = false;  // list every set in the next full sync
  QuietStats quiet_stats_;
};

}  // namespace endpointd::proxy
