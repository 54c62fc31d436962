// libnftnl + libmnl: the socket that sends the encoder's batches (proxy/nft_encode.h) and
// collects their acknowledgements, lists what the namespace holds, and reads the ruleset
// generation.
#include "proxy/netlink.h"

#include <errno.h>
#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/gen.h>
#include <libnftnl/set.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "proxy/nftnl_util.h"

namespace endpointd::proxy {

struct NetlinkBackend::Socket {
  struct Close {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  std::unique_ptr<mnl_socket, Close> nl;
  uint32_t portid = 0;
};

NetlinkBackend::NetlinkBackend(std::unique_ptr<Socket> s) : sock_(std::move(s)) {}
NetlinkBackend::~NetlinkBackend() = default;

uint32_t NetlinkBackend::port_id() const {
  return sock_->portid;
}

Result<std::unique_ptr<NetlinkBackend>> NetlinkBackend::open() {
  auto s = std::make_unique<Socket>();
  s->nl.reset(mnl_socket_open(NETLINK_NETFILTER));
  if (!s->nl) return Error{std::string("netlink socket: ") + std::strerror(errno)};
  if (mnl_socket_bind(s->nl.get(), 0, MNL_SOCKET_AUTOPID) < 0) {
    return Error{std::string("netlink bind: ") + std::strerror(errno)};
  }
  s->portid = mnl_socket_get_portid(s->nl.get());
  int fd = mnl_socket_get_fd(s->nl.get());
  int one = 1;
  setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
  setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
  int rcv = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcv, sizeof(rcv));
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return std::unique_ptr<NetlinkBackend>(new NetlinkBackend(std::move(s)));
}

Result<BatchStats> NetlinkBackend::send(const Batch& b) {
  int fd = mnl_socket_get_fd(sock_->nl.get());
  int snd = static_cast<int>(b.bytes.size()) + (1 << 16);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &snd, sizeof(snd));
  if (mnl_socket_sendto(sock_->nl.get(), b.bytes.data(), b.bytes.size()) < 0) {
    return Error{std::string("netlink send: ") + std::strerror(errno)};
  }
  size_t expected = b.what.size();
  size_t acked = 0;
  std::string first_error;
  std::vector<char> buf(1 << 16);
  while (acked < expected) {
    ssize_t n = mnl_socket_recvfrom(sock_->nl.get(), buf.data(), buf.size());
    if (n < 0) {
      if (!first_error.empty()) break;  // the kernel stops acking after an abort in some paths
      return Error{std::string("netlink receive: ") + std::strerror(errno)};
    }
    auto len = static_cast<int>(n);
    for (auto* nlh = reinterpret_cast<nlmsghdr*>(buf.data()); mnl_nlmsg_ok(nlh, len);
         nlh = mnl_nlmsg_next(nlh, &len)) {
      if (nlh->nlmsg_type != NLMSG_ERROR) continue;
      if (nlh->nlmsg_len < mnl_nlmsg_size(sizeof(nlmsgerr))) continue;
      nlmsgerr err;
      std::memcpy(&err, mnl_nlmsg_get_payload(nlh), sizeof(err));
      ++acked;
      if (err.error != 0 && first_error.empty()) {
        size_t idx = nlh->nlmsg_seq - b.first_seq;
        std::string what =
            idx < b.what.size() ? b.what[idx] : "message " + std::to_string(nlh->nlmsg_seq);
        first_error = what + ": " + std::strerror(-err.error);
      }
    }
  }
  if (!first_error.empty()) return Error{first_error};
  return BatchStats{b.what.size(), b.bytes.size()};
}

Result<std::vector<std::string>> NetlinkBackend::list_names(uint16_t msg_type, IpFamily f) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  uint32_t seq = seq_++;
  nlmsghdr* nlh =
      nftnl_nlmsg_build_hdr(buf.data(), msg_type, nftnl::nf_family(f), NLM_F_DUMP | NLM_F_ACK, seq);
  if (msg_type == NFT_MSG_GETSET) {
    nftnl::SetPtr s(nftnl_set_alloc());
    nftnl_set_set_str(s.get(), NFTNL_SET_TABLE, kTableName);
    nftnl_set_set_u32(s.get(), NFTNL_SET_FAMILY, nftnl::nf_family(f));
    nftnl_set_nlmsg_build_payload(nlh, s.get());
  }
  if (mnl_socket_sendto(sock_->nl.get(), nlh, nlh->nlmsg_len) < 0) {
    return Error{std::string("netlink send: ") + std::strerror(errno)};
  }
  struct Ctx {
    uint16_t type;
    std::vector<std::string> names;
  } ctx{msg_type, {}};
  auto cb = [](const nlmsghdr* m, void* data) -> int {
    auto* c = static_cast<Ctx*>(data);
    // A message without a table or a name attribute parses too: skip it, never dereference.
    auto take = [c](const char* table, const char* name) {
      if (table && name && std::strcmp(table, kTableName) == 0) c->names.emplace_back(name);
    };
    if (c->type == NFT_MSG_GETCHAIN) {
      nftnl::ChainPtr ch(nftnl_chain_alloc());
      if (nftnl_chain_nlmsg_parse(m, ch.get()) == 0)
        take(nftnl_chain_get_str(ch.get(), NFTNL_CHAIN_TABLE),
             nftnl_chain_get_str(ch.get(), NFTNL_CHAIN_NAME));
    } else {
      nftnl::SetPtr s(nftnl_set_alloc());
      if (nftnl_set_nlmsg_parse(m, s.get()) == 0)
        take(nftnl_set_get_str(s.get(), NFTNL_SET_TABLE),
             nftnl_set_get_str(s.get(), NFTNL_SET_NAME));
    }
    return MNL_CB_OK;
  };
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_->nl.get(), buf.data(), buf.size());
    if (n < 0) return Error{std::string("netlink receive: ") + std::strerror(errno)};
    int ret = mnl_cb_run(buf.data(), static_cast<size_t>(n), seq, sock_->portid, cb, &ctx);
    if (ret < 0) {
      if (errno == ENOENT) return std::vector<std::string>{};  // no table yet
      return Error{std::string("netlink dump: ") + std::strerror(errno)};
    }
    if (ret == MNL_CB_STOP) break;
  }
  return std::move(ctx.names);
}

Result<uint32_t> NetlinkBackend::ruleset_generation() {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  uint32_t seq = seq_++;
  nlmsghdr* nlh = nftnl_nlmsg_build_hdr(buf.data(), NFT_MSG_GETGEN, AF_UNSPEC, NLM_F_ACK, seq);
  if (mnl_socket_sendto(sock_->nl.get(), nlh, nlh->nlmsg_len) < 0) {
    return Error{std::string("netlink send: ") + std::strerror(errno)};
  }
  struct Ctx {
    bool found = false;
    uint32_t id = 0;
  } ctx;
  auto cb = [](const nlmsghdr* m, void* data) -> int {
    auto* c = static_cast<Ctx*>(data);
    nftnl::GenPtr g(nftnl_gen_alloc());
    if (g && nftnl_gen_nlmsg_parse(m, g.get()) == 0 && nftnl_gen_is_set(g.get(), NFTNL_GEN_ID)) {
      c->found = true;
      c->id = nftnl_gen_get_u32(g.get(), NFTNL_GEN_ID);
    }
    return MNL_CB_OK;
  };
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_->nl.get(), buf.data(), buf.size());
    if (n < 0) return Error{std::string("netlink receive: ") + std::strerror(errno)};
    int ret = mnl_cb_run(buf.data(), static_cast<size_t>(n), seq, sock_->portid, cb, &ctx);
    if (ret < 0) return Error{std::string("netlink getgen: ") + std::strerror(errno)};
    if (ret == MNL_CB_STOP) break;
  }
  if (!ctx.found) return Error{"netlink getgen: no generation in the answer"};
  return ctx.id;
}

void NetlinkBackend::set_quiet_full_sync(std::function<bool(bool)> listen,
                                         std::function<void()> foreign) {
  std::lock_guard lock(quiet_mu_);
  listen_ = std::move(listen);
  foreign_ = std::move(foreign);
}

NetlinkBackend::QuietStats NetlinkBackend::quiet_stats() const {
  std::lock_guard lock(quiet_mu_);
  return quiet_stats_;
}

Result<BatchStats> NetlinkBackend::full_sync(const std::vector<const Table*>& tables) {
  std::vector<std::string> lists[4];
  int i = 0;
  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    for (uint16_t type :
         {static_cast<uint16_t>(NFT_MSG_GETCHAIN), static_cast<uint16_t>(NFT_MSG_GETSET)}) {
      auto r = list_names(type, f);
      if (!r) return Error{r.error()};
      lists[i++] = std::move(*r);
    }
  }
  Batch b = build_full_sync_batch(tables, lists[0], lists[1], lists[2], lists[3], seq_);
  seq_ += static_cast<uint32_t>(b.what.size()) + 2;

  std::function<bool(bool)> listen;
  std::function<void()> foreign;
  {
    std::lock_guard lock(quiet_mu_);
    if (listen_ && !listen_next_) {
      listen = listen_;
      foreign = foreign_;
    }
    listen_next_ = false;
  }
  std::optional<uint32_t> before;
  if (listen) {
    auto g = ruleset_generation();
    if (g && listen(false)) before = *g;  // else: an ordinary full sync, listened to
  }
  auto r = send(b);
  if (!before) return r;
  listen(true);
  auto after = ruleset_generation();
  // The batch committed: the generation moved by exactly one unless someone else committed
  // too (a failed batch is retried by the sink with backoff, and checked again then).
  bool others = r && (!after || *after - *before != 1u);
  {
    std::lock_guard lock(quiet_mu_);
    ++quiet_stats_.quiet;
    if (others) {
      ++quiet_stats_.foreign;
      listen_next_ = true;
    }
  }
  if (others) foreign();
  return r;
}

Result<BatchStats> NetlinkBackend::apply(const std::vector<TableChanges>& list) {
  Batch b = build_changes_batch(list, seq_);
  seq_ += static_cast<uint32_t>(b.what.size()) + 2;
  return send(b);
}

Result<BatchStats> NetlinkBackend::cleanup() {
  BatchStats total;
  for (IpFamily f : {IpFamily::kV4, IpFamily::kV6}) {
    // One batch per family, so a missing ip table does not keep the ip6 one.
    Batch batch = build_cleanup_batch(f, seq_);
    seq_ += static_cast<uint32_t>(batch.what.size()) + 2;
    auto r = send(batch);
    if (!r && r.error().find(std::strerror(ENOENT)) == std::string::npos) return r;
    if (r) {
      total.messages += r->messages;
      total.bytes += r->bytes;
    }
  }
  return total;
}

}  // namespace endpointd::proxy
