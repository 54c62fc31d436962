// What server.cc (the loop and its connections), server_worker.cc (the worker thread and the
// channel to it) and server_response.cc (a response's bytes) share; internal to httpd/.
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "httpd/request.h"
#include "httpd/server.h"

namespace endpointd::httpd {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Why a connection was refused or dropped, or a request turned away: one counter and one
// rate-limited log line each.
enum class Drop {
  connection_cap,
  peer_cap,
  accept_error,
  header_timeout,
  idle,
  write_timeout,
  oversized,
  bad_request,
  busy,
  unauthorized,
  count_
};

inline constexpr std::array<const char*, static_cast<size_t>(Drop::count_)> kDropText = {
    "connections refused at the connection cap",
    "connections refused at the per-client cap",
    "accept() failures",
    "connections closed: request head not complete in time",
    "idle keep-alive connections closed",
    "connections closed: client took no output in time",
    "requests with oversized heads (431)",
    "bad requests (400/413)",
    "requests for the busy worker (503)",
    "requests without the right bearer token (401)",
};

// server_response.cc: a response's status line and headers, and a whole response as bytes.
bool iequals(std::string_view a, std::string_view b);
std::string response_head(int status, std::string_view content_type,
                          std::optional<size_t> content_length, bool chunked, bool close,
                          const std::vector<std::pair<std::string, std::string>>& extra);
std::string serialize(const Response& r, bool head_only, bool close);
Response text(int status, std::string body);

struct Route {
  enum class Kind { loop, worker, stream } kind = Kind::loop;
  Handler handler;  // loop and worker routes
  StreamHandler stream;
  Handler check;  // stream routes: a request it answers (bad parameters) is not streamed
  std::string content_type;
  Access access = Access::open;
};

// reading: waiting for (the rest of) a request head. worker: the worker thread answers; its
// bytes arrive through the channel. writing: a whole response is queued; once it is sent the
// connection goes back to reading, or is closed.
enum class State { reading, worker, writing };

struct Conn {
  Fd fd;
  std::string peer;
  std::string in;
  std::string out;
  size_t out_off = 0;  // bytes of out already sent
  State state = State::reading;
  bool close_after = false;  // close once the response is sent
  bool peer_eof = false;
  uint32_t events = 0;  // the epoll interest set
  Clock::time_point deadline = Clock::time_point::max();
  Drop deadline_reason = Drop::header_timeout;

  size_t pending() const { return out.size() - out_off; }
};

struct Job {
  Request request;
  const Route* route = nullptr;
  bool head_only = false;  // HEAD: the answer without its body
  bool chunked = true;     // HTTP/1.1 stream: chunked; HTTP/1.0: close-delimited
  bool close = false;
};

class Server::Impl {
 public:
  Impl(Limits limits, std::string name) : limits_(limits), name_(std::move(name)) {}
  ~Impl() { stop(); }

  void add_route(std::string path, Route r) {
    if (started_) {
      spdlog::error("{}: route {} registered after start; ignored", name_, path);
      return;
    }
    routes_[std::move(path)] = std::move(r);
  }

  void set_bearer_token(std::string token) {
    std::lock_guard lk(token_mu_);
    token_ = std::move(token);
  }

  Status start(const model::HostPort& listen);
  void stop();
  int port() const { return port_.load(); }
  Stats stats() const;

 private:
  // Loop thread.
  void loop_main();
  void accept_all(Clock::time_point now);
  void on_io(uint64_t id, uint32_t events, Clock::time_point now);
  bool read_some(Conn& c);
  void advance(uint64_t id, Conn& c, Clock::time_point now);
  void handle(Conn& c, uint64_t id, std::string_view head, Clock::time_point now);
  void queue(Conn& c, std::string bytes, bool close, Clock::time_point now);
  void refuse(Conn& c, int status, std::string body, Drop why, Clock::time_point now);
  bool flush(uint64_t id, Conn& c, Clock::time_point now);
  bool finish_if_sent(uint64_t id, Conn& c, Clock::time_point now);
  void set_interest(uint64_t id, Conn& c);
  void pump_worker(Clock::time_point now);
  void report_pending(const Conn& c);
  void sweep(Clock::time_point now);
  void close_conn(uint64_t id);
  void note(Drop why, Clock::time_point now, std::string_view detail = {});
  void flush_logs(Clock::time_point now, bool force);
  bool authorized(const Request& r);

  // Worker thread.
  void worker_main();
  void run_job(Job& job);
  void wake();

  class ChannelWriter;

  const Limits limits_;
  const std::string name_;
  std::unordered_map<std::string, Route> routes_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int> port_{-1};

  std::mutex token_mu_;
  std::string token_;

  Fd listen_, epoll_, wake_;
  std::thread loop_thread_, worker_thread_;

  // Loop-thread state.
  std::unordered_map<uint64_t, Conn> conns_;
  std::unordered_map<std::string, size_t> per_peer_;
  uint64_t next_id_ = 2;
  bool worker_busy_ = false;  // set at dispatch, cleared when the worker reports finished
  uint64_t job_conn_ = 0;     // the connection the worker answers; 0 once it is closed
  bool listen_paused_ = false;
  Clock::time_point listen_resume_{};
  Clock::time_point last_sweep_{};
  struct LogState {
    Clock::time_point last{};
    uint64_t unlogged = 0;
    std::string detail;
  };
  std::array<LogState, static_cast<size_t>(Drop::count_)> logs_{};

  // Between the loop and the worker, under mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> job_;
  std::string out_;          // bytes from the worker the loop has not taken yet
  size_t loop_pending_ = 0;  // bytes the loop holds unsent for the job's connection
  bool finished_ = false;    // the job is done; out_ holds its last bytes
  bool abort_ = false;       // ...and the connection must be closed after them
  bool cancelled_ = false;   // the job's connection is gone
  bool worker_stop_ = false;

  // Counters, written by the loop and read by stats().
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Drop::count_)> drops_{};
  std::atomic<uint64_t> accepted_{0}, requests_{0};
  std::atomic<size_t> open_{0};
};

}  // namespace endpointd::httpd
