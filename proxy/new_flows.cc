// NewFlowWatch (new_flows.h): a ctnetlink NEW-event socket with a kernel filter on the
// original destination, read by one thread.
#include "proxy/new_flows.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libnetfilter_conntrack/libnetfilter_conntrack.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace endpointd::proxy {
namespace {

// Large enough for a burst of new connections between two reads; past it the kernel says
// ENOBUFS and the events are counted as overruns.
constexpr int kReceiveBuffer = 1 << 20;

uint32_t word(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return ntohl(w);
}

int on_new(enum nf_conntrack_msg_type, struct nf_conntrack* ct, void* self) {
  return NewFlowWatch::on_event(ct, self);
}

}  // namespace

NewFlowWatch::NewFlowWatch(size_t queue_max) : queue_max_(queue_max) {}

Result<std::unique_ptr<NewFlowWatch>> NewFlowWatch::open(size_t queue_max) {
  std::unique_ptr<NewFlowWatch> w(new NewFlowWatch(queue_max));
  w->h_ = nfct_open(CONNTRACK, NF_NETLINK_CONNTRACK_NEW);
  if (!w->h_)
    return Error{std::string("conntrack events: ") + std::strerror(errno) +
                 " (needs CAP_NET_ADMIN and a kernel with conntrack events)"};
  int fd = nfct_fd(w->h_);
  int size = kReceiveBuffer;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)
    return Error{std::string("conntrack events: ") + std::strerror(errno)};
  w->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w->wake_fd_ < 0) return Error{std::string("eventfd: ") + std::strerror(errno)};
  if (nfct_callback_register(w->h_, NFCT_T_NEW, &on_new, w.get()) != 0)
    return Error{std::string("conntrack events: ") + std::strerror(errno)};
  // Nothing is watched until watch() says what.
  if (Status st = w->watch({}); !st) return Error{st.error()};
  w->reader_ = std::thread([p = w.get()] { p->run(); });
  return w;
}

NewFlowWatch::~NewFlowWatch() {
  if (reader_.joinable()) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    reader_.join();
  }
  if (h_) nfct_close(h_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

Status NewFlowWatch::watch(const std::set<model::IpAddr>& addresses) {
  size_t v4 = 0, v6 = 0;
  for (const auto& a : addresses) (a.is_v4() ? v4 : v6)++;
  const bool in_kernel = v4 <= kKernelFilterMax && v6 <= kKernelFilterMax;
  struct nfct_filter* f = nfct_filter_create();
  if (!f) return Error{"conntrack events: no memory for the filter"};
  // An address no connection goes to stands for "none" in a family nothing is watched in (a
  // family without entries would let every event of it through).
  nfct_filter_ipv4 none4{0, 0xffffffff};
  nfct_filter_ipv6 none6{{0, 0, 0, 0}, {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}};
  if (in_kernel) {
    for (const auto& a : addresses) {
      if (a.is_v4()) {
        nfct_filter_ipv4 e{word(a.data()), 0xffffffff};
        nfct_filter_add_attr(f, NFCT_FILTER_DST_IPV4, &e);
      } else {
        nfct_filter_ipv6 e{
            {word(a.data()), word(a.data() + 4), word(a.data() + 8), word(a.data() + 12)},
            {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}};
        nfct_filter_add_attr(f, NFCT_FILTER_DST_IPV6, &e);
      }
    }
    if (v4 == 0) nfct_filter_add_attr(f, NFCT_FILTER_DST_IPV4, &none4);
    if (v6 == 0) nfct_filter_add_attr(f, NFCT_FILTER_DST_IPV6, &none6);
    nfct_filter_set_logic(f, NFCT_FILTER_DST_IPV4, NFCT_FILTER_LOGIC_POSITIVE);
    nfct_filter_set_logic(f, NFCT_FILTER_DST_IPV6, NFCT_FILTER_LOGIC_POSITIVE);
  }
  int fd = nfct_fd(h_);
  int rc = in_kernel ? nfct_filter_attach(fd, f) : nfct_filter_detach(fd);
  int err = errno;
  nfct_filter_destroy(f);
  if (rc != 0)
    return Error{std::string("conntrack events: the kernel filter: ") + std::strerror(err)};
  std::lock_guard lock(mu_);
  watched_ = addresses;
  stats_.kernel_filter = in_kernel;
  return {};
}

std::vector<NewFlow> NewFlowWatch::take() {
  std::lock_guard lock(mu_);
  std::vector<NewFlow> out;
  out.swap(queue_);
  return out;
}

NewFlowWatch::Stats NewFlowWatch::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

int NewFlowWatch::on_event(const ::nf_conntrack* ct, void* self) {
  auto* w = static_cast<NewFlowWatch*>(self);
  NewFlow f;
  f.at = std::chrono::steady_clock::now();
  f.l4proto = nfct_get_attr_u8(ct, ATTR_ORIG_L4PROTO);
  f.dst_port = ntohs(nfct_get_attr_u16(ct, ATTR_ORIG_PORT_DST));
  if (nfct_get_attr_u8(ct, ATTR_ORIG_L3PROTO) == AF_INET6) {
    f.src = model::IpAddr::from_bytes(
        model::IpFamily::kV6, static_cast<const uint8_t*>(nfct_get_attr(ct, ATTR_ORIG_IPV6_SRC)));
    f.dst = model::IpAddr::from_bytes(
        model::IpFamily::kV6, static_cast<const uint8_t*>(nfct_get_attr(ct, ATTR_ORIG_IPV6_DST)));
  } else {
    uint32_t s = nfct_get_attr_u32(ct, ATTR_ORIG_IPV4_SRC);
    uint32_t d = nfct_get_attr_u32(ct, ATTR_ORIG_IPV4_DST);
    f.src = model::IpAddr::from_bytes(model::IpFamily::kV4, reinterpret_cast<const uint8_t*>(&s));
    f.dst = model::IpAddr::from_bytes(model::IpFamily::kV4, reinterpret_cast<const uint8_t*>(&d));
  }
  std::lock_guard lock(w->mu_);
  if (!w->watched_.count(f.dst)) {
    ++w->stats_.filtered_here;
  } else if (w->queue_.size() >= w->queue_max_) {
    ++w->stats_.dropped;
  } else {
    ++w->stats_.seen;
    w->queue_.push_back(f);
  }
  return NFCT_CB_CONTINUE;
}

void NewFlowWatch::run() {
  pollfd fds[2] = {{nfct_fd(h_), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    // Reads every event waiting; returns -1 with EAGAIN once the socket is empty.
    if (nfct_catch(h_) < 0 && errno == ENOBUFS) {
      std::lock_guard lock(mu_);
      ++stats_.overruns;
    }
  }
}

}  // namespace endpointd::proxy
