// UDP workers (recvmmsg/sendmmsg on a SO_REUSEPORT socket each) and the TCP thread.
#include "dns/server.h"

#include <pthread.h>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "dns/answer.h"

namespace endpointd::dns {

using Clock = std::chrono::steady_clock;

bool allowed(const std::vector<model::IpPrefix>& allow, const model::IpAddr& a) {
  for (const auto& p : allow)
    if (p.contains(a)) return true;
  return false;
}

namespace {

constexpr int kBatch = 64;  // queries per recvmmsg: a full socket queue goes in few calls
constexpr size_t kRecvSize = 4096;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

model::IpAddr peer_ip(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    sockaddr_in sin;
    std::memcpy(&sin, &ss, sizeof sin);
    uint8_t b[4];
    std::memcpy(b, &sin.sin_addr, 4);
    return model::IpAddr::from_bytes(model::IpFamily::kV4, b);
  }
  sockaddr_in6 sin6;
  std::memcpy(&sin6, &ss, sizeof sin6);
  uint8_t b[16];
  std::memcpy(b, &sin6.sin6_addr, 16);
  if (IN6_IS_ADDR_V4MAPPED(&sin6.sin6_addr))
    return model::IpAddr::from_bytes(model::IpFamily::kV4, b + 12);
  return model::IpAddr::from_bytes(model::IpFamily::kV6, b);
}

model::IpAddr peer_of(int connected_fd) {
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getpeername(connected_fd, reinterpret_cast<sockaddr*>(&ss), &sl);
  return peer_ip(ss);
}

std::optional<std::pair<sockaddr_storage, socklen_t>> make_addr(const std::string& addr,
                                                                uint16_t port) {
  auto ip = model::IpAddr::parse(addr);
  if (!ip) return std::nullopt;
  sockaddr_storage ss{};
  if (ip->is_v4()) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    std::memcpy(&sin.sin_addr, ip->data(), 4);
    std::memcpy(&ss, &sin, sizeof sin);
    return std::make_pair(ss, static_cast<socklen_t>(sizeof sin));
  }
  sockaddr_in6 sin6{};
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons(port);
  std::memcpy(&sin6.sin6_addr, ip->data(), 16);
  std::memcpy(&ss, &sin6, sizeof sin6);
  return std::make_pair(ss, static_cast<socklen_t>(sizeof sin6));
}

uint16_t bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;  // sockaddr API
  if (ss.ss_family == AF_INET) {
    sockaddr_in sin;
    std::memcpy(&sin, &ss, sizeof sin);
    return ntohs(sin.sin_port);
  }
  sockaddr_in6 sin6;
  std::memcpy(&sin6, &ss, sizeof sin6);
  return ntohs(sin6.sin6_port);
}

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd = o.fd;
    o.fd = -1;
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

// A reply that says only "ask again over TCP": the header with TC and the question.
size_t truncated_reply(const Query& q, uint16_t flags, uint8_t* out, size_t cap) {
  Writer w(out, cap);
  w.header(q.id, static_cast<uint16_t>(flags | flag::kTC), 1, 0, 0, 0);
  w.name(q.qname.span(), false);
  w.u16(q.qtype);
  w.u16(q.qclass);
  return w.ok() ? w.size() : 0;
}

// An ExternalName's CNAME reply (`out`, `r->size` bytes) completed from the forwarder's cache
// with the target's records: true when the cache had them (r->size is the new reply's).
bool chase_from_cache(Forwarder* f, const Query& q, const Query& t, Reply* r, uint8_t* out,
                      size_t cap) {
  std::array<uint8_t, kMaxUdpSize> up, whole;
  size_t n = f->cached(t, up.data(), up.size());
  if (!n) return false;
  size_t m =
      chase_reply(q, {out, r->size}, {up.data(), n}, whole.data(), std::min(cap, whole.size()));
  if (m) {
    std::memcpy(out, whole.data(), m);
    r->size = m;
  }
  return true;  // asked and answered: a reply that did not fit leaves the CNAME alone
}

// From the forwarder's thread: `reply` to a UDP client, or "ask again over TCP" when it is
// larger than the client takes.
void send_udp(int fd, const sockaddr_storage& to, socklen_t tolen, const Query& q, size_t limit,
              std::span<const uint8_t> reply) {
  uint8_t tc[kMaxNameWire + 32];
  if (reply.size() > limit)
    reply = {tc, truncated_reply(q, load_u16(reply.data() + 2), tc, sizeof tc)};
  sendto(fd, reply.data(), reply.size(), MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&to),
         tolen);
}

// The reply to send once the forwarder answered the chase: the whole, or the CNAME alone.
std::vector<uint8_t> chased(const Query& q, std::span<const uint8_t> cname,
                            std::span<const uint8_t> upstream) {
  std::vector<uint8_t> whole(65535);
  size_t m = chase_reply(q, cname, upstream, whole.data(), whole.size());
  if (!m) return {cname.begin(), cname.end()};
  whole.resize(m);
  return whole;
}

}  // namespace

// ---------------------------------------------------------------------------------------

class Server::Worker {
 public:
  Worker(Server* s, Fd fd) : s_(s), fd_(std::move(fd)), counts_(s->metrics_->thread_counts()) {}
  void start() {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "dns-udp");
      run();
    });
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  int fd() const { return fd_.fd; }

 private:
  void run();
  size_t handle(std::span<const uint8_t> pkt, const Query& q, const Zone::Lookup* lk,
                const sockaddr_storage& from, socklen_t fromlen, uint8_t* out, int64_t now);

  Server* s_;
  Fd fd_;
  std::thread thread_;
  ZonePtr zone_;
  uint64_t zone_version_ = ~uint64_t{0};
  ThreadCounts* counts_;  // folded into the registry at a scrape
  // The batch in hand: every query parsed, then every name looked up, then every reply
  // written (the lookups' cache misses overlap instead of following one another).
  std::array<Query, kBatch> queries_;
  std::array<Zone::Lookup, kBatch> lookups_;
  std::array<uint8_t, kBatch> looked_up_{};
  std::array<uint64_t, kBatch> hashes_{};
};

size_t Server::Worker::handle(std::span<const uint8_t> pkt, const Query& q, const Zone::Lookup* lk,
                              const sockaddr_storage& from, socklen_t fromlen, uint8_t* out,
                              int64_t now) {
  if (q.status == ParseStatus::kDrop) {
    s_->dropped_++;
    counts_->count(0, 7);
    return 0;
  }
  Reply r = lk ? answer_lookup(*zone_, *lk, pkt, q, out, kMaxUdpSize, q.udp_limit(), now)
               : answer(*zone_, pkt, q, out, kMaxUdpSize, q.udp_limit(), now);
  if (!r.chase.empty() && s_->forwarder_ && allowed(s_->opts_.forward_allow, peer_ip(from))) {
    // An ExternalName out of the zone: its target's records from upstream, after the CNAME.
    Forwarder* f = s_->forwarder_;
    Query t = chase_query(q, r.chase);
    if (chase_from_cache(f, q, t, &r, out, kMaxUdpSize)) {
      if (r.size > q.udp_limit()) r.size = truncated_reply(q, load_u16(out + 2), out, kMaxUdpSize);
    } else {
      int fd = fd_.fd;
      size_t limit = q.udp_limit();
      auto done = [fd, from, fromlen, limit, q, cname = std::vector<uint8_t>(out, out + r.size)](
                      std::span<const uint8_t> reply) {
        send_udp(fd, from, fromlen, q, limit, chased(q, cname, reply));
      };
      if (f->forward(t, std::move(done))) {
        counts_->count(q.qtype, rcode_slot(r.rcode));
        return 0;
      }
      // Shed by the forwarder's limit: the CNAME alone.
    }
  }
  if (r.action == Reply::Action::kForward) {
    Forwarder* f = s_->forwarder_;
    if (!f || !allowed(s_->opts_.forward_allow, peer_ip(from))) {
      r = error_reply(pkt, q, static_cast<uint16_t>(Rcode::kRefused), out, kMaxUdpSize);
    } else if (size_t n = f->cached(q, out, kMaxUdpSize); n) {
      r.action = Reply::Action::kSend;
      r.rcode = out[3] & 0xF;
      r.size = n > q.udp_limit() ? truncated_reply(q, load_u16(out + 2), out, kMaxUdpSize) : n;
    } else {
      int fd = fd_.fd;
      size_t limit = q.udp_limit();
      auto done = [fd, from, fromlen, limit, q](std::span<const uint8_t> reply) {
        send_udp(fd, from, fromlen, q, limit, reply);
      };
      if (f->forward(q, std::move(done))) return 0;
      r = error_reply(pkt, q, static_cast<uint16_t>(Rcode::kRefused), out, kMaxUdpSize);
    }
  }
  if (r.action != Reply::Action::kSend) {
    s_->dropped_++;
    counts_->count(q.qtype, 7);
    return 0;
  }
  counts_->count(q.qtype, rcode_slot(r.rcode));
  return r.size;
}

void Server::Worker::run() {
  // Buffers live for the worker's lifetime: nothing is allocated per packet.
  std::vector<uint8_t> in(kBatch * kRecvSize), out(kBatch * kMaxUdpSize);
  std::array<mmsghdr, kBatch> rmsg{}, smsg{};
  std::array<iovec, kBatch> riov{}, siov{};
  std::array<sockaddr_storage, kBatch> from{};
  for (int i = 0; i < kBatch; ++i) {
    riov[i] = {in.data() + i * kRecvSize, kRecvSize};
    rmsg[i].msg_hdr.msg_iov = &riov[i];
    rmsg[i].msg_hdr.msg_iovlen = 1;
    rmsg[i].msg_hdr.msg_name = &from[i];
  }
  pollfd pfd[2] = {{fd_.fd, POLLIN, 0}, {s_->stop_fd_, POLLIN, 0}};
  while (true) {
    for (int i = 0; i < kBatch; ++i) {
      rmsg[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
      rmsg[i].msg_hdr.msg_flags = 0;
    }
    int n = recvmmsg(fd_.fd, rmsg.data(), kBatch, MSG_DONTWAIT, nullptr);
    if (n <= 0) {
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        spdlog::warn("dns: recvmmsg: {}", std::strerror(errno));
      }
      // Idle: let go of the zone, so that blocks retired since can be freed (drain support
      // waits for that) and a quiet worker never pins an old generation.
      zone_.reset();
      zone_version_ = ~uint64_t{0};
      poll(pfd, 2, -1);
      if (pfd[1].revents) break;
      continue;
    }
    auto t0 = Clock::now();
    if (s_->zones_->version() != zone_version_) {
      zone_version_ = s_->zones_->version();
      zone_ = s_->zones_->load();
    }
    int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
    auto packet = [&](int i) {
      return std::span<const uint8_t>(in.data() + i * kRecvSize, rmsg[i].msg_len);
    };
    for (int i = 0; i < n; ++i) {
      if (rmsg[i].msg_hdr.msg_flags & MSG_TRUNC) {  // larger than any query we take
        looked_up_[i] = 0;
        continue;
      }
      parse_query(packet(i), &queries_[i]);
      looked_up_[i] = wants_lookup(queries_[i]);
    }
    for (int i = 0; i < n; ++i)
      if (looked_up_[i]) hashes_[i] = name_hash(queries_[i].qname_lower.view());
    for (int stage = 0; stage < 4; ++stage)
      for (int i = 0; i < n; ++i)
        if (looked_up_[i]) zone_->prefetch(hashes_[i], stage);
    for (int i = 0; i < n; ++i) {
      if (!looked_up_[i]) continue;
      lookups_[i] = zone_->lookup(queries_[i].qname_lower, queries_[i].qtype, hashes_[i]);
      if (lookups_[i].kind == Zone::Kind::kAnswer) __builtin_prefetch(lookups_[i].set);
    }
    for (int i = 0; i < n; ++i)
      if (looked_up_[i]) prefetch_answer(lookups_[i]);
    int ns = 0;
    for (int i = 0; i < n; ++i) {
      if (rmsg[i].msg_hdr.msg_flags & MSG_TRUNC) {
        s_->dropped_++;
        continue;
      }
      uint8_t* o = out.data() + ns * kMaxUdpSize;
      size_t len = handle(packet(i), queries_[i], looked_up_[i] ? &lookups_[i] : nullptr, from[i],
                          rmsg[i].msg_hdr.msg_namelen, o, now);
      if (!len) continue;
      siov[ns] = {o, len};
      smsg[ns].msg_hdr = {};
      smsg[ns].msg_hdr.msg_iov = &siov[ns];
      smsg[ns].msg_hdr.msg_iovlen = 1;
      smsg[ns].msg_hdr.msg_name = &from[i];
      smsg[ns].msg_hdr.msg_namelen = rmsg[i].msg_hdr.msg_namelen;
      ++ns;
    }
    for (int sent = 0; sent < ns;) {
      int k = sendmmsg(fd_.fd, smsg.data() + sent, static_cast<unsigned>(ns - sent), 0);
      if (k <= 0) {
        if (errno == EINTR) continue;
        s_->dropped_ += static_cast<uint64_t>(ns - sent);
        break;
      }
      sent += k;
    }
    // Latency as the batch saw it: receive to send, the same for each query of the batch.
    auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    counts_->latency(static_cast<uint64_t>(std::max<int64_t>(took, 0)), static_cast<size_t>(n));
  }
}

// ---------------------------------------------------------------------------------------

class Server::TcpServer {
 public:
  TcpServer(Server* s, Fd listen)
      : s_(s), listen_(std::move(listen)), counts_(s->metrics_->thread_counts()) {}
  ~TcpServer() { join(); }
  Status start() {
    ep_ = Fd(epoll_create1(EPOLL_CLOEXEC));
    wake_ = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (ep_.fd < 0 || wake_.fd < 0)
      return Error{std::string("epoll/eventfd: ") + std::strerror(errno)};
    add(listen_.fd, EPOLLIN, kListenTag);
    add(s_->stop_fd_, EPOLLIN, kStopTag);
    add(wake_.fd, EPOLLIN, kWakeTag);
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "dns-tcp");
      run();
    });
    return {};
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  // From the forwarder's thread.
  void deliver(uint64_t conn, std::vector<uint8_t> reply) {
    {
      std::lock_guard lk(mu_);
      replies_.emplace_back(conn, std::move(reply));
    }
    uint64_t one = 1;
    (void)!write(wake_.fd, &one, sizeof one);
  }

 private:
  static constexpr uint64_t kListenTag = ~uint64_t{0}, kStopTag = ~uint64_t{0} - 1,
                            kWakeTag = ~uint64_t{0} - 2;
  struct Conn {
    Fd fd;
    std::vector<uint8_t> in, out;
    Clock::time_point last;
    bool want_out = false;
  };
  void add(int fd, uint32_t ev, uint64_t tag) {
    epoll_event e{};
    e.events = ev;
    e.data.u64 = tag;
    epoll_ctl(ep_.fd, EPOLL_CTL_ADD, fd, &e);
  }
  void run();
  void accept_all();
  bool read_conn(uint64_t id, Conn& c);
  bool flush(uint64_t id, Conn& c);
  void queue_reply(Conn& c, std::span<const uint8_t> reply) {
    uint8_t len[2];
    store_u16(len, static_cast<uint16_t>(reply.size()));
    c.out.insert(c.out.end(), len, len + 2);
    c.out.insert(c.out.end(), reply.begin(), reply.end());
  }
  void close_conn(uint64_t id) { conns_.erase(id); }

  Server* s_;
  Fd listen_, ep_, wake_;
  std::thread thread_;
  std::unordered_map<uint64_t, Conn> conns_;
  uint64_t next_id_ = 1;
  std::mutex mu_;
  std::deque<std::pair<uint64_t, std::vector<uint8_t>>> replies_;
  ThreadCounts* counts_;  // folded into the registry at a scrape
  std::vector<uint8_t> out_buf_ = std::vector<uint8_t>(65535 + 2);
};

void Server::TcpServer::accept_all() {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd =
        accept4(listen_.fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (conns_.size() >= s_->opts_.tcp_max_connections) {
      uint64_t n = ++s_->tcp_rejected_;
      if (s_->metrics_) s_->metrics_->tcp_rejected();
      if ((n & (n - 1)) == 0)  // the 1st, 2nd, 4th, 8th...: a log line without a flood
        spdlog::warn("dns: tcp connection limit ({}) reached: {} connections closed so far",
                     s_->opts_.tcp_max_connections, n);
      close(fd);
      continue;
    }
    uint64_t id = next_id_++;
    Conn& c = conns_[id];
    c.fd = Fd(fd);
    c.last = Clock::now();
    add(fd, EPOLLIN | EPOLLRDHUP, id);
  }
}

bool Server::TcpServer::flush(uint64_t id, Conn& c) {
  while (!c.out.empty()) {
    ssize_t n = send(c.fd.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    c.out.erase(c.out.begin(), c.out.begin() + n);
  }
  if (c.out.size() > s_->opts_.tcp_max_pending_bytes) {
    // Its answers pile up unread: a client that never reads is dropped, not buffered.
    uint64_t n = ++s_->tcp_slow_dropped_;
    if (s_->metrics_) s_->metrics_->tcp_slow_dropped();
    if ((n & (n - 1)) == 0)
      spdlog::warn("dns: tcp client dropped with {} bytes of answers unread (limit {}): {} so far",
                   c.out.size(), s_->opts_.tcp_max_pending_bytes, n);
    return false;
  }
  bool want = !c.out.empty();
  if (want != c.want_out) {
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0u);
    e.data.u64 = id;
    epoll_ctl(ep_.fd, EPOLL_CTL_MOD, c.fd.fd, &e);
    c.want_out = want;
  }
  return true;
}

bool Server::TcpServer::read_conn(uint64_t id, Conn& c) {
  uint8_t buf[16384];
  while (true) {
    ssize_t n = recv(c.fd.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    c.in.insert(c.in.end(), buf, buf + n);
    // Enough to work on: the rest waits in the socket (epoll says so again); a client that
    // sends faster than it reads is caught by the cap on unread answers (flush).
    if (c.in.size() >= 4 * 65537) break;
  }
  c.last = Clock::now();
  ZonePtr zone = s_->zones_->load();
  size_t pos = 0;
  while (c.in.size() - pos >= 2) {
    size_t len = load_u16(c.in.data() + pos);
    if (len < kHeaderSize) return false;  // garbage: close, never answer
    if (c.in.size() - pos < 2 + len) break;
    std::span<const uint8_t> pkt(c.in.data() + pos + 2, len);
    pos += 2 + len;
    Query q = parse_query(pkt);
    if (q.status == ParseStatus::kDrop) return false;
    Reply r = answer(*zone, pkt, q, out_buf_.data(), 65535, 65535, now_ns());
    if (!r.chase.empty() && s_->forwarder_ && allowed(s_->opts_.forward_allow, peer_of(c.fd.fd))) {
      Forwarder* f = s_->forwarder_;
      Query t = chase_query(q, r.chase);
      if (!chase_from_cache(f, q, t, &r, out_buf_.data(), 65535)) {
        auto done = [this, id, q,
                     cname = std::vector<uint8_t>(out_buf_.data(), out_buf_.data() + r.size)](
                        std::span<const uint8_t> reply) { deliver(id, chased(q, cname, reply)); };
        if (f->forward(t, std::move(done))) {
          counts_->count(q.qtype, rcode_slot(r.rcode));
          continue;
        }
      }
    }
    if (r.action == Reply::Action::kForward) {
      Forwarder* f = s_->forwarder_;
      if (!f || !allowed(s_->opts_.forward_allow, peer_of(c.fd.fd))) {
        r = error_reply(pkt, q, static_cast<uint16_t>(Rcode::kRefused), out_buf_.data(), 65535);
      } else if (size_t n = f->cached(q, out_buf_.data(), 65535); n) {
        r.action = Reply::Action::kSend;
        r.size = n;
        r.rcode = out_buf_[3] & 0xF;
      } else {
        auto done = [this, id](std::span<const uint8_t> reply) {
          deliver(id, std::vector<uint8_t>(reply.begin(), reply.end()));
        };
        if (f->forward(q, std::move(done))) continue;
        r = error_reply(pkt, q, static_cast<uint16_t>(Rcode::kRefused), out_buf_.data(), 65535);
      }
    }
    if (r.action != Reply::Action::kSend) return false;
    counts_->count(q.qtype, rcode_slot(r.rcode));
    queue_reply(c, {out_buf_.data(), r.size});
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(pos));
  return flush(id, c);
}

void Server::TcpServer::run() {
  epoll_event evs[64];
  auto idle = s_->opts_.tcp_idle_timeout;
  int wait_ms = static_cast<int>(std::clamp<int64_t>(idle.count() / 2, 10, 1000));
  while (true) {
    int n = epoll_wait(ep_.fd, evs, 64, wait_ms);
    bool stop = false;
    for (int i = 0; i < n; ++i) {
      uint64_t tag = evs[i].data.u64;
      if (tag == kStopTag) {
        stop = true;
      } else if (tag == kListenTag) {
        accept_all();
      } else if (tag == kWakeTag) {
        uint64_t v;
        (void)!read(wake_.fd, &v, sizeof v);
        std::deque<std::pair<uint64_t, std::vector<uint8_t>>> rs;
        {
          std::lock_guard lk(mu_);
          rs.swap(replies_);
        }
        for (auto& [id, reply] : rs) {
          auto it = conns_.find(id);
          if (it == conns_.end()) continue;  // the client left meanwhile
          queue_reply(it->second, reply);
          if (!flush(id, it->second)) close_conn(id);
        }
      } else {
        auto it = conns_.find(tag);
        if (it == conns_.end()) continue;
        bool ok = true;
        if (evs[i].events & (EPOLLERR | EPOLLHUP)) ok = false;
        if (ok && (evs[i].events & EPOLLOUT)) ok = flush(tag, it->second);
        if (ok && (evs[i].events & (EPOLLIN | EPOLLRDHUP))) ok = read_conn(tag, it->second);
        if (!ok) close_conn(tag);
      }
    }
    if (stop) break;
    auto now = Clock::now();
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (now - it->second.last > idle)
        it = conns_.erase(it);
      else
        ++it;
    }
  }
  conns_.clear();
}

// ---------------------------------------------------------------------------------------

Server::Server(ServerOptions opts, const ZoneSlot* zones, Forwarder* forwarder, Metrics* metrics)
    : opts_(std::move(opts)),
      zones_(zones),
      forwarder_(forwarder),
      own_metrics_(metrics ? nullptr : std::make_unique<Metrics>(nullptr)),
      metrics_(metrics ? metrics : own_metrics_.get()) {}

Server::~Server() {
  stop();
}

Status Server::start() {
  if (!zones_->load()) return Error{"no zone published"};
  auto addr = make_addr(opts_.listen_address, opts_.port);
  if (!addr) return Error{"bad listen address " + opts_.listen_address};
  stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  uint16_t port = opts_.port;
  int family = addr->first.ss_family;
  auto bind_one = [&](int type, bool reuseport) -> std::optional<Fd> {
    Fd fd(socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.fd < 0) return std::nullopt;
    int one = 1;
    setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (reuseport) setsockopt(fd.fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    auto a = make_addr(opts_.listen_address, port);
    if (bind(fd.fd, reinterpret_cast<const sockaddr*>(&a->first), a->second) != 0)
      return std::nullopt;
    if (port == 0) port = bound_port(fd.fd);
    return fd;
  };
  // TCP first: with port 0 its port is the one the UDP sockets share.
  auto tcp = bind_one(SOCK_STREAM, false);
  if (!tcp || listen(tcp->fd, 1024) != 0)
    return Error{"dns: cannot listen on tcp " + opts_.listen_address + ":" +
                 std::to_string(opts_.port) + ": " + std::strerror(errno)};
  int workers = std::max(1, opts_.workers);
  for (int i = 0; i < workers; ++i) {
    auto udp = bind_one(SOCK_DGRAM, true);
    if (!udp)
      return Error{"dns: cannot bind udp " + opts_.listen_address + ":" + std::to_string(port) +
                   ": " + std::strerror(errno)};
    workers_.push_back(std::make_unique<Worker>(this, std::move(*udp)));
  }
  port_ = port;
  tcp_ = std::make_unique<TcpServer>(this, std::move(*tcp));
  if (auto st = tcp_->start(); !st) return st;
  for (auto& w : workers_) w->start();
  running_ = true;
  return {};
}

void Server::stop() {
  if (stop_fd_ < 0) return;
  uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof one);
  for (auto& w : workers_) w->join();
  if (tcp_) tcp_->join();
  // The forwarder's last callbacks send on the sockets and post to the TCP server: stop it
  // before they go away.
  if (forwarder_) forwarder_->stop();
  tcp_.reset();
  workers_.clear();
  close(stop_fd_);
  stop_fd_ = -1;
  running_ = false;
}

}  // namespace endpointd::dns
