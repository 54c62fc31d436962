// NFNLGRP_NFTABLES listener. The notification's port id names the socket whose batch caused
// it; ours are ignored, anyone else's touching table "endpointd" triggers a resync.
#include "proxy/monitor.h"

#include <errno.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <vector>

#include "proxy/table.h"

namespace endpointd::proxy {

struct Monitor::Socket {
  struct Close {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  std::unique_ptr<mnl_socket, Close> nl;
};

Monitor::Monitor(std::unique_ptr<Socket> s, uint32_t own, std::function<void()> fn)
    : sock_(std::move(s)), own_(own), on_change_(std::move(fn)) {
  thread_ = std::thread([this] { run(); });
}

Monitor::~Monitor() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Result<std::unique_ptr<Monitor>> Monitor::start(uint32_t own_port_id,
                                                std::function<void()> on_change) {
  auto s = std::make_unique<Socket>();
  s->nl.reset(mnl_socket_open(NETLINK_NETFILTER));
  if (!s->nl) return Error{std::string("netlink socket: ") + std::strerror(errno)};
  if (mnl_socket_bind(s->nl.get(), 0, MNL_SOCKET_AUTOPID) < 0) {
    return Error{std::string("netlink bind: ") + std::strerror(errno)};
  }
  int group = NFNLGRP_NFTABLES;
  if (mnl_socket_setsockopt(s->nl.get(), NETLINK_ADD_MEMBERSHIP, &group, sizeof(group)) < 0) {
    return Error{std::string("netlink membership: ") + std::strerror(errno)};
  }
  int rcv = 4 << 20;
  setsockopt(mnl_socket_get_fd(s->nl.get()), SOL_SOCKET, SO_RCVBUFFORCE, &rcv, sizeof(rcv));
  return std::unique_ptr<Monitor>(new Monitor(std::move(s), own_port_id, std::move(on_change)));
}

bool Monitor::set_membership(bool on) {
  int group = NFNLGRP_NFTABLES;
  bool ok =
      mnl_socket_setsockopt(sock_->nl.get(), on ? NETLINK_ADD_MEMBERSHIP : NETLINK_DROP_MEMBERSHIP,
                            &group, sizeof(group)) == 0;
  if (ok) listening_ = on;
  return ok;
}

bool Monitor::listen(bool on) {
  std::lock_guard lock(listen_mu_);
  want_listen_ = on;
  return set_membership(on);
}

void Monitor::run() {
  std::vector<char> buf(1 << 16);
  int fd = mnl_socket_get_fd(sock_->nl.get());
  while (!stop_) {
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, 100);
    {
      std::lock_guard lock(listen_mu_);
      if (want_listen_ && !listening_ && set_membership(true))
        pending_ = true;  // deaf for a while: anything may have happened meanwhile
    }
    if (pending_.exchange(false)) {
      ++foreign_;
      on_change_();
    }
    if (r <= 0) continue;
    ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0) {
      // ENOBUFS: notifications were lost; assume the worst.
      if (errno == ENOBUFS) {
        ++foreign_;
        on_change_();
      }
      continue;
    }
    bool foreign = false;
    auto len = static_cast<int>(n);
    for (auto* nlh = static_cast<const nlmsghdr*>(static_cast<const void*>(buf.data()));
         mnl_nlmsg_ok(nlh, len); nlh = mnl_nlmsg_next(nlh, &len)) {
      if (nlh->nlmsg_pid == own_) {
        ++own_count_;
        continue;
      }
      if ((nlh->nlmsg_type >> 8) != NFNL_SUBSYS_NFTABLES) continue;
      uint16_t msg = nlh->nlmsg_type & 0xff;
      if (msg == NFT_MSG_NEWGEN) continue;
      // Attribute 1 is the table name in table, chain, rule, set and element messages.
      const nlattr* table = nullptr;
      mnl_attr_parse(
          nlh, sizeof(nfgenmsg),
          [](const nlattr* attr, void* data) -> int {
            if (mnl_attr_get_type(attr) == 1) *static_cast<const nlattr**>(data) = attr;
            return MNL_CB_OK;
          },
          &table);
      if (table && mnl_attr_validate(table, MNL_TYPE_NUL_STRING) >= 0 &&
          std::strcmp(mnl_attr_get_str(table), kTableName) == 0) {
        foreign = true;
      }
    }
    if (foreign) {
      ++foreign_;
      on_change_();
    }
  }
}

}  // namespace endpointd::proxy
