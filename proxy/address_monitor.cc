// rtnetlink address listener: every message on the address groups means "read them again";
// the messages themselves are not parsed (the reader, getifaddrs, is the one source of truth).
#include "proxy/address_monitor.h"

#include <errno.h>
#include <libmnl/libmnl.h>
#include <linux/rtnetlink.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <vector>

namespace endpointd::proxy {

struct AddressMonitor::Socket {
  struct Close {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  std::unique_ptr<mnl_socket, Close> nl;
};

Result<std::unique_ptr<AddressMonitor>> AddressMonitor::start(std::function<void()> on_change,
                                                              std::chrono::milliseconds quiet) {
  auto s = std::make_unique<Socket>();
  s->nl.reset(mnl_socket_open(NETLINK_ROUTE));
  if (!s->nl) return Error{std::string("rtnetlink socket: ") + std::strerror(errno)};
  if (mnl_socket_bind(s->nl.get(), RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR, MNL_SOCKET_AUTOPID) <
      0) {
    return Error{std::string("rtnetlink bind to the address groups: ") + std::strerror(errno)};
  }
  return std::unique_ptr<AddressMonitor>(
      new AddressMonitor(std::move(s), std::move(on_change), quiet));
}

AddressMonitor::AddressMonitor(std::unique_ptr<Socket> s, std::function<void()> fn,
                               std::chrono::milliseconds quiet)
    : sock_(std::move(s)), on_change_(std::move(fn)), quiet_(quiet) {
  thread_ = std::thread([this] { run(); });
}

AddressMonitor::~AddressMonitor() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void AddressMonitor::run() {
  std::vector<char> buf(1 << 15);
  int fd = mnl_socket_get_fd(sock_->nl.get());
  bool pending = false;
  auto last = std::chrono::steady_clock::now();
  while (!stop_) {
    pollfd p{fd, POLLIN, 0};
    int timeout = pending ? static_cast<int>(quiet_.count()) : 100;
    if (poll(&p, 1, timeout) > 0) {
      // Drain what is queued; ENOBUFS (an overrun) lost some: read the addresses anyway.
      for (;;) {
        ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n <= 0 && !(n < 0 && errno == ENOBUFS)) break;
        pending = true;
        last = std::chrono::steady_clock::now();
      }
      continue;
    }
    if (pending && std::chrono::steady_clock::now() - last >= quiet_) {
      pending = false;
      ++changes_;
      on_change_();
    }
  }
}

}  // namespace endpointd::proxy
