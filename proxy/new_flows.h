// New connections to chosen addresses, as the kernel's connection tracking announces them:
// ctnetlink NEW events (libnetfilter_conntrack), filtered in the kernel to the addresses asked
// for (a socket filter on the event socket), so a busy node pays only for those. The first
// piece of observed removal (issue 47): a terminating pod's node sees every new connection
// that reaches the pod, whoever sent it; drain/late.h names the senders (the daemon hands the
// watch to the coordinator as drain::NewFlows, daemon/conntrack_flows.h).
//
// Acts on the network namespace of the thread that opens it. Bounded: events beyond
// `queue_max` not yet taken, and events the kernel could not deliver (the socket's buffer
// overran), are dropped and counted — the reader never stalls the kernel or itself.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "model/ip.h"
#include "model/result.h"

struct nfct_handle;
struct nf_conntrack;

namespace endpointd::proxy {

struct NewFlow {
  uint8_t l4proto = 0;  // IPPROTO_TCP, IPPROTO_UDP, …
  model::IpAddr src, dst;
  uint16_t dst_port = 0;
  std::chrono::steady_clock::time_point at{};
};

class NewFlowWatch {
 public:
  // At most this many addresses of a family are filtered in the kernel; beyond, events for
  // every address of that family reach the reader and are filtered there (counted).
  static constexpr size_t kKernelFilterMax = 100;

  // Opens the event socket and starts the reader (an error when ctnetlink is not there or
  // not permitted: no CAP_NET_ADMIN, a kernel without conntrack events).
  static Result<std::unique_ptr<NewFlowWatch>> open(size_t queue_max = 4096);
  ~NewFlowWatch();
  NewFlowWatch(const NewFlowWatch&) = delete;
  NewFlowWatch& operator=(const NewFlowWatch&) = delete;

  // The addresses to watch from now on (replaces the last set; empty: none).
  Status watch(const std::set<model::IpAddr>& addresses);
  // The new flows seen since the last call, oldest first.
  std::vector<NewFlow> take();

  struct Stats {
    uint64_t seen = 0;           // events taken into the queue
    uint64_t dropped = 0;        // the queue was full
    uint64_t overruns = 0;       // the kernel could not deliver (ENOBUFS)
    uint64_t filtered_here = 0;  // events the kernel filter let through for other addresses
    bool kernel_filter = true;   // every watched address is filtered in the kernel
  };
  Stats stats() const;

  // The event callback (libnetfilter_conntrack's; `self` is the watch).
  static int on_event(const ::nf_conntrack* ct, void* self);

 private:
  explicit NewFlowWatch(size_t queue_max);
  void run();

  const size_t queue_max_;
  nfct_handle* h_ = nullptr;
  int wake_fd_ = -1;  // an eventfd: stops the reader
  std::thread reader_;
  mutable std::mutex mu_;
  std::vector<NewFlow> queue_;
  std::set<model::IpAddr> watched_;
  Stats stats_;
};

}  // namespace endpointd::proxy
