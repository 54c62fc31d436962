// httpd::Server's interface on libmicrohttpd 0.9.75 (one epoll thread inside the library, one
// worker thread of ours), built only to measure it against httpd/server.cc with the same tests
// and driver (bench/results/httpd.md). Limits map onto the library's options where it has one:
// the connection caps through the accept-policy callback (so they are counted), a per-connection
// inactivity timeout (whole seconds) switched between header, write and idle values as a request
// moves on, the request head through the per-connection memory pool, the worker through
// suspend/resume, a stream through a content-reader callback fed by the worker.
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "httpd/server.h"

namespace endpointd::httpd {
namespace {

using Clock = std::chrono::steady_clock;

enum class Kind { loop, slow, stream };

struct Route {
  Kind kind = Kind::loop;
  Handler handler;  // loop route, or a stream's check
  SlowHandler slow;
  StreamHandler stream;
  std::string content_type;
  Access access = Access::open;
};

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string lowered(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}

bool server_header(std::string_view name) {
  std::string l = lowered(name);
  return l == "content-type" || l == "content-length" || l == "transfer-encoding" ||
         l == "connection";
}

bool header_safe(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

bool token_matches(std::string_view given, std::string_view want) {
  unsigned diff = given.size() == want.size() ? 0u : 1u;
  for (size_t i = 0; i < want.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned>(g ^ static_cast<unsigned char>(want[i]));
  }
  return diff == 0;
}

std::string peer_address(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa == nullptr) return "";
  if (sa->sa_family == AF_INET) {
    sockaddr_in a{};
    std::memcpy(&a, sa, sizeof a);
    inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    sockaddr_in6 a{};
    std::memcpy(&a, sa, sizeof a);
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

// The library's timeouts are whole seconds; a shorter limit is rounded up.
unsigned seconds_of(std::chrono::milliseconds ms) {
  return static_cast<unsigned>((ms.count() + 999) / 1000);
}

Response text(int status, std::string body) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

// What a stream's content-reader callback takes from the worker. Shared by the worker's Writer
// and the library's response (freed by its free callback).
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::string pending;
  size_t cap = 0;
  bool done = false;       // the handler returned
  bool failed = false;     // the handler threw
  bool gone = false;       // the connection ended (or the server stops)
  bool suspended = false;  // the callback found nothing and suspended the connection
  MHD_Connection* conn = nullptr;
};

// Per request, from the URI-log callback (request line read) to NOTIFY_COMPLETED.
struct RequestState {
  std::string uri;    // raw target, query included
  bool seen = false;  // the first access-handler call (answered on the second)
  bool dispatched = false;
  bool answered = false;
  std::optional<Response> ready;  // a worker route's answer
  bool head_only = false;
  std::shared_ptr<Stream> stream;
};

enum class Phase { head, busy, idle };

// Per connection, from NOTIFY_CONNECTION started to closed.
struct ConnState {
  std::string peer;
  Phase phase = Phase::head;
  Clock::time_point phase_since = Clock::now();
};

}  // namespace

class Server::Impl {
 public:
  Impl(Limits limits, std::string name) : limits_(limits), name_(std::move(name)) {}
  ~Impl() { stop(); }

  void add(std::string path, Route r) {
    if (started_) {
      spdlog::error("{}: route {} registered after start; ignored", name_, path);
      return;
    }
    routes_[std::move(path)] = std::move(r);
  }
  void set_token(std::string t) {
    std::lock_guard lk(token_mu_);
    token_ = std::move(t);
  }
  Status start(const model::HostPort& listen);
  void stop();
  Stats stats() const;
  int port() const { return port_; }

 private:
  struct Job {
    const Route* route = nullptr;
    Request request;
    MHD_Connection* conn = nullptr;
    RequestState* state = nullptr;
    std::shared_ptr<Stream> stream;
  };

  static MHD_Result on_accept(void* cls, const sockaddr* addr, socklen_t len);
  static void on_connection(void* cls, MHD_Connection* c, void** socket_context,
                            MHD_ConnectionNotificationCode code);
  static void* on_uri(void* cls, const char* uri, MHD_Connection* c);
  static MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method,
                               const char* version, const char* upload, size_t* upload_size,
                               void** con_cls);
  static void on_completed(void* cls, MHD_Connection* c, void** con_cls,
                           MHD_RequestTerminationCode toe);
  static ssize_t on_read(void* cls, uint64_t pos, char* buf, size_t max);
  static void on_free(void* cls);
  static void on_log(void* cls, const char* fmt, va_list ap);

  MHD_Result handle(MHD_Connection* c, const char* method, const char* version, RequestState& st);
  MHD_Result send(MHD_Connection* c, const Response& r, bool close = false);
  void set_timeout(MHD_Connection* c, std::chrono::milliseconds t) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, seconds_of(t));
  }
  ConnState* conn_state(MHD_Connection* c) {
    const MHD_ConnectionInfo* i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? static_cast<ConnState*>(i->socket_context) : nullptr;
  }
  bool authorized(const Request& r) {
    std::lock_guard lk(token_mu_);
    if (token_.empty()) return true;
    std::string auth = r.header("authorization");
    if (auth.size() < 7 || lowered(auth.substr(0, 7)) != "bearer ") return false;
    return token_matches(std::string_view(auth).substr(7), token_);
  }
  void worker_main();

  Limits limits_;
  std::string name_;
  std::map<std::string, Route, std::less<>> routes_;
  std::mutex token_mu_;
  std::string token_;
  bool started_ = false;
  bool stopped_ = false;
  int port_ = -1;
  int listen_fd_ = -1;
  MHD_Daemon* daemon_ = nullptr;

  // Touched on the library's thread only.
  std::map<std::string, size_t> per_peer_;
  size_t open_ = 0;
  bool named_ = false;
  std::atomic<uint64_t> log_lines_{0};
  Clock::time_point last_log_{};

  std::mutex mu_;  // the worker's job, the open streams
  std::condition_variable worker_cv_;
  std::optional<Job> job_;
  bool worker_busy_ = false;
  std::atomic<bool> stopping_{false};
  std::vector<std::weak_ptr<Stream>> streams_;
  std::thread worker_;

  struct Counters {
    std::atomic<uint64_t> accepted{0}, rejected_connection_cap{0}, rejected_peer_cap{0},
        header_timeouts{0}, idle_closed{0}, write_timeouts{0}, oversized_requests{0},
        bad_requests{0}, busy{0}, unauthorized{0}, requests{0};
    std::atomic<size_t> open{0};
  } n_;
};

Status Server::Impl::start(const model::HostPort& listen) {
  if (started_ || stopped_) return Error{name_ + ": already started"};
  std::string host = listen.host.empty() ? "0.0.0.0" : listen.host;
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in v4{};
  sockaddr_in6 v6{};
  int family;
  if (inet_pton(AF_INET, host.c_str(), &v4.sin_addr) == 1) {
    family = AF_INET;
    v4.sin_family = AF_INET;
    v4.sin_port = htons(listen.port);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6.sin6_addr) == 1) {
    family = AF_INET6;
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(listen.port);
  } else {
    return Error{name_ + ": listen address " + listen.str() + " is not an IP address"};
  }
  auto fail = [&](const char* what) {
    return Error{name_ + ": " + what + " " + listen.str() + ": " + std::strerror(errno)};
  };
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail("socket for");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = family == AF_INET ? bind(fd, reinterpret_cast<const sockaddr*>(&v4), sizeof v4)
                             : bind(fd, reinterpret_cast<const sockaddr*>(&v6), sizeof v6);
  if (rc != 0 || ::listen(fd, SOMAXCONN) != 0) {
    Status s = fail("bind");
    close(fd);
    return s;
  }
  sockaddr_in6 bound{};
  socklen_t blen = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  port_ = ntohs(bound.sin6_port);  // sin_port sits at the same offset

  // The pool holds the request head and the output buffer: the head's cap plus room to write.
  size_t pool = limits_.max_request_bytes * 2;
  unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  if (family == AF_INET6) flags |= MHD_USE_IPv6;
  daemon_ = MHD_start_daemon(
      flags, 0, &Impl::on_accept, this, &Impl::on_request, this, MHD_OPTION_EXTERNAL_LOGGER,
      &Impl::on_log, this, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned>(limits_.max_connections + 1), MHD_OPTION_CONNECTION_TIMEOUT,
      seconds_of(limits_.header_timeout), MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool,
      MHD_OPTION_NOTIFY_CONNECTION, &Impl::on_connection, this, MHD_OPTION_NOTIFY_COMPLETED,
      &Impl::on_completed, this, MHD_OPTION_URI_LOG_CALLBACK, &Impl::on_uri, this, MHD_OPTION_END);
  if (daemon_ == nullptr) {
    close(fd);
    return Error{name_ + ": libmicrohttpd did not start on " + listen.str()};
  }
  listen_fd_ = fd;
  started_ = true;
  worker_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "httpd-worker");
    worker_main();
  });
  spdlog::info("{}: HTTP server (libmicrohttpd) on {}:{}", name_, host, port_);
  return {};
}

void Server::Impl::stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& w : streams_)
      if (auto s = w.lock()) {
        std::lock_guard sl(s->mu);
        s->gone = true;
        s->cv.notify_all();
      }
  }
  worker_cv_.notify_all();
  worker_.join();  // a running slow handler is waited for; a stream's write() returns false
  {
    // The library must not be stopped with a connection suspended: resume the streams that wait.
    std::lock_guard lk(mu_);
    for (auto& w : streams_)
      if (auto s = w.lock()) {
        std::lock_guard sl(s->mu);
        if (s->suspended) {
          s->suspended = false;
          MHD_resume_connection(s->conn);
        }
      }
  }
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
  close(listen_fd_);
  n_.open = 0;
}

Stats Server::Impl::stats() const {
  Stats s;
  s.accepted = n_.accepted;
  s.rejected_connection_cap = n_.rejected_connection_cap;
  s.rejected_peer_cap = n_.rejected_peer_cap;
  s.header_timeouts = n_.header_timeouts;
  s.idle_closed = n_.idle_closed;
  s.write_timeouts = n_.write_timeouts;
  s.oversized_requests = n_.oversized_requests;
  s.bad_requests = n_.bad_requests;
  s.busy = n_.busy;
  s.unauthorized = n_.unauthorized;
  s.requests = n_.requests;
  s.open_connections = n_.open;
  return s;  // accept_errors: the library reports none
}

MHD_Result Server::Impl::on_accept(void* cls, const sockaddr* addr, socklen_t) {
  auto* self = static_cast<Impl*>(cls);
  if (!self->named_) {
    pthread_setname_np(pthread_self(), "httpd-loop");
    self->named_ = true;
  }
  if (self->open_ >= self->limits_.max_connections) {
    ++self->n_.rejected_connection_cap;
    return MHD_NO;
  }
  if (self->per_peer_[peer_address(addr)] >= self->limits_.max_connections_per_peer) {
    ++self->n_.rejected_peer_cap;
    return MHD_NO;
  }
  return MHD_YES;
}

void Server::Impl::on_connection(void* cls, MHD_Connection* c, void** socket_context,
                                 MHD_ConnectionNotificationCode code) {
  auto* self = static_cast<Impl*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    auto* cs = new ConnState;
    const MHD_ConnectionInfo* i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    cs->peer = peer_address(i ? i->client_addr : nullptr);
    *socket_context = cs;
    ++self->per_peer_[cs->peer];
    ++self->open_;
    ++self->n_.accepted;
    self->n_.open = self->open_;
    return;
  }
  auto* cs = static_cast<ConnState*>(*socket_context);
  if (cs == nullptr) return;
  // The library says why a request ended (on_completed), not why a connection without one did:
  // one closed at or past its deadline with no byte of a request (idle after an answer, or silent
  // since accept) is taken for that timeout.
  auto in_phase = Clock::now() - cs->phase_since;
  auto past = [&](std::chrono::milliseconds t) {
    return in_phase >= std::chrono::seconds(seconds_of(t)) - std::chrono::milliseconds(50);
  };
  if (!self->stopping_ && cs->phase == Phase::idle && past(self->limits_.idle_timeout))
    ++self->n_.idle_closed;
  if (!self->stopping_ && cs->phase == Phase::head && past(self->limits_.header_timeout))
    ++self->n_.header_timeouts;
  auto it = self->per_peer_.find(cs->peer);
  if (it != self->per_peer_.end() && --it->second == 0) self->per_peer_.erase(it);
  --self->open_;
  self->n_.open = self->open_;
  delete cs;
  *socket_context = nullptr;
}

void* Server::Impl::on_uri(void* cls, const char* uri, MHD_Connection* c) {
  auto* self = static_cast<Impl*>(cls);
  if (ConnState* cs = self->conn_state(c); cs != nullptr && cs->phase == Phase::idle) {
    cs->phase = Phase::head;
    cs->phase_since = Clock::now();
    self->set_timeout(c, self->limits_.header_timeout);
  }
  auto* st = new RequestState;
  st->uri = uri ? uri : "";
  return st;
}

void Server::Impl::on_completed(void* cls, MHD_Connection* c, void** con_cls,
                                MHD_RequestTerminationCode toe) {
  auto* self = static_cast<Impl*>(cls);
  auto* st = static_cast<RequestState*>(*con_cls);
  // A request the access handler never saw timed out in its head (the URI-log callback made it).
  ConnState* cs = self->conn_state(c);
  if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED && !self->stopping_) {
    if (st != nullptr && !st->seen)
      ++self->n_.header_timeouts;
    else
      ++self->n_.write_timeouts;
  }
  if (cs != nullptr && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) cs->phase = Phase::busy;
  if (st != nullptr && st->stream) {
    std::lock_guard sl(st->stream->mu);
    st->stream->gone = true;
    st->stream->cv.notify_all();
  }
  if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
    if (cs != nullptr) {
      cs->phase = Phase::idle;
      cs->phase_since = Clock::now();
    }
    self->set_timeout(c, self->limits_.idle_timeout);
  }
  delete st;
  *con_cls = nullptr;
}

void Server::Impl::on_log(void* cls, const char* fmt, va_list ap) {
  // The library logs each failed accept() (and busy-waits on EMFILE): one line a second at most.
  auto* self = static_cast<Impl*>(cls);
  ++self->log_lines_;
  auto now = Clock::now();
  if (now - self->last_log_ < std::chrono::seconds(1)) return;
  self->last_log_ = now;
  char buf[512];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  std::string_view line(buf);
  while (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  spdlog::warn("{}: libmicrohttpd ({} messages in all): {}", self->name_, self->log_lines_.load(),
               line);
}

MHD_Result Server::Impl::send(MHD_Connection* c, const Response& r, bool close) {
  MHD_Response* resp = MHD_create_response_from_buffer(
      r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
  if (resp == nullptr) return MHD_NO;
  if (header_safe(r.content_type))
    MHD_add_response_header(resp, "Content-Type", r.content_type.c_str());
  for (const auto& [name, value] : r.headers) {
    if (name.empty() || !header_safe(name) || !header_safe(value) ||
        name.find(':') != std::string::npos || server_header(name))
      continue;
    MHD_add_response_header(resp, name.c_str(), value.c_str());
  }
  if (close) MHD_add_response_header(resp, "Connection", "close");
  MHD_Result ok = MHD_queue_response(c, static_cast<unsigned>(r.status), resp);
  MHD_destroy_response(resp);
  return ok;
}

MHD_Result Server::Impl::on_request(void* cls, MHD_Connection* c, const char*, const char* method,
                                    const char* version, const char*, size_t* upload_size,
                                    void** con_cls) {
  auto* self = static_cast<Impl*>(cls);
  auto* st = static_cast<RequestState*>(*con_cls);
  if (st == nullptr) return MHD_NO;
  // 0.9.75 closes the connection after a response queued in the first call for a request: so a
  // request is answered on the second call, unless it has a body (refused, and closed).
  if (!st->seen) {
    st->seen = true;
    const char* cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    bool body = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding") != nullptr ||
                (cl != nullptr && std::string_view(cl) != "0");
    if (!body) return MHD_YES;
  }
  if (st->answered) {  // a body the request should not have had
    *upload_size = 0;
    return MHD_YES;
  }
  if (st->ready) {  // the worker's answer, after resume
    st->answered = true;
    return self->send(c, *st->ready);
  }
  if (st->dispatched) return MHD_YES;
  st->answered = true;
  *upload_size = 0;
  return self->handle(c, method, version, *st);
}

MHD_Result Server::Impl::handle(MHD_Connection* c, const char* method, const char* version,
                                RequestState& st) {
  ++n_.requests;
  ConnState* cs = conn_state(c);
  if (cs != nullptr) {
    cs->phase = Phase::busy;
    cs->phase_since = Clock::now();
  }
  set_timeout(c, limits_.write_timeout);
  Request req;
  req.method = method;
  size_t q = st.uri.find('?');
  req.path = st.uri.substr(0, q);
  if (q != std::string::npos) req.query = st.uri.substr(q + 1);
  req.version_minor = std::string_view(version) == "HTTP/1.0" ? 0 : 1;
  if (cs != nullptr) req.peer = cs->peer;
  MHD_get_connection_values(
      c, MHD_HEADER_KIND,
      [](void* out, MHD_ValueKind, const char* k, const char* v) {
        auto& h = static_cast<Request*>(out)->headers;
        std::string name = lowered(k);
        auto [it, fresh] = h.emplace(name, v ? v : "");
        if (!fresh) it->second += std::string(", ") + (v ? v : "");
        return MHD_YES;
      },
      &req);

  std::string cl = req.header("content-length");
  if (!req.header("transfer-encoding").empty()) {
    ++n_.bad_requests;
    return send(c, text(400, "request bodies are not accepted\n"), true);
  }
  if (!cl.empty() && cl != "0") {
    ++n_.bad_requests;
    return send(c, text(413, "request bodies are not accepted\n"), true);
  }
  if (req.method != "GET" && req.method != "HEAD") {
    Response r = text(405, "method not allowed\n");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return send(c, r);
  }
  auto it = routes_.find(req.path);
  if (it == routes_.end()) return send(c, text(404, "not found\n"));
  const Route& route = it->second;
  if (route.access == Access::token && !authorized(req)) {
    ++n_.unauthorized;
    Response r = text(401, "unauthorized\n");
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return send(c, r);
  }
  if (route.kind == Kind::loop) {
    try {
      return send(c, route.handler(req));
    } catch (const std::exception& e) {
      spdlog::error("{}: handler for {} threw: {}", name_, req.path, e.what());
      return send(c, text(500, "internal error\n"));
    }
  }
  if (route.kind == Kind::stream && route.handler) {
    Response checked;
    try {
      checked = route.handler(req);
    } catch (const std::exception& e) {
      checked = text(500, "internal error\n");
    }
    if (checked.status != 200) return send(c, checked);
  }
  bool head = req.method == "HEAD";
  if (route.kind == Kind::stream && head) {
    // The head alone: a body-less chunked response (the reader is never asked for a HEAD).
    MHD_Response* resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 1024,
        [](void*, uint64_t, char*, size_t) -> ssize_t { return MHD_CONTENT_READER_END_OF_STREAM; },
        nullptr, nullptr);
    MHD_add_response_header(resp, "Content-Type", route.content_type.c_str());
    MHD_Result ok = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ok;
  }
  std::unique_lock lk(mu_);
  if (worker_busy_ || stopping_) {
    lk.unlock();
    ++n_.busy;
    Response r = text(503, "busy\n");
    r.headers.emplace_back("Retry-After", "1");
    return send(c, r);
  }
  worker_busy_ = true;
  Job job;
  job.route = &route;
  job.conn = c;
  job.state = &st;
  if (route.kind == Kind::slow) {
    job.request = std::move(req);
    job_ = std::move(job);
    st.dispatched = true;
    st.answered = false;
    MHD_suspend_connection(c);  // resumed by the worker with st.ready set
    lk.unlock();
    worker_cv_.notify_all();
    return MHD_YES;
  }
  auto stream = std::make_shared<Stream>();
  stream->cap = limits_.max_pending_output;
  stream->conn = c;
  std::erase_if(streams_, [](const std::weak_ptr<Stream>& w) { return w.expired(); });
  streams_.push_back(stream);
  st.stream = stream;
  job.stream = stream;
  job.request = std::move(req);
  job_ = std::move(job);
  lk.unlock();
  worker_cv_.notify_all();
  auto* hold = new std::shared_ptr<Stream>(stream);
  MHD_Response* resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024,
                                                         &Impl::on_read, hold, &Impl::on_free);
  MHD_add_response_header(resp, "Content-Type", route.content_type.c_str());
  MHD_Result ok = MHD_queue_response(c, 200, resp);
  MHD_destroy_response(resp);
  return ok;
}

ssize_t Server::Impl::on_read(void* cls, uint64_t, char* buf, size_t max) {
  Stream& s = **static_cast<std::shared_ptr<Stream>*>(cls);
  std::lock_guard lk(s.mu);
  if (!s.pending.empty()) {
    size_t n = std::min(max, s.pending.size());
    std::memcpy(buf, s.pending.data(), n);
    s.pending.erase(0, n);
    s.cv.notify_all();
    return static_cast<ssize_t>(n);
  }
  if (s.gone || s.failed) return MHD_CONTENT_READER_END_WITH_ERROR;
  if (s.done) return MHD_CONTENT_READER_END_OF_STREAM;
  s.suspended = true;
  MHD_suspend_connection(s.conn);  // the worker resumes it when it writes or ends
  return 0;
}

void Server::Impl::on_free(void* cls) {
  delete static_cast<std::shared_ptr<Stream>*>(cls);
}

void Server::Impl::worker_main() {
  while (true) {
    std::unique_lock lk(mu_);
    worker_cv_.wait(lk, [&] { return job_.has_value() || stopping_; });
    if (!job_) return;
    Job job = std::move(*job_);
    job_.reset();
    lk.unlock();
    if (job.route->kind == Kind::slow) {
      try {
        job.state->ready = job.route->slow(job.request);
      } catch (const std::exception& e) {
        spdlog::error("{}: handler for {} threw: {}", name_, job.request.path, e.what());
        job.state->ready = text(500, "internal error\n");
      }
      lk.lock();
      worker_busy_ = false;
      lk.unlock();
      MHD_resume_connection(job.conn);
      continue;
    }
    Stream& s = *job.stream;
    class StreamWriter : public Writer {
     public:
      explicit StreamWriter(Stream& s) : s_(s) {}
      bool write(std::string_view chunk) override {
        std::unique_lock lk(s_.mu);
        s_.cv.wait(lk, [&] { return s_.gone || s_.pending.size() <= s_.cap; });
        if (s_.gone) return false;
        s_.pending.append(chunk);
        if (s_.suspended) {
          s_.suspended = false;
          MHD_resume_connection(s_.conn);
        }
        return true;
      }

     private:
      Stream& s_;
    } writer(s);
    bool threw = false;
    try {
      job.route->stream(job.request, writer);
    } catch (const std::exception& e) {
      spdlog::error("{}: stream handler for {} threw: {}", name_, job.request.path, e.what());
      threw = true;
    }
    {
      std::lock_guard sl(s.mu);
      s.done = true;
      s.failed = threw;
      if (s.suspended && !s.gone) {
        s.suspended = false;
        MHD_resume_connection(s.conn);
      }
    }
    lk.lock();
    worker_busy_ = false;
  }
}

Server::Server(Limits limits, std::string name)
    : impl_(std::make_unique<Impl>(limits, std::move(name))) {}
Server::~Server() {
  stop();
}
void Server::get(std::string path, Handler h, Access access) {
  Route r;
  r.kind = Kind::loop;
  r.handler = std::move(h);
  r.access = access;
  impl_->add(std::move(path), std::move(r));
}
void Server::get_slow(std::string path, SlowHandler h, Access access) {
  Route r;
  r.kind = Kind::slow;
  r.slow = std::move(h);
  r.access = access;
  impl_->add(std::move(path), std::move(r));
}
void Server::get_stream(std::string path, std::string content_type, StreamHandler h, Access access,
                        Handler check) {
  Route r;
  r.kind = Kind::stream;
  r.stream = std::move(h);
  r.handler = std::move(check);
  r.content_type = std::move(content_type);
  r.access = access;
  impl_->add(std::move(path), std::move(r));
}
void Server::set_bearer_token(std::string token) {
  impl_->set_token(std::move(token));
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
