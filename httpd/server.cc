// The epoll loop and its connections: accept under the caps, deadlines, reading request heads,
// answering them on the loop or handing them to the worker, writing queued output.
//
// The loop thread owns every connection; nothing on it blocks. Worker routes are handed to the
// one worker thread through Channel (one job at a time); the worker's bytes come back through
// Channel::out and an eventfd wakes the loop. A connection is known to the worker only by id,
// so the loop may close it at any time; the worker then learns it from Channel::cancelled.
// The worker and the channel are in server_worker.cc, a response's bytes in server_response.cc.
#include "httpd/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "httpd/server_internal.h"

namespace endpointd::httpd {

namespace {

constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = 1;
constexpr auto kTick = std::chrono::milliseconds(100);
constexpr auto kSweepEvery = std::chrono::milliseconds(50);
constexpr auto kLogEvery = std::chrono::seconds(10);
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

// Whether a comma-separated header value (Connection) holds this token, case-insensitively.
bool has_token(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    size_t comma = value.find(',');
    std::string_view item = value.substr(0, comma);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (iequals(item, token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

// Compares every byte of the expected token whatever the given one holds, so the time taken
// says nothing about how much of a guess was right.
bool token_matches(std::string_view given, std::string_view want) {
  unsigned diff = given.size() == want.size() ? 0u : 1u;
  for (size_t i = 0; i < want.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned>(g ^ static_cast<unsigned char>(want[i]));
  }
  return diff == 0;
}

std::string peer_address(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    sockaddr_in a{};
    std::memcpy(&a, &ss, sizeof a);
    inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    sockaddr_in6 a{};
    std::memcpy(&a, &ss, sizeof a);
    if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {
      in_addr v4{};
      std::memcpy(&v4, &a.sin6_addr.s6_addr[12], sizeof v4);
      inet_ntop(AF_INET, &v4, buf, sizeof buf);
    } else {
      inet_ntop(AF_INET6, &a.sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}

}  // namespace

Status Server::Impl::start(const model::HostPort& listen) {
  if (started_) return Error{name_ + ": already started"};
  std::string host = listen.host.empty() ? "0.0.0.0" : listen.host;
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_storage ss{};
  socklen_t len = 0;
  sockaddr_in v4{};
  sockaddr_in6 v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    v4.sin_port = htons(listen.port);
    std::memcpy(&ss, &v4, sizeof v4);
    len = sizeof v4;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(listen.port);
    std::memcpy(&ss, &v6, sizeof v6);
    len = sizeof v6;
  } else {
    return Error{name_ + ": listen address " + listen.str() + " is not an IP address"};
  }
  auto fail = [&](const char* what) {
    return Error{name_ + ": " + what + " " + listen.str() + ": " + std::strerror(errno)};
  };
  Fd lfd(socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (lfd.get() < 0) return fail("socket for");
  int one = 1;
  setsockopt(lfd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(lfd.get(), reinterpret_cast<const sockaddr*>(&ss), len) != 0) return fail("bind");
  if (::listen(lfd.get(), SOMAXCONN) != 0) return fail("listen on");
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  getsockname(lfd.get(), reinterpret_cast<sockaddr*>(&bound), &blen);
  // sin_port and sin6_port sit at the same offset, after the family.
  sockaddr_in bound4{};
  std::memcpy(&bound4, &bound, sizeof bound4);
  int port = ntohs(bound4.sin_port);

  Fd ep(epoll_create1(EPOLL_CLOEXEC));
  if (ep.get() < 0) return fail("epoll for");
  Fd wk(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wk.get() < 0) return fail("eventfd for");
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.u64 = kListenTag;
  epoll_ctl(ep.get(), EPOLL_CTL_ADD, lfd.get(), &e);
  e.data.u64 = kWakeTag;
  epoll_ctl(ep.get(), EPOLL_CTL_ADD, wk.get(), &e);

  listen_ = std::move(lfd);
  epoll_ = std::move(ep);
  wake_ = std::move(wk);
  port_ = port;
  started_ = true;
  loop_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "httpd-loop");
    loop_main();
  });
  worker_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "httpd-worker");
    worker_main();
  });
  spdlog::info("{}: HTTP server on {}:{}", name_, host, port);
  return {};
}

void Server::Impl::stop() {
  if (!started_) return;
  stopping_ = true;
  wake();
  if (loop_thread_.joinable()) loop_thread_.join();
  {
    std::lock_guard lk(mu_);
    worker_stop_ = true;
    cancelled_ = true;
  }
  cv_.notify_all();
  if (worker_thread_.joinable()) worker_thread_.join();
  listen_.reset();
  epoll_.reset();
  wake_.reset();
}

Stats Server::Impl::stats() const {
  auto d = [&](Drop why) { return drops_[static_cast<size_t>(why)].load(); };
  Stats s;
  s.accepted = accepted_.load();
  s.rejected_connection_cap = d(Drop::connection_cap);
  s.rejected_peer_cap = d(Drop::peer_cap);
  s.accept_errors = d(Drop::accept_error);
  s.header_timeouts = d(Drop::header_timeout);
  s.idle_closed = d(Drop::idle);
  s.write_timeouts = d(Drop::write_timeout);
  s.oversized_requests = d(Drop::oversized);
  s.bad_requests = d(Drop::bad_request);
  s.busy = d(Drop::busy);
  s.unauthorized = d(Drop::unauthorized);
  s.requests = requests_.load();
  s.open_connections = open_.load();
  return s;
}

// ---- loop thread ----

void Server::Impl::loop_main() {
  std::array<epoll_event, 256> evs{};
  while (!stopping_) {
    auto timeout = static_cast<int>(kTick.count());
    int n = epoll_wait(epoll_.get(), evs.data(), static_cast<int>(evs.size()), timeout);
    if (n < 0 && errno != EINTR) {
      spdlog::error("{}: epoll_wait: {}", name_, std::strerror(errno));
      break;
    }
    Clock::time_point now = Clock::now();
    for (int i = 0; i < n; ++i) {
      uint64_t tag = evs[static_cast<size_t>(i)].data.u64;
      if (tag == kListenTag) {
        accept_all(now);
      } else if (tag == kWakeTag) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_.get(), &v, sizeof v);
        pump_worker(now);
      } else {
        on_io(tag, evs[static_cast<size_t>(i)].events, now);
      }
    }
    if (now - last_sweep_ >= kSweepEvery) sweep(now);
  }
  std::vector<uint64_t> ids;
  for (auto& [id, c] : conns_) ids.push_back(id);
  for (uint64_t id : ids) close_conn(id);
  flush_logs(Clock::now(), true);
}

void Server::Impl::accept_all(Clock::time_point now) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = accept4(listen_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the listener stays readable, so stop watching it for a
      // moment instead of spinning; sweep() resumes it.
      note(Drop::accept_error, now, std::strerror(errno));
      epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listen_.get(), nullptr);
      listen_paused_ = true;
      listen_resume_ = now + kAcceptPause;
      return;
    }
    Fd sock(fd);
    std::string peer = peer_address(ss);
    if (conns_.size() >= limits_.max_connections) {
      note(Drop::connection_cap, now, "limit " + std::to_string(limits_.max_connections));
      continue;
    }
    size_t& from_peer = per_peer_[peer];
    if (from_peer >= limits_.max_connections_per_peer) {
      note(Drop::peer_cap, now,
           "limit " + std::to_string(limits_.max_connections_per_peer) + ", latest " + peer);
      continue;
    }
    ++from_peer;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t id = next_id_++;
    Conn& c = conns_[id];
    c.fd = std::move(sock);
    c.peer = std::move(peer);
    c.deadline = now + limits_.header_timeout;
    c.deadline_reason = Drop::header_timeout;
    c.events = EPOLLIN | EPOLLRDHUP;
    epoll_event e{};
    e.events = c.events;
    e.data.u64 = id;
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e);
    ++accepted_;
    open_ = conns_.size();
  }
}

void Server::Impl::on_io(uint64_t id, uint32_t events, Clock::time_point now) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;  // closed earlier in this batch
  Conn& c = it->second;
  if (events & (EPOLLERR | EPOLLHUP)) {
    close_conn(id);
    return;
  }
  if ((events & EPOLLOUT) && c.pending() > 0) {
    if (!flush(id, c, now)) return;
    if (!finish_if_sent(id, c, now)) return;
    if (c.state == State::reading) {
      advance(id, c, now);  // a pipelined request may be waiting in c.in
      return;
    }
  }
  if ((events & (EPOLLIN | EPOLLRDHUP)) && c.state == State::reading) {
    if (!read_some(c)) {
      close_conn(id);
      return;
    }
    advance(id, c, now);
  }
}

// Reads what the socket holds, up to one byte past the head limit. False: a socket error.
bool Server::Impl::read_some(Conn& c) {
  char buf[16384];
  while (c.in.size() <= limits_.max_request_bytes) {
    size_t room = std::min(sizeof buf, limits_.max_request_bytes + 1 - c.in.size());
    ssize_t n = recv(c.fd.get(), buf, room, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      c.peer_eof = true;
      return true;
    }
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
  return true;
}

// Serves every complete request head in c.in while the connection is reading (pipelined
// requests are answered in order, one at a time).
void Server::Impl::advance(uint64_t id, Conn& c, Clock::time_point now) {
  while (c.state == State::reading) {
    if (!c.in.empty() && c.deadline_reason == Drop::idle) {
      c.deadline = now + limits_.header_timeout;  // a new request began
      c.deadline_reason = Drop::header_timeout;
    }
    size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos || end + 4 > limits_.max_request_bytes) {
      if (c.in.size() > limits_.max_request_bytes || end != std::string::npos) {
        c.in.clear();
        refuse(c, 431, "request head too large\n", Drop::oversized, now);
        c.peer_eof = true;  // read no more from it
      } else if (c.peer_eof) {
        close_conn(id);  // hung up before finishing a request
        return;
      } else {
        set_interest(id, c);
        return;
      }
    } else {
      std::string head = c.in.substr(0, end);
      c.in.erase(0, end + 4);
      handle(c, id, head, now);
    }
    if (c.state == State::worker) {
      set_interest(id, c);
      return;
    }
    if (!flush(id, c, now)) return;
    if (!finish_if_sent(id, c, now)) return;
  }
}

bool Server::Impl::authorized(const Request& r) {
  std::lock_guard lk(token_mu_);
  if (token_.empty()) return true;
  std::string value = r.header("authorization");
  std::string_view auth = value;
  constexpr std::string_view kScheme = "bearer ";
  if (auth.size() < kScheme.size() || !iequals(auth.substr(0, kScheme.size()), kScheme))
    return token_matches("", token_);
  auth.remove_prefix(kScheme.size());
  while (!auth.empty() && auth.front() == ' ') auth.remove_prefix(1);
  return token_matches(auth, token_);
}

// Answers one request head: queues a response (state writing) or hands it to the worker.
void Server::Impl::handle(Conn& c, uint64_t id, std::string_view head, Clock::time_point now) {
  ++requests_;
  Result<Request> parsed = parse_request_head(head);
  if (!parsed) {
    refuse(c, 400, "bad request: " + parsed.error() + "\n", Drop::bad_request, now);
    return;
  }
  Request& req = *parsed;
  req.peer = c.peer;
  bool close = req.version_minor == 0 || c.peer_eof || has_token(req.header("connection"), "close");
  // No route takes a body, and one left unread would be parsed as the next request.
  if (req.headers.count("transfer-encoding")) {
    refuse(c, 400, "request bodies are not accepted\n", Drop::bad_request, now);
    return;
  }
  if (auto cl = req.headers.find("content-length"); cl != req.headers.end()) {
    const std::string& v = cl->second;
    bool zero = !v.empty() && v.find_first_not_of('0') == std::string::npos;
    if (!zero) {
      bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
      refuse(c, digits ? 413 : 400, "request bodies are not accepted\n", Drop::bad_request, now);
      return;
    }
  }
  bool head_only = req.method == "HEAD";
  if (req.method != "GET" && !head_only) {
    Response r = text(405, "method not allowed\n");
    r.headers.emplace_back("Allow", "GET, HEAD");
    queue(c, serialize(r, false, close), close, now);
    return;
  }
  auto route_it = routes_.find(req.path);
  if (route_it == routes_.end()) {
    queue(c, serialize(text(404, "not found\n"), head_only, close), close, now);
    return;
  }
  const Route& route = route_it->second;
  if (route.access == Access::token && !authorized(req)) {
    note(Drop::unauthorized, now, req.peer + " " + req.path);
    Response r = text(401, "unauthorized\n");
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    queue(c, serialize(r, head_only, close), close, now);
    return;
  }
  if (route.kind == Route::Kind::loop) {
    Response r;
    try {
      r = route.handler(req);
    } catch (const std::exception& e) {
      spdlog::error("{}: handler for {} threw: {}", name_, req.path, e.what());
      r = text(500, "internal error\n");
    }
    queue(c, serialize(r, head_only, close), close, now);
    return;
  }
  if (route.kind == Route::Kind::stream && route.check) {
    std::optional<Response> refused;
    try {
      Response r = route.check(req);
      if (r.status != 200) refused = std::move(r);
    } catch (const std::exception& e) {
      spdlog::error("{}: check for {} threw: {}", name_, req.path, e.what());
      refused = text(500, "internal error\n");
    }
    if (refused) {
      queue(c, serialize(*refused, head_only, close), close, now);
      return;
    }
  }
  if (route.kind == Route::Kind::stream && head_only) {
    queue(c, response_head(200, route.content_type, std::nullopt, !close, close, {}), close, now);
    return;
  }
  if (worker_busy_) {
    note(Drop::busy, now, req.path);
    Response r = text(503, "busy: one request of this kind at a time\n");
    r.headers.emplace_back("Retry-After", "1");
    queue(c, serialize(r, head_only, close), close, now);
    return;
  }
  // To the worker. A close-delimited stream (HTTP/1.0) always ends with the connection.
  Job job;
  job.route = &route;
  job.head_only = head_only;
  job.chunked = req.version_minor >= 1;
  job.close = close || (route.kind == Route::Kind::stream && !job.chunked);
  job.request = std::move(req);
  c.state = State::worker;
  c.close_after = job.close;
  c.deadline = Clock::time_point::max();
  worker_busy_ = true;
  job_conn_ = id;
  {
    std::lock_guard lk(mu_);
    out_.clear();
    loop_pending_ = c.pending();
    finished_ = abort_ = cancelled_ = false;
    job_ = std::move(job);
  }
  cv_.notify_all();
}

void Server::Impl::queue(Conn& c, std::string bytes, bool close, Clock::time_point now) {
  if (c.pending() == 0) {
    c.out = std::move(bytes);
    c.out_off = 0;
  } else {
    c.out += bytes;
  }
  c.state = State::writing;
  c.close_after = close;
  c.deadline = now + limits_.write_timeout;
  c.deadline_reason = Drop::write_timeout;
}

void Server::Impl::refuse(Conn& c, int status, std::string body, Drop why, Clock::time_point now) {
  note(why, now, c.peer);
  queue(c, serialize(text(status, std::move(body)), false, true), true, now);
}

// Sends what the socket takes. False: the connection was closed (an error).
bool Server::Impl::flush(uint64_t id, Conn& c, Clock::time_point now) {
  size_t before = c.pending();
  while (c.pending() > 0) {
    ssize_t n = send(c.fd.get(), c.out.data() + c.out_off, c.pending(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_conn(id);
    return false;
  }
  if (c.pending() == 0) {
    c.out.clear();
    c.out_off = 0;
  } else if (c.out_off > (1u << 16) && c.out_off > c.out.size() / 2) {
    c.out.erase(0, c.out_off);
    c.out_off = 0;
  }
  if (c.pending() < before) {
    // Progress: the write deadline counts from here.
    if (c.pending() > 0) {
      c.deadline = now + limits_.write_timeout;
      c.deadline_reason = Drop::write_timeout;
    } else if (c.state == State::worker) {
      c.deadline = Clock::time_point::max();  // waiting on the handler, not on the client
    }
  }
  if (id == job_conn_) report_pending(c);
  set_interest(id, c);
  return true;
}

// After a whole response went out: close, or wait for the next request. False: closed.
bool Server::Impl::finish_if_sent(uint64_t id, Conn& c, Clock::time_point now) {
  if (c.state != State::writing || c.pending() > 0) return true;
  if (c.close_after) {
    close_conn(id);
    return false;
  }
  c.state = State::reading;
  if (c.in.empty()) {
    c.deadline = now + limits_.idle_timeout;
    c.deadline_reason = Drop::idle;
  } else {
    c.deadline = now + limits_.header_timeout;
    c.deadline_reason = Drop::header_timeout;
  }
  set_interest(id, c);
  return true;
}

void Server::Impl::set_interest(uint64_t id, Conn& c) {
  uint32_t want = 0;
  if (c.state == State::reading && !c.peer_eof) want |= EPOLLIN | EPOLLRDHUP;
  if (c.pending() > 0) want |= EPOLLOUT;
  if (want == c.events) return;
  epoll_event e{};
  e.events = want;
  e.data.u64 = id;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &e);
  c.events = want;
}

void Server::Impl::sweep(Clock::time_point now) {
  last_sweep_ = now;
  std::vector<uint64_t> expired;
  for (auto& [id, c] : conns_)
    if (c.deadline <= now) expired.push_back(id);
  for (uint64_t id : expired) {
    Conn& c = conns_.at(id);
    note(c.deadline_reason, now, c.peer);
    close_conn(id);
  }
  if (listen_paused_ && now >= listen_resume_) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = kListenTag;
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listen_.get(), &e);
    listen_paused_ = false;
  }
  flush_logs(now, false);
}

void Server::Impl::close_conn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (id == job_conn_) {
    {
      std::lock_guard lk(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
    job_conn_ = 0;  // worker_busy_ stays set until the handler returns
  }
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.fd.get(), nullptr);
  auto p = per_peer_.find(it->second.peer);
  if (p != per_peer_.end() && --p->second == 0) per_peer_.erase(p);
  conns_.erase(it);
  open_ = conns_.size();
}

void Server::Impl::note(Drop why, Clock::time_point now, std::string_view detail) {
  auto i = static_cast<size_t>(why);
  ++drops_[i];
  LogState& l = logs_[i];
  ++l.unlogged;
  l.detail = std::string(detail);
  if (now - l.last >= kLogEvery || l.last == Clock::time_point{}) flush_logs(now, false);
}

// One line per reason with something new, at most once per kLogEvery (force: now).
void Server::Impl::flush_logs(Clock::time_point now, bool force) {
  for (size_t i = 0; i < logs_.size(); ++i) {
    LogState& l = logs_[i];
    if (l.unlogged == 0) continue;
    if (!force && l.last != Clock::time_point{} && now - l.last < kLogEvery) continue;
    auto level = static_cast<Drop>(i) == Drop::idle ? spdlog::level::debug : spdlog::level::warn;
    spdlog::log(level, "{}: {} {} since the last report ({} in all; latest: {})", name_, l.unlogged,
                kDropText[i], drops_[i].load(), l.detail);
    l.unlogged = 0;
    l.last = now;
  }
}

// ---- Server ----

Server::Server(Limits limits, std::string name)
    : impl_(std::make_unique<Impl>(limits, std::move(name))) {}

Server::~Server() {
  stop();
}

void Server::get(std::string path, Handler h, Access access) {
  Route r;
  r.kind = Route::Kind::loop;
  r.handler = std::move(h);
  r.access = access;
  impl_->add_route(std::move(path), std::move(r));
}

void Server::get_slow(std::string path, SlowHandler h, Access access) {
  Route r;
  r.kind = Route::Kind::worker;
  r.handler = std::move(h);
  r.access = access;
  impl_->add_route(std::move(path), std::move(r));
}

void Server::get_stream(std::string path, std::string content_type, StreamHandler h, Access access,
                        Handler check) {
  Route r;
  r.kind = Route::Kind::stream;
  r.stream = std::move(h);
  r.check = std::move(check);
  r.content_type = std::move(content_type);
  r.access = access;
  impl_->add_route(std::move(path), std::move(r));
}

void Server::set_bearer_token(std::string token) {
  impl_->set_bearer_token(std::move(token));
}

Status Server::start(const model::HostPort& listen) {
  return impl_->start(listen);
}

int Server::port() const {
  return impl_->port();
}

void Server::stop() {
  impl_->stop();
}

Stats Server::stats() const {
  return impl_->stats();
}

}  // namespace endpointd::httpd
