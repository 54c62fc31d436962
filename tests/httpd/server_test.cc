// The bounded HTTP server over loopback: routing, keep-alive, and the bounds that keep health
// probes answering under idle, slow and never-reading clients.
#include "httpd/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace endpointd::httpd {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// A blocking loopback client socket with a 5 s receive timeout, so a broken server fails a test
// instead of hanging it. rcvbuf > 0: a small receive buffer, set before connecting.
Socket client_socket(int rcvbuf = 0) {
  Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (rcvbuf > 0) setsockopt(s.fd(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  timeval tv{5, 0};
  setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return s;
}

bool connect_loopback(const Socket& s, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
}

Socket dial(int port, int rcvbuf = 0) {
  Socket s = client_socket(rcvbuf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) return Socket();
  return s;
}

bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Whether the server closed the connection within the timeout (EOF or reset; anything it sent
// before is skipped).
bool closed_by_server(int fd, std::chrono::milliseconds timeout = 3000ms) {
  auto until = Clock::now() + timeout;
  char buf[4096];
  while (Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
    if (poll(&p, 1, std::max(left, 1)) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && (errno == ECONNRESET || errno == EPIPE)) return true;
  }
  return false;
}

struct Reply {
  int status = 0;                              // 0: no (complete) reply
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// Reads HTTP responses off one connection, keeping what arrives beyond one for the next.
class Client {
 public:
  explicit Client(int port, int rcvbuf = 0) : s_(dial(port, rcvbuf)) {}
  explicit Client(Socket connected) : s_(std::move(connected)) {}
  int fd() const { return s_.fd(); }
  bool send(std::string_view data) { return send_all(s_.fd(), data); }

  Reply get(const std::string& target, const std::string& extra_headers = "") {
    if (!send("GET " + target + " HTTP/1.1\r\nHost: t\r\n" + extra_headers + "\r\n")) return {};
    return read_reply();
  }

  Reply read_reply(bool head_only = false) {
    Reply r;
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos)
      if (!fill()) return r;
    std::string head = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    size_t line_end = head.find("\r\n");
    std::string status_line = head.substr(0, line_end);
    if (status_line.rfind("HTTP/1.1 ", 0) != 0) return r;
    int status = std::stoi(status_line.substr(9, 3));
    size_t pos = line_end;
    while (pos != std::string::npos && pos < head.size()) {
      size_t next = head.find("\r\n", pos + 2);
      std::string line =
          head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      r.headers[name] = line.substr(colon + 2);
      pos = next;
    }
    if (head_only) {
      r.status = status;
      return r;
    }
    if (r.headers.count("content-length")) {
      size_t len = std::stoul(r.headers["content-length"]);
      while (buf_.size() < len)
        if (!fill()) return r;
      r.body = buf_.substr(0, len);
      buf_.erase(0, len);
    } else if (r.headers.count("transfer-encoding") &&
               r.headers["transfer-encoding"] == "chunked") {
      while (true) {
        size_t le;
        while ((le = buf_.find("\r\n")) == std::string::npos)
          if (!fill()) return r;
        size_t n = std::stoul(buf_.substr(0, le), nullptr, 16);
        while (buf_.size() < le + 2 + n + 2)
          if (!fill()) return r;
        r.body.append(buf_, le + 2, n);
        buf_.erase(0, le + 2 + n + 2);
        if (n == 0) break;
      }
    } else {
      while (fill()) {
      }
      r.body = std::move(buf_);
      buf_.clear();
    }
    r.status = status;
    return r;
  }

 private:
  bool fill() {
    char tmp[65536];
    ssize_t n = recv(s_.fd(), tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  Socket s_;
  std::string buf_;
};

Response text(std::string body) {
  Response r;
  r.body = std::move(body);
  return r;
}

// Polls a condition (the server's counters move on its own thread) until it holds or time is up.
bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 5000ms) {
  auto until = Clock::now() + timeout;
  while (Clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

size_t thread_count() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

std::chrono::milliseconds since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
}

// A one-shot gate a handler on the worker thread waits on.
class Gate {
 public:
  void open() {
    std::lock_guard lk(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds timeout = 10000ms) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class ServerTest : public ::testing::Test {
 protected:
  void start(Limits limits = {}) {
    server_ = std::make_unique<Server>(limits, "test");
    server_->get("/livez", [](const Request&) { return text("ok\n"); });
    for (auto& [path, fn] : extra_) fn(*server_);
    Status s = server_->start(model::HostPort{"127.0.0.1", 0});
    ASSERT_TRUE(s.ok()) << s.error();
    port_ = server_->port();
    ASSERT_GT(port_, 0);
  }
  void route(std::function<void(Server&)> fn) { extra_.emplace_back("", std::move(fn)); }

  // /livez on a fresh connection: the time it took; fails the test on a wrong answer.
  std::chrono::milliseconds probe() {
    auto t0 = Clock::now();
    Client c(port_);
    Reply r = c.get("/livez", "Connection: close\r\n");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "ok\n");
    return since(t0);
  }

  std::unique_ptr<Server> server_;
  std::vector<std::pair<std::string, std::function<void(Server&)>>> extra_;
  int port_ = 0;
};

TEST_F(ServerTest, GetNotFoundMethodAndHead) {
  start();
  Client c(port_);
  Reply r = c.get("/livez");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
  EXPECT_EQ(r.headers["content-type"], "text/plain");
  EXPECT_EQ(r.headers["content-length"], "3");
  r = c.get("/nope");
  EXPECT_EQ(r.status, 404);
  ASSERT_TRUE(c.send("DELETE /livez HTTP/1.1\r\n\r\n"));
  r = c.read_reply();
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "GET, HEAD");
  ASSERT_TRUE(c.send("HEAD /livez HTTP/1.1\r\n\r\n"));
  r = c.read_reply(true);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-length"], "3");
  // No body followed the HEAD answer: the next reply parses cleanly on the same connection.
  r = c.get("/livez");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
  EXPECT_EQ(server_->stats().requests, 5u);
  EXPECT_EQ(server_->stats().accepted, 1u);
}

TEST_F(ServerTest, KeepAliveAndClose) {
  start();
  Client c(port_);
  EXPECT_EQ(c.get("/livez").status, 200);
  EXPECT_EQ(c.get("/livez").status, 200);
  EXPECT_EQ(server_->stats().accepted, 1u);  // both on one connection
  Reply r = c.get("/livez", "Connection: close\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_TRUE(closed_by_server(c.fd()));

  Client old(port_);
  ASSERT_TRUE(old.send("GET /livez HTTP/1.0\r\n\r\n"));
  r = old.read_reply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
  EXPECT_TRUE(closed_by_server(old.fd()));
  EXPECT_TRUE(eventually([&] { return server_->stats().open_connections == 0; }));
}

TEST_F(ServerTest, PipelinedRequestsAnsweredInOrder) {
  route([](Server& s) { s.get("/a", [](const Request&) { return text("A"); }); });
  route([](Server& s) { s.get("/b", [](const Request&) { return text("B"); }); });
  start();
  Client c(port_);
  ASSERT_TRUE(c.send("GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\nGET /a HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(c.read_reply().body, "A");
  EXPECT_EQ(c.read_reply().body, "B");
  EXPECT_EQ(c.read_reply().body, "A");
}

TEST_F(ServerTest, QueryParameters) {
  route([](Server& s) {
    s.get("/q", [](const Request& r) {
      return text(r.param("name") + "|" + r.param("enc") + "|" + r.param("missing") + "|" +
                  r.query + "|" + r.peer);
    });
  });
  start();
  Client c(port_);
  Reply r = c.get("/q?name=hello%20world+x&enc=%2Fa%3Db");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello world x|/a=b||name=hello%20world+x&enc=%2Fa%3Db|127.0.0.1");
}

TEST_F(ServerTest, RequestBodiesAndGarbageAreRefusedAndClosed) {
  start();
  {
    Client c(port_);
    ASSERT_TRUE(c.send("GET /livez HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"));
    EXPECT_EQ(c.read_reply().status, 413);
    EXPECT_TRUE(closed_by_server(c.fd()));
  }
  {
    Client c(port_);
    ASSERT_TRUE(c.send("GET /livez HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"));
    EXPECT_EQ(c.read_reply().status, 400);
    EXPECT_TRUE(closed_by_server(c.fd()));
  }
  {
    Client c(port_);
    ASSERT_TRUE(c.send("this is not http\r\n\r\n"));
    EXPECT_EQ(c.read_reply().status, 400);
    EXPECT_TRUE(closed_by_server(c.fd()));
  }
  {
    Client c(port_);  // Content-Length: 0 is no body
    Reply r = c.get("/livez", "Content-Length: 0\r\n");
    EXPECT_EQ(r.status, 200);
  }
  EXPECT_EQ(server_->stats().bad_requests, 3u);
}

TEST_F(ServerTest, OversizedHeadGets431AndIsClosed) {
  Limits l;
  l.max_request_bytes = 1024;
  start(l);
  {
    Client c(port_);
    Reply r = c.get("/livez", "X-Big: " + std::string(2000, 'a') + "\r\n");
    EXPECT_EQ(r.status, 431);
    EXPECT_TRUE(closed_by_server(c.fd()));
  }
  {
    Client c(port_);  // no end of head in sight: refused once past the limit
    ASSERT_TRUE(c.send("GET /livez HTTP/1.1\r\nX-Big: " + std::string(1100, 'a')));
    EXPECT_EQ(c.read_reply().status, 431);
    EXPECT_TRUE(closed_by_server(c.fd()));
  }
  {
    Client c(port_);  // just under the limit is fine
    Reply r = c.get("/livez", "X-Big: " + std::string(900, 'a') + "\r\n");
    EXPECT_EQ(r.status, 200);
  }
  EXPECT_EQ(server_->stats().oversized_requests, 2u);
}

TEST_F(ServerTest, SlowlorisDoesNotDelayLivezAndIsClosedAtHeaderTimeout) {
  Limits l;
  l.header_timeout = 2000ms;
  start(l);
  constexpr int kSlow = 50;
  std::vector<Socket> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(dial(port_));
    ASSERT_TRUE(send_all(slow.back().fd(), "GET /livez HTTP/1.1\r\n"));
  }
  ASSERT_TRUE(eventually([&] { return server_->stats().open_connections == kSlow; }));
  auto t0 = Clock::now();
  auto next_byte = t0;
  std::chrono::milliseconds worst{0};
  int probes = 0;
  // One header byte per connection every 500 ms; /livez from fresh clients all along.
  while (since(t0) < 1600ms) {
    if (Clock::now() >= next_byte) {
      for (auto& s : slow) send_all(s.fd(), "X");
      next_byte += 500ms;
    }
    worst = std::max(worst, probe());
    ++probes;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LT(worst, 1000ms);
  EXPECT_GE(probes, 10);
  EXPECT_EQ(server_->stats().header_timeouts, 0u);  // not before the deadline
  EXPECT_TRUE(eventually([&] { return server_->stats().header_timeouts == kSlow; }, 3000ms));
  for (auto& s : slow) EXPECT_TRUE(closed_by_server(s.fd(), 1000ms));
  EXPECT_EQ(server_->stats().header_timeouts, static_cast<uint64_t>(kSlow));
  EXPECT_LT(probe(), 1000ms);
  std::printf("slowloris: %d probes, slowest %lld ms\n", probes,
              static_cast<long long>(worst.count()));
}

TEST_F(ServerTest, ThousandIdleConnectionsCostNoThreadsAndTheCapHolds) {
  constexpr size_t kIdle = 1000, kCap = 1010;
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 2 * kCap + 200) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, 2 * kCap + 200);
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < 2 * kCap + 200) GTEST_SKIP() << "needs " << 2 * kCap + 200 << " descriptors";
  Limits l;
  l.max_connections = kCap;
  l.max_connections_per_peer = 5000;
  l.header_timeout = 60000ms;
  start(l);
  size_t threads_before = thread_count();
  std::vector<Socket> idle;
  for (size_t i = 0; i < kIdle; ++i) {
    idle.push_back(dial(port_));
    ASSERT_GE(idle.back().fd(), 0);
  }
  ASSERT_TRUE(eventually([&] { return server_->stats().open_connections == kIdle; }));
  EXPECT_EQ(thread_count(), threads_before);
  std::chrono::milliseconds worst{0};
  for (int i = 0; i < 10; ++i) worst = std::max(worst, probe());
  EXPECT_LT(worst, 1000ms);
  ASSERT_TRUE(eventually([&] { return server_->stats().open_connections == kIdle; }));
  // 20 more: 10 fit under the cap, 10 are closed at once.
  std::vector<Socket> extra;
  for (int i = 0; i < 20; ++i) extra.push_back(dial(port_));
  EXPECT_TRUE(eventually([&] { return server_->stats().rejected_connection_cap == 10; }));
  EXPECT_EQ(server_->stats().open_connections, kCap);
  int closed = 0;
  for (auto& s : extra) closed += closed_by_server(s.fd(), 200ms) ? 1 : 0;
  EXPECT_EQ(closed, 10);
  EXPECT_EQ(thread_count(), threads_before);
  std::printf("1000 idle: slowest of 10 probes %lld ms\n", static_cast<long long>(worst.count()));
}

TEST_F(ServerTest, PerPeerCap) {
  Limits l;
  l.max_connections_per_peer = 3;
  start(l);
  std::vector<Socket> socks;
  for (int i = 0; i < 5; ++i) socks.push_back(dial(port_));
  EXPECT_TRUE(eventually([&] { return server_->stats().rejected_peer_cap == 2; }));
  EXPECT_EQ(server_->stats().open_connections, 3u);
  int closed = 0;
  for (auto& s : socks) closed += closed_by_server(s.fd(), 200ms) ? 1 : 0;
  EXPECT_EQ(closed, 2);
  // Once one closes, the address may connect again.
  socks.clear();
  EXPECT_TRUE(eventually([&] { return server_->stats().open_connections == 0; }));
  EXPECT_LT(probe(), 1000ms);
  EXPECT_EQ(server_->stats().rejected_peer_cap, 2u);
}

TEST_F(ServerTest, IdleKeepAliveConnectionIsClosed) {
  Limits l;
  l.idle_timeout = 300ms;
  start(l);
  Client c(port_);
  EXPECT_EQ(c.get("/livez").status, 200);
  auto t0 = Clock::now();
  EXPECT_TRUE(closed_by_server(c.fd(), 2000ms));
  EXPECT_GE(since(t0), 250ms);
  EXPECT_EQ(server_->stats().idle_closed, 1u);
  EXPECT_EQ(server_->stats().header_timeouts, 0u);
}

TEST_F(ServerTest, SlowRouteRunsOnTheWorker) {
  std::thread::id loop_thread, worker_thread;
  route([&](Server& s) {
    s.get("/where", [&](const Request&) {
      loop_thread = std::this_thread::get_id();
      return text("loop");
    });
    s.get_slow("/slow", [&](const Request& r) {
      worker_thread = std::this_thread::get_id();
      Response resp = text("slow " + r.param("n"));
      resp.status = 202;
      resp.content_type = "application/json";
      resp.headers.emplace_back("X-Extra", "1");
      resp.headers.emplace_back("X-Evil", "a\r\nInjected: 1");
      resp.headers.emplace_back("content-length", "99");
      return resp;
    });
    s.get_slow("/throws", [](const Request&) -> Response { throw std::runtime_error("boom"); });
  });
  start();
  Client c(port_);
  Reply r = c.get("/slow?n=7");
  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.body, "slow 7");
  EXPECT_EQ(r.headers["content-type"], "application/json");
  EXPECT_EQ(r.headers["x-extra"], "1");
  EXPECT_EQ(r.headers.count("x-evil"), 0u);
  EXPECT_EQ(r.headers.count("injected"), 0u);
  ASSERT_TRUE(c.send("HEAD /slow?n=8 HTTP/1.1\r\n\r\n"));
  r = c.read_reply(true);
  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.headers["content-length"], "6");
  EXPECT_EQ(c.get("/throws").status, 500);  // and no HEAD body came before it
  EXPECT_EQ(c.get("/where").status, 200);   // keep-alive after worker answers
  EXPECT_NE(loop_thread, worker_thread);
  EXPECT_NE(worker_thread, std::this_thread::get_id());
}

TEST_F(ServerTest, StreamIsChunkedAndKeepsTheConnection) {
  constexpr size_t kChunk = 65536, kChunks = 64;  // 4 MiB
  route([&](Server& s) {
    s.get_stream("/stream", "application/json", [&](const Request&, Writer& w) {
      std::string chunk(kChunk, 'x');
      for (size_t i = 0; i < kChunks; ++i) {
        chunk[0] = static_cast<char>('a' + i % 26);
        if (!w.write(chunk)) return;
      }
    });
  });
  Limits l;
  l.max_pending_output = 256 * 1024;
  start(l);
  Client c(port_);
  Reply r = c.get("/stream");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "application/json");
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  ASSERT_EQ(r.body.size(), kChunk * kChunks);
  for (size_t i = 0; i < kChunks; ++i)
    EXPECT_EQ(r.body[i * kChunk], static_cast<char>('a' + i % 26)) << i;
  EXPECT_EQ(c.get("/livez").status, 200);                // same connection
  ASSERT_TRUE(c.send("HEAD /stream HTTP/1.1\r\n\r\n"));  // the head alone; no handler runs
  r = c.read_reply(true);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  EXPECT_EQ(c.get("/livez").body, "ok\n");

  Client old(port_);  // HTTP/1.0: delimited by close
  ASSERT_TRUE(old.send("GET /stream HTTP/1.0\r\n\r\n"));
  r = old.read_reply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("transfer-encoding"), 0u);
  EXPECT_EQ(r.body.size(), kChunk * kChunks);
}

TEST_F(ServerTest, NeverReadingStreamClientIsDroppedAfterWriteTimeout) {
  constexpr size_t kChunk = 64 * 1024, kTotal = 64 * 1024 * 1024;
  std::promise<std::pair<bool, size_t>> done;  // (write returned false, bytes written)
  route([&](Server& s) {
    s.get_stream("/big", "text/plain", [&](const Request&, Writer& w) {
      std::string chunk(kChunk, 'z');
      size_t written = 0;
      bool refused = false;
      while (written < kTotal) {
        if (!w.write(chunk)) {
          refused = true;
          break;
        }
        written += kChunk;
      }
      done.set_value({refused, written});
    });
  });
  Limits l;
  l.write_timeout = 1000ms;
  start(l);
  Client sink(port_, 4096);
  ASSERT_TRUE(sink.send("GET /big HTTP/1.1\r\n\r\n"));
  auto t0 = Clock::now();
  // Meanwhile other clients do not notice.
  std::chrono::milliseconds worst{0};
  auto result = done.get_future();
  while (result.wait_for(50ms) != std::future_status::ready && since(t0) < 10000ms)
    worst = std::max(worst, probe());
  ASSERT_EQ(result.wait_for(0ms), std::future_status::ready);
  auto [refused, written] = result.get();
  EXPECT_TRUE(refused);
  EXPECT_LT(written, kTotal);
  EXPECT_GE(since(t0), 900ms);
  EXPECT_LT(worst, 1000ms);
  EXPECT_EQ(server_->stats().write_timeouts, 1u);
  EXPECT_TRUE(closed_by_server(sink.fd(), 5000ms));
  EXPECT_LT(probe(), 1000ms);
  std::printf("never-reading client: %zu bytes written before the drop after %lld ms\n", written,
              static_cast<long long>(since(t0).count()));
}

TEST_F(ServerTest, NeverReadingClientOfAWholeResponseIsDropped) {
  route([](Server& s) {
    s.get("/huge", [](const Request&) { return text(std::string(16 << 20, 'h')); });
  });
  Limits l;
  l.write_timeout = 500ms;
  start(l);
  Client sink(port_, 4096);
  ASSERT_TRUE(sink.send("GET /huge HTTP/1.1\r\n\r\n"));
  auto t0 = Clock::now();
  EXPECT_TRUE(eventually([&] { return server_->stats().write_timeouts == 1; }));
  EXPECT_GE(since(t0), 400ms);
  EXPECT_TRUE(closed_by_server(sink.fd()));
  EXPECT_EQ(server_->stats().open_connections, 0u);
  EXPECT_LT(probe(), 1000ms);
}

TEST_F(ServerTest, WorkerBusyAnswers503AtOnce) {
  Gate entered, release;
  route([&](Server& s) {
    s.get_stream("/stream", "text/plain", [&](const Request&, Writer& w) {
      entered.open();
      release.wait();
      w.write("done");
    });
    s.get_slow("/slow", [](const Request&) { return text("slow"); });
  });
  start();
  Client first(port_);
  ASSERT_TRUE(first.send("GET /stream HTTP/1.1\r\n\r\n"));
  ASSERT_TRUE(entered.wait());
  auto t0 = Clock::now();
  Client second(port_);
  Reply r = second.get("/slow");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_LT(since(t0), 500ms);
  EXPECT_EQ(server_->stats().busy, 1u);
  EXPECT_LT(probe(), 1000ms);  // loop routes are not held up
  release.open();
  r = first.read_reply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "done");
  // Free again once the stream ended.
  EXPECT_TRUE(eventually([&] {
    Reply again = second.get("/slow");
    return again.status == 200 && again.body == "slow";
  }));
}

TEST_F(ServerTest, BearerToken) {
  route([](Server& s) {
    s.get(
        "/debug/state", [](const Request&) { return text("secret"); }, Access::token);
    s.get_slow(
        "/debug/slow", [](const Request&) { return text("slow secret"); }, Access::token);
  });
  start();
  server_->set_bearer_token("s3cret-token");
  Client c(port_);
  Reply r = c.get("/debug/state");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.headers["www-authenticate"], "Bearer");
  EXPECT_EQ(c.get("/debug/state", "Authorization: Bearer s3cret-tokeX\r\n").status, 401);
  EXPECT_EQ(c.get("/debug/state", "Authorization: Bearer s3cret\r\n").status, 401);
  EXPECT_EQ(c.get("/debug/state", "Authorization: Basic s3cret-token\r\n").status, 401);
  r = c.get("/debug/state", "Authorization: Bearer s3cret-token\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "secret");
  EXPECT_EQ(c.get("/debug/state", "authorization: bearer s3cret-token\r\n").status, 200);
  EXPECT_EQ(c.get("/debug/slow").status, 401);
  EXPECT_EQ(c.get("/debug/slow", "Authorization: Bearer s3cret-token\r\n").status, 200);
  EXPECT_EQ(c.get("/livez").status, 200);  // open route: no token needed
  EXPECT_EQ(server_->stats().unauthorized, 5u);
  server_->set_bearer_token("");  // no token: open
  EXPECT_EQ(c.get("/debug/state").status, 200);
}

TEST_F(ServerTest, StopWithABlockedStreamReturnsPromptly) {
  std::atomic<bool> entered{false};
  std::atomic<bool> refused{false};
  route([&](Server& s) {
    s.get_stream("/big", "text/plain", [&](const Request&, Writer& w) {
      std::string chunk(64 * 1024, 'z');
      entered = true;
      while (w.write(chunk)) {
      }
      refused = true;
    });
  });
  Limits l;
  l.write_timeout = 60000ms;
  start(l);
  Client sink(port_, 4096);
  ASSERT_TRUE(sink.send("GET /big HTTP/1.1\r\n\r\n"));
  ASSERT_TRUE(eventually([&] { return entered.load(); }));
  std::this_thread::sleep_for(300ms);  // long enough for the writer to fill the cap and block
  EXPECT_FALSE(refused.load());
  auto t0 = Clock::now();
  server_->stop();
  EXPECT_LT(since(t0), 1000ms);
  EXPECT_TRUE(refused.load());
  EXPECT_TRUE(closed_by_server(sink.fd(), 5000ms));
  server_->stop();  // twice is fine
  EXPECT_EQ(server_->stats().open_connections, 0u);
}

TEST_F(ServerTest, OutOfDescriptorsIsCountedAndRecovers) {
  start();
  Socket sock = client_socket();
  // A new descriptor takes the lowest free number: with the limit there, the server's accept()
  // finds none.
  int lowest_free = dup(0);
  ASSERT_GE(lowest_free, 0);
  close(lowest_free);
  rlimit saved{};
  getrlimit(RLIMIT_NOFILE, &saved);
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(lowest_free);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  bool connected = connect_loopback(sock, port_);  // the kernel completes it; accept() fails
  bool counted = connected && eventually([&] { return server_->stats().accept_errors >= 1; });
  uint64_t accepted_while_tight = server_->stats().accepted;
  setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_TRUE(connected);
  EXPECT_TRUE(counted);
  EXPECT_EQ(accepted_while_tight, 0u);
  // Descriptors free again: the waiting connection is taken once the pause ends.
  Client c(std::move(sock));
  Reply r = c.get("/livez");
  EXPECT_EQ(r.status, 200);
  EXPECT_LT(probe(), 1000ms);
}

TEST(Server, StartErrors) {
  Server s;
  EXPECT_FALSE(s.start(model::HostPort{"not-an-ip", 0}).ok());
  EXPECT_EQ(s.port(), -1);
  Server v6;
  Status st = v6.start(model::HostPort{"::1", 0});
  if (st.ok()) {  // hosts without IPv6 loopback skip this half
    EXPECT_GT(v6.port(), 0);
    EXPECT_FALSE(v6.start(model::HostPort{"::1", 0}).ok());  // already started
  }
}

}  // namespace
}  // namespace endpointd::httpd
