// Follows the host's addresses: rtnetlink's address notifications (RTM_NEWADDR / RTM_DELADDR,
// IPv4 and IPv6), so NodePorts served on addresses selected by CIDR (kube-proxy's
// nodePortAddresses) follow an address added to or removed from the host, as kube-proxy's
// `fib daddr type local` does, instead of waiting for a restart.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "model/result.h"

namespace endpointd::proxy {

class AddressMonitor {
 public:
  // Subscribes in the caller's network namespace. `on_change` runs on the monitor's thread once
  // a burst of notifications is over (`quiet` without another one; adding an address with its
  // routes is several), and also when notifications were lost (the socket overran): the caller
  // reads the addresses again and compares.
  static Result<std::unique_ptr<AddressMonitor>> start(
      std::function<void()> on_change,
      std::chrono::milliseconds quiet = std::chrono::milliseconds(100));
  ~AddressMonitor();
  AddressMonitor(const AddressMonitor&) = delete;
  AddressMonitor& operator=(const AddressMonitor&) = delete;

  // Bursts reported so far.
  uint64_t changes() const { return changes_.load(); }

 private:
  struct Socket;
  AddressMonitor(std::unique_ptr<Socket> s, std::function<void()> fn,
                 std::chrono::milliseconds quiet);
  void run();
  std::unique_ptr<Socket> sock_;
  std::function<void()> on_change_;
  std::chrono::milliseconds quiet_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> changes_{0};
  std::thread thread_;
};

}  // namespace endpointd::proxy
