// A small bounded HTTP/1.1 server for endpointd's admin endpoints: one epoll loop thread, one
// worker thread, a cap on connections (in all and per client address), deadlines on request
// heads, idle keep-alive connections and stalled writes, and a cap on the output queued for a
// client. Health probes answer from the loop thread however many idle or slow clients there are.
//
// Timeouts, per connection:
//   header_timeout  from accept, or from the first byte of a later request on a keep-alive
//                   connection, until the end of the request head. Missed: closed, header_timeouts.
//   idle_timeout    a keep-alive connection after a response, until the first byte of the next
//                   request. Missed: closed, idle_closed (normal life, logged at debug level).
//   write_timeout   while output is queued and the client takes none of it. Missed: closed,
//                   write_timeouts (a stream handler's write() then returns false).
// Deadlines are checked on a 100 ms tick, so each fires up to ~150 ms late.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "httpd/request.h"
#include "model/hostport.h"
#include "model/result.h"

namespace endpointd::httpd {

struct Limits {
  // Open connections; one more is accepted and closed at once (rejected_connection_cap).
  size_t max_connections = 1024;
  // Open connections per client IP address; beyond: accepted and closed (rejected_peer_cap).
  size_t max_connections_per_peer = 256;
  // Request line plus headers; larger: 431 and close (oversized_requests).
  size_t max_request_bytes = 8192;
  std::chrono::milliseconds header_timeout{5000};
  std::chrono::milliseconds idle_timeout{30000};
  std::chrono::milliseconds write_timeout{10000};
  // Bytes queued for one connection. A stream handler's write() blocks while more than this is
  // unsent (so at most this plus one chunk is held); a whole response is queued as it is.
  size_t max_pending_output = 1 << 20;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  // Extra response headers. Content-Type, Content-Length, Transfer-Encoding and Connection are
  // the server's, and a header whose name or value holds CR, LF or NUL is left out.
  std::vector<std::pair<std::string, std::string>> headers;
};

// A stream handler writes its body in pieces. write() blocks while the client is behind by more
// than Limits::max_pending_output, and returns false once the client is gone (closed, dropped
// for a write timeout, or the server stopping): the handler should return then.
class Writer {
 public:
  virtual bool write(std::string_view chunk) = 0;
  virtual ~Writer() = default;
};

// Runs on the loop thread: must be cheap and must not block (health probes, small pages).
using Handler = std::function<Response(const Request&)>;
// Runs on the server's single worker thread, one request at a time.
using SlowHandler = std::function<Response(const Request&)>;
// Runs on the worker thread. The answer is 200 with the content type given at registration;
// the body is sent with chunked transfer-encoding (keep-alive) to HTTP/1.1 clients and
// delimited by closing the connection for HTTP/1.0 clients. A handler that throws ends the
// response by closing the connection without the final chunk, so the client sees it cut short.
using StreamHandler = std::function<void(const Request&, Writer&)>;

// Who may call a route: anyone, or (once set_bearer_token set a non-empty token) only a request
// with "Authorization: Bearer <token>".
enum class Access { open, token };

struct Stats {
  uint64_t accepted = 0;                 // connections taken into service (rejected ones not)
  uint64_t rejected_connection_cap = 0;  // closed at accept: max_connections open
  uint64_t rejected_peer_cap = 0;        // closed at accept: max_connections_per_peer open
  uint64_t accept_errors = 0;            // accept() failures (e.g. out of file descriptors)
  uint64_t header_timeouts = 0;          // closed: request head not complete in header_timeout
  uint64_t idle_closed = 0;              // closed: keep-alive connection idle for idle_timeout
  uint64_t write_timeouts = 0;           // closed: queued output not taken for write_timeout
  uint64_t oversized_requests = 0;       // 431 and closed
  uint64_t bad_requests = 0;             // unparsable head (400) or a body (400/413), closed
  uint64_t busy = 0;                     // 503: a worker route asked for while the worker ran
  uint64_t unauthorized = 0;             // 401 on a token route
  uint64_t requests = 0;                 // complete request heads read
  size_t open_connections = 0;
};

class Server {
 public:
  // name: how log lines call this server ("admin").
  explicit Server(Limits limits = {}, std::string name = "httpd");
  ~Server();  // stops
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes match the path exactly. Register them before start(); later calls are ignored (and
  // logged). GET and HEAD are served; other methods get 405.
  void get(std::string path, Handler h, Access access = Access::open);
  void get_slow(std::string path, SlowHandler h, Access access = Access::open);
  // `check`, if given, runs first on the loop thread (cheap: parameters only); an answer other
  // than 200 is sent instead of the stream (a bad query gets its 400 before any body).
  void get_stream(std::string path, std::string content_type, StreamHandler h,
                  Access access = Access::open, Handler check = nullptr);
  // The token Access::token routes require; "" (the default) leaves them open. Thread-safe;
  // compared in constant time.
  void set_bearer_token(std::string token);

  // Binds an IPv4 or IPv6 literal host ("" = 0.0.0.0, "localhost" = 127.0.0.1); port 0 picks
  // one. Starts the loop and worker threads.
  Status start(const model::HostPort& listen);
  int port() const;  // the bound port; -1 before start()
  // Closes every connection and joins both threads; safe to call twice; a stopped server does
  // not start again. A stream handler's write() returns false at once; a slow handler that is
  // running is waited for.
  void stop();
  Stats stats() const;  // thread-safe

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace endpointd::httpd
