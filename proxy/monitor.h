// Watches nftables notifications (NFNLGRP_NFTABLES) for changes to endpointd's tables made by
// anyone but endpointd's own socket, so the sink can repair them with a full sync.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "model/result.h"

namespace endpointd::proxy {

class Monitor {
 public:
  // Subscribes in the caller's network namespace. `on_change` runs on the monitor's thread
  // for every foreign notification that names table "endpointd"; keep it cheap.
  static Result<std::unique_ptr<Monitor>> start(uint32_t own_port_id,
                                                std::function<void()> on_change);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  uint64_t foreign_changes() const { return foreign_.load(); }
  // Notifications caused by endpointd's own socket (read and ignored).
  uint64_t own_notifications() const { return own_count_.load(); }

  // Leaves (false) or rejoins (true) the notification group. While no socket listens, the
  // kernel builds no notification at all: a full sync of 100,000 set elements otherwise
  // makes it build one per element, only for this monitor to ignore them (NetlinkBackend's
  // quiet full sync uses this, and checks the ruleset generation for anyone else's commit).
  // Any thread. false when the socket option failed; a failed rejoin is retried by the
  // monitor's thread on every poll, and reported as a possible foreign change once it works.
  bool listen(bool on);
  // Someone else committed while the monitor was not listening: on_change runs on the
  // monitor's thread, within its next poll (at most 100 ms), as for a change it saw. Any
  // thread, and never calls on_change itself (the caller may hold the sink's lock).
  void report_foreign() { pending_ = true; }

 private:
  struct Socket;
  Monitor(std::unique_ptr<Socket> s, uint32_t own, std::function<void()> fn);
  void run();
  std::unique_ptr<Socket> sock_;
  uint32_t own_;
  std::function<void()> on_change_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> foreign_{0};
  std::atomic<uint64_t> own_count_{0};
  std::atomic<bool> pending_{false};
  bool set_membership(bool on);
  std::mutex listen_mu_;  // guards the two below and the group membership
  bool want_listen_ = true;
  bool listening_ = true;
  std::thread thread_;
};

}  // namespace endpointd::proxy
