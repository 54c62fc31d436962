// Watches nftables notifications (NFNLGRP_NFTABLES) for changes to endpointd's tables made by
// anyone but endpointd's own socket, so the sink can repair them with a full sync.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
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

 private:
  struct Socket;
  Monitor(std::unique_ptr<Socket> s, uint32_t own, std::function<void()> fn);
  void run();
  std::unique_ptr<Socket> sock_;
  uint32_t own_;
  std::function<void()> on_change_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> foreign_{0};
  std::thread thread_;
};

}  // namespace endpointd::proxy
