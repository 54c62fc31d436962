// c-ares forwarding: one thread owns the channel; workers hand it requests through a queue
// and an eventfd. Replies go back through each request's callback.
#include "dns/forwarder.h"

#include <pthread.h>
#include <algorithm>
#include <cstring>

#include <ares.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <prometheus/histogram.h>
#include <spdlog/spdlog.h>

namespace endpointd::dns {

struct Forwarder::Channel {
  ares_channel ch = nullptr;
  ~Channel() {
    if (ch) ares_destroy(ch);
  }
};

struct Forwarder::Request {
  Forwarder* self = nullptr;
  Query q;
  std::string key;
  Done done;
  Clock::time_point started;
};

std::string cache_key(const Query& q) {
  std::string k(q.qname_lower.view());
  k.push_back(static_cast<char>(q.qtype >> 8));
  k.push_back(static_cast<char>(q.qtype & 0xFF));
  k.push_back(q.edns ? 'e' : '-');
  return k;
}

Forwarder::Forwarder(ForwarderOptions opts) : opts_(std::move(opts)) {}

Forwarder::~Forwarder() {
  stop();
}

Status Forwarder::start() {
  static const int lib = ares_library_init(ARES_LIB_INIT_ALL);
  if (lib != ARES_SUCCESS) return Error{std::string("ares_library_init: ") + ares_strerror(lib)};
  channel_ = std::make_unique<Channel>();
  ares_options o{};
  // Pass every upstream rcode through instead of trying the next server on SERVFAIL/REFUSED.
  o.flags = ARES_FLAG_NOCHECKRESP;
  o.timeout = static_cast<int>(opts_.timeout.count());
  o.tries = opts_.tries;
  int rc =
      ares_init_options(&channel_->ch, &o, ARES_OPT_FLAGS | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES);
  if (rc != ARES_SUCCESS) return Error{std::string("ares_init_options: ") + ares_strerror(rc)};
  if (!opts_.upstreams.empty()) {
    std::string csv;
    for (const auto& u : opts_.upstreams) csv += (csv.empty() ? "" : ",") + u;
    rc = ares_set_servers_ports_csv(channel_->ch, csv.c_str());
    if (rc != ARES_SUCCESS) return Error{"bad upstream list '" + csv + "': " + ares_strerror(rc)};
  }
  if (metrics_) metrics_->forward_to(upstream_label());
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Error{std::string("eventfd: ") + std::strerror(errno)};
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "dns-forward");
    run();
  });
  return {};
}

// The upstreams as c-ares has them (the configured ones, or /etc/resolv.conf's): "ADDR:PORT"
// or "[V6]:PORT", comma-separated, for CoreDNS's `to` label.
std::string Forwarder::upstream_label() const {
  ares_addr_port_node* list = nullptr;
  if (ares_get_servers_ports(channel_->ch, &list) != ARES_SUCCESS) return "unknown";
  std::string out;
  for (auto* n = list; n; n = n->next) {
    char text[INET6_ADDRSTRLEN] = {};
    ares_inet_ntop(n->family, &n->addr, text, sizeof text);
    int port = n->udp_port ? n->udp_port : 53;
    if (!out.empty()) out += ',';
    out += n->family == AF_INET6 ? "[" + std::string(text) + "]" : std::string(text);
    out += ":" + std::to_string(port);
  }
  ares_free_data(list);
  return out.empty() ? "none" : out;
}

void Forwarder::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  thread_.join();
  channel_.reset();  // completes what is in flight with ARES_EDESTRUCTION
  close(wake_fd_);
  wake_fd_ = -1;
}

size_t Forwarder::cache_size() const {
  std::lock_guard lk(cache_mu_);
  return cache_.size();
}

size_t Forwarder::cached(const Query& q, uint8_t* out, size_t cap) {
  std::string key = cache_key(q);
  auto now = opts_.now();
  std::lock_guard lk(cache_mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    cache_misses_++;
    if (metrics_) metrics_->cache_miss();
    return 0;
  }
  CacheEntry& e = it->second;
  if (now >= e.expires) {
    age_.erase(e.age);
    cache_.erase(it);
    cache_misses_++;
    if (metrics_) metrics_->cache_miss();
    return 0;
  }
  if (e.msg.size() > cap) return 0;
  std::memcpy(out, e.msg.data(), e.msg.size());
  store_u16(out, q.id);
  // Echo the asker's case: the cached question has the same length.
  if (e.msg.size() >= kHeaderSize + q.qname.len)
    std::memcpy(out + kHeaderSize, q.qname.bytes.data(), q.qname.len);
  auto age = static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::seconds>(now - e.stored).count());
  for (const auto& [off, ttl] : e.ttls) store_u32(out + off, ttl > age ? ttl - age : 0);
  cache_hits_++;
  if (metrics_) metrics_->cache_hit();
  return e.msg.size();
}

bool Forwarder::forward(const Query& q, Done done) {
  if (inflight_.fetch_add(1) >= opts_.max_inflight) {
    inflight_--;
    shed_++;
    if (metrics_) metrics_->forward_shed();
    return false;
  }
  auto r = std::make_unique<Request>();
  r->self = this;
  r->q = q;
  r->key = cache_key(q);
  r->done = std::move(done);
  r->started = Clock::now();
  {
    std::lock_guard lk(queue_mu_);
    queue_.push_back(std::move(r));
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  return true;
}

void Forwarder::store(const std::string& key, std::span<uint8_t> reply) {
  auto m = parse_message(reply);
  if (!m || m->tc()) return;
  uint32_t ttl = 0;
  CacheEntry e;
  if (m->rcode == 0 && !m->answer.empty()) {
    ttl = UINT32_MAX;
    for (const auto& r : m->answer) ttl = std::min(ttl, r.ttl);
    ttl = std::min(ttl, opts_.cache_max_ttl);
  } else if (m->rcode == 0 || m->rcode == 3) {
    // Negative answers live as long as the SOA allows (RFC 2308): min(TTL, MINIMUM).
    for (const auto& r : m->authority)
      if (r.type == type::kSOA && r.rdata.size() >= 20)
        ttl = std::min(r.ttl, load_u32(r.rdata.data() + r.rdata.size() - 4));
    ttl = std::min(ttl, opts_.cache_denial_max_ttl);
  }
  if (ttl == 0) return;
  // No record may outlive the entry, in this reply or in any served from the cache.
  for (const auto* sec : {&m->answer, &m->authority, &m->additional})
    for (const auto& r : *sec) {
      e.ttls.emplace_back(r.ttl_offset, std::min(r.ttl, ttl));
      if (r.ttl > ttl) store_u32(reply.data() + r.ttl_offset, ttl);
    }
  e.msg.assign(reply.begin(), reply.end());
  e.stored = opts_.now();
  e.expires = e.stored + std::chrono::seconds(ttl);
  if (opts_.cache_entries == 0) return;
  std::lock_guard lk(cache_mu_);
  if (auto it = cache_.find(key); it != cache_.end()) {
    age_.splice(age_.end(), age_, it->second.age);  // now the youngest
    e.age = it->second.age;
    it->second = std::move(e);
    return;
  }
  // Bounded: the oldest stored goes. It is also the first to expire when TTLs are alike; an
  // earlier version scanned the whole cache for expired entries on every store once full,
  // which at 100,000 entries cut forwarding of new names to a quarter.
  while (cache_.size() >= opts_.cache_entries && !age_.empty()) {
    auto old = cache_.find(age_.front());
    if (old != cache_.end() && old->second.expires > e.stored) {
      uint64_t n = ++evictions_;
      if (metrics_) metrics_->cache_eviction();
      if ((n & (n - 1)) == 0)  // the 1st, 2nd, 4th...: a log line without a flood
        spdlog::info("dns: forwarding cache full ({} entries): {} unexpired entries evicted so far",
                     opts_.cache_entries, n);
    }
    if (old != cache_.end()) cache_.erase(old);
    age_.pop_front();
  }
  age_.push_back(key);
  e.age = std::prev(age_.end());
  cache_.emplace(key, std::move(e));
}

void Forwarder::finish(Request* r, int status, std::span<const uint8_t> reply) {
  uint8_t buf[kMaxNameWire + 64];
  if (status == ARES_SUCCESS && reply.size() >= kHeaderSize) {
    std::vector<uint8_t> copy(reply.begin(), reply.end());
    store_u16(copy.data(), r->q.id);  // c-ares chose its own ID upstream
    if (metrics_)
      metrics_->forward_response(copy[3] & 0xF,
                                 std::chrono::duration<double>(Clock::now() - r->started).count());
    store(r->key, copy);
    r->done(copy);
  } else {
    errors_++;
    if (metrics_) metrics_->forward_error();
    if (status != ARES_EDESTRUCTION)
      spdlog::debug("dns: forwarding {} failed: {}", name_to_text(r->q.qname.span()),
                    ares_strerror(status));
    // SERVFAIL with the question.
    Writer w(buf, sizeof buf);
    w.header(r->q.id,
             static_cast<uint16_t>(flag::kQR | flag::kRA | (r->q.flags & (flag::kRD | flag::kCD)) |
                                   static_cast<uint16_t>(Rcode::kServFail)),
             1, 0, 0, 0);
    w.name(r->q.qname.span(), false);
    w.u16(r->q.qtype);
    w.u16(r->q.qclass);
    r->done({buf, w.size()});
  }
  if (metrics_ && metrics_->forward_latency)
    metrics_->forward_latency->Observe(
        std::chrono::duration<double>(Clock::now() - r->started).count());
  inflight_--;
}

void Forwarder::on_answer(void* arg, int status, int, unsigned char* abuf, int alen) {
  std::unique_ptr<Request> r(static_cast<Request*>(arg));
  std::span<const uint8_t> reply;
  if (abuf && alen > 0) reply = {abuf, static_cast<size_t>(alen)};
  r->self->finish(r.get(), status, reply);
}

void Forwarder::run() {
  uint8_t qbuf[kMaxNameWire + 64];
  while (true) {
    std::deque<std::unique_ptr<Request>> batch;
    {
      std::lock_guard lk(queue_mu_);
      batch.swap(queue_);
    }
    for (auto& r : batch) {
      size_t n = write_query(0, r->q.qname.span(), r->q.qtype, true, r->q.edns ? kOurUdpSize : 0,
                             qbuf, sizeof qbuf);
      Request* raw = r.release();
      if (metrics_) metrics_->forward_request();
      ares_send(channel_->ch, qbuf, static_cast<int>(n), &Forwarder::on_answer, raw);
    }
    if (stopping_) break;
    ares_socket_t socks[ARES_GETSOCK_MAXNUM];
    int bits = ares_getsock(channel_->ch, socks, ARES_GETSOCK_MAXNUM);
    pollfd fds[ARES_GETSOCK_MAXNUM + 1];
    nfds_t n = 0;
    fds[n++] = {wake_fd_, POLLIN, 0};
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      short ev = 0;
      if (ARES_GETSOCK_READABLE(bits, i)) ev |= POLLIN;
      if (ARES_GETSOCK_WRITABLE(bits, i)) ev |= POLLOUT;
      if (ev) fds[n++] = {socks[i], ev, 0};
    }
    timeval tv{1, 0}, maxtv{1, 0};
    timeval* t = ares_timeout(channel_->ch, &maxtv, &tv);
    int ms = static_cast<int>(t->tv_sec * 1000 + t->tv_usec / 1000) + 1;
    int ready = poll(fds, n, ms);
    if (ready < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    bool any = false;
    for (nfds_t i = 1; i < n; ++i) {
      if (!fds[i].revents) continue;
      any = true;
      ares_socket_t rd =
          (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) ? fds[i].fd : ARES_SOCKET_BAD;
      ares_socket_t wr = (fds[i].revents & POLLOUT) ? fds[i].fd : ARES_SOCKET_BAD;
      ares_process_fd(channel_->ch, rd, wr);
    }
    if (!any) ares_process_fd(channel_->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
  }
  // Requests queued after the last pass are answered SERVFAIL.
  std::lock_guard lk(queue_mu_);
  for (auto& r : queue_) finish(r.get(), ARES_EDESTRUCTION, {});
  queue_.clear();
}

}  // namespace endpointd::dns
