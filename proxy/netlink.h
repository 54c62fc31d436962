// The netlink backend: endpointd's tables programmed through libnftnl + libmnl, one atomic
// NFNL_MSG_BATCH_BEGIN..END batch per call, with per-message acknowledgements. Emits the
// expressions nft itself generates for each rule shape (see proxy/LAYOUT.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/result.h"
#include "proxy/backend.h"

namespace endpointd::proxy {

// A built batch: the bytes sent to the kernel, and what each sequence number carried.
struct Batch {
  std::string bytes;
  uint32_t first_seq = 0;
  std::vector<std::string> what;  // per message after BEGIN, for error messages
};

// Pure builders (no socket): used by the backend and by the golden tests.
Batch build_full_sync_batch(const std::vector<const Table*>& tables,
                            const std::vector<std::string>& existing_chains4,
                            const std::vector<std::string>& existing_sets4,
                            const std::vector<std::string>& existing_chains6,
                            const std::vector<std::string>& existing_sets6, uint32_t seq);
Batch build_changes_batch(const std::vector<TableChanges>& changes, uint32_t seq);

class NetlinkBackend : public Backend {
 public:
  // Opens a netfilter netlink socket in the caller's network namespace.
  static Result<std::unique_ptr<NetlinkBackend>> open();
  ~NetlinkBackend() override;

  Result<BatchStats> full_sync(const std::vector<const Table*>& tables) override;
  Result<BatchStats> apply(const std::vector<TableChanges>& changes) override;
  // Deletes the ip and ip6 endpointd tables (for --cleanup). Missing tables are fine.
  Result<BatchStats> cleanup();
  // The port id of the socket (the monitor ignores notifications caused by it).
  uint32_t port_id() const;

 private:
  struct Socket;
  explicit NetlinkBackend(std::unique_ptr<Socket> s);
  Result<BatchStats> send(const Batch& b);
  Result<std::vector<std::string>> list_names(uint16_t msg_type, IpFamily f);
  std::unique_ptr<Socket> sock_;
  uint32_t seq_ = 1;
};

}  // namespace endpointd::proxy
