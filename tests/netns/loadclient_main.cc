// endpointd-loadclient: a bounded stream of requests to one address for the namespace tests.
// Each worker sends requests one after another, on a new connection each time (--mode new) or
// on a kept-alive connection (--mode keepalive); every request is one line in --out:
//
//   <start ns> ok|fail <backend name or error> <latency us> <worker> <connection seq>
//
// and a summary "ok=N failed=M retried=R" goes to stdout at the end. Like real HTTP clients, a
// request on a reused connection that the server closed before answering is retried once on
// a new connection (counted as retried, not failed).
//
//   endpointd-loadclient --target IP:PORT [--udp] [--mode new|keepalive] [--concurrency N]
//       [--count N] [--duration-ms N] [--interval-ms N] [--timeout-ms N] --out FILE
//       [--ready-fd FD]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};
std::atomic<int64_t> g_issued{0};
std::atomic<int64_t> g_ok{0}, g_failed{0}, g_retried{0};
int g_out_fd = -1;

struct Options {
  std::string host;
  uint16_t port = 0;
  bool udp = false;
  bool keepalive = false;
  int concurrency = 1;
  int64_t count = 0;
  int duration_ms = 0;
  int interval_ms = 10;
  int timeout_ms = 1000;
};
Options g_opt;
sockaddr_storage g_target{};
socklen_t g_target_len = 0;

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void on_signal(int) {
  g_stop = true;
}

void record(int64_t start_ns, bool ok, const std::string& what, int64_t latency_us, int worker,
            uint64_t conn) {
  (ok ? g_ok : g_failed)++;
  if (g_out_fd < 0) return;
  std::string line = std::to_string(start_ns) + (ok ? " ok " : " fail ") + what + " " +
                     std::to_string(latency_us) + " " + std::to_string(worker) + " " +
                     std::to_string(conn) + "\n";
  ssize_t n = write(g_out_fd, line.data(), line.size());
  (void)n;
}

int remaining_ms(Clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Connects with a deadline. Returns the fd or -errno.
int connect_tcp(Clock::time_point deadline) {
  int fd = socket(g_target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, static_cast<const sockaddr*>(static_cast<const void*>(&g_target)),
              g_target_len) != 0) {
    if (errno != EINPROGRESS) {
      int e = errno;
      close(fd);
      return -e;
    }
    pollfd p{fd, POLLOUT, 0};
    int r = poll(&p, 1, remaining_ms(deadline));
    if (r <= 0) {
      close(fd);
      return -ETIMEDOUT;
    }
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      close(fd);
      return -err;
    }
  }
  return fd;
}

bool send_all(int fd, const std::string& s, Clock::time_point deadline) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, remaining_ms(deadline)) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

struct Response {
  bool ok = false;
  bool got_bytes = false;  // any byte arrived (a retry is unsafe after that)
  bool close = false;      // server said Connection: close
  std::string body_or_error;
};

// Reads one HTTP response (headers + Content-Length body).
Response read_response(int fd, Clock::time_point deadline) {
  Response r;
  std::string buf;
  char tmp[4096];
  for (;;) {
    size_t end = buf.find("\r\n\r\n");
    if (end != std::string::npos) {
      std::string head = buf.substr(0, end);
      std::string lower;
      for (char c : head) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t cl = lower.find("content-length:");
      size_t length =
          cl == std::string::npos ? 0 : std::strtoul(lower.c_str() + cl + 15, nullptr, 10);
      if (buf.size() >= end + 4 + length) {
        std::string body = buf.substr(end + 4, length);
        while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
        r.ok = head.rfind("HTTP/1.1 200", 0) == 0 || head.rfind("HTTP/1.0 200", 0) == 0;
        r.close = lower.find("connection: close") != std::string::npos;
        r.body_or_error = r.ok ? body : "status:" + head.substr(0, head.find('\r'));
        return r;
      }
    }
    pollfd p{fd, POLLIN, 0};
    int pr = poll(&p, 1, remaining_ms(deadline));
    if (pr == 0) {
      r.body_or_error = "timeout";
      return r;
    }
    ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) {
      r.body_or_error = std::string("recv:") + strerrorname_np(errno);
      return r;
    }
    if (n == 0) {
      r.body_or_error = "eof";
      return r;
    }
    r.got_bytes = true;
    buf.append(tmp, static_cast<size_t>(n));
  }
}

std::string error_name(int e) {
  const char* n = strerrorname_np(e);
  return n != nullptr ? n : std::to_string(e);
}

void tcp_worker(int worker) {
  int fd = -1;
  uint64_t conn_seq = 0;
  // No "Connection: close" in --mode new: the client closes once it has the response, as
  // curl does, so the TIME-WAIT is on this side. A server that closed first would hold it,
  // and a masqueraded SYN landing on it is refused by its timestamp (PAWS) and retried after
  // a second: a stall of the kernel's, with any proxy's rules (tests/netns/cluster.cc).
  const std::string request = "GET / HTTP/1.1\r\nHost: endpointd-test\r\n\r\n";
  while (!g_stop.load()) {
    if (g_opt.count > 0 && g_issued.fetch_add(1) >= g_opt.count) break;
    int64_t start = now_ns();
    auto t0 = Clock::now();
    auto deadline = t0 + std::chrono::milliseconds(g_opt.timeout_ms);
    bool reused = fd >= 0;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (fd < 0) {
        fd = connect_tcp(deadline);
        if (fd < 0) {
          record(start, false, "connect:" + error_name(-fd), 0, worker, conn_seq);
          fd = -1;
          break;
        }
        ++conn_seq;
        reused = false;
      }
      Response resp;
      if (!send_all(fd, request, deadline)) {
        resp.body_or_error = "send:" + error_name(errno);
      } else {
        resp = read_response(fd, deadline);
      }
      int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
      if (resp.ok) {
        record(start, true, resp.body_or_error, us, worker, conn_seq);
        if (!g_opt.keepalive || resp.close) close(fd), fd = -1;
        break;
      }
      close(fd);
      fd = -1;
      if (reused && !resp.got_bytes && attempt == 0) {
        g_retried++;  // the server closed an idle kept-alive connection: retry on a new one
        continue;
      }
      record(start, false, resp.body_or_error, us, worker, conn_seq);
      break;
    }
    if (g_opt.interval_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(g_opt.interval_ms));
  }
  if (fd >= 0) close(fd);
}

void udp_worker(int worker) {
  int fd = -1;
  uint64_t conn_seq = 0;
  while (!g_stop.load()) {
    if (g_opt.count > 0 && g_issued.fetch_add(1) >= g_opt.count) break;
    int64_t start = now_ns();
    auto t0 = Clock::now();
    auto deadline = t0 + std::chrono::milliseconds(g_opt.timeout_ms);
    if (fd < 0) {
      fd = socket(g_target.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (fd < 0 || connect(fd, static_cast<const sockaddr*>(static_cast<const void*>(&g_target)),
                            g_target_len) != 0) {
        record(start, false, "socket:" + error_name(errno), 0, worker, conn_seq);
        if (fd >= 0) close(fd);
        fd = -1;
        continue;
      }
      ++conn_seq;
    }
    std::string what;
    bool ok = false;
    if (send(fd, "x\n", 2, 0) != 2) {
      what = "send:" + error_name(errno);
    } else {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, remaining_ms(deadline)) <= 0) {
        what = "timeout";
      } else {
        char buf[512];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0) {
          what = "recv:" + error_name(errno);
        } else {
          what.assign(buf, static_cast<size_t>(n));
          while (!what.empty() && (what.back() == '\n' || what.back() == '\r')) what.pop_back();
          ok = true;
        }
      }
    }
    int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
    record(start, ok, what, us, worker, conn_seq);
    if (!g_opt.keepalive || !ok) close(fd), fd = -1;
    if (g_opt.interval_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(g_opt.interval_ms));
  }
  if (fd >= 0) close(fd);
}

bool parse_target(const std::string& t) {
  size_t colon = t.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = t.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = std::atoi(t.c_str() + colon + 1);
  if (port <= 0 || port > 65535) return false;
  g_opt.port = static_cast<uint16_t>(port);
  sockaddr_in sin{};
  sockaddr_in6 sin6{};
  if (inet_pton(AF_INET, host.c_str(), &sin.sin_addr) == 1) {
    sin.sin_family = AF_INET;
    sin.sin_port = htons(g_opt.port);
    std::memcpy(&g_target, &sin, sizeof sin);
    g_target_len = sizeof sin;
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &sin6.sin6_addr) == 1) {
    sin6.sin6_family = AF_INET6;
    sin6.sin6_port = htons(g_opt.port);
    std::memcpy(&g_target, &sin6, sizeof sin6);
    g_target_len = sizeof sin6;
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, mode = "new";
  int ready_fd = -1;
  bool have_target = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& flag) -> const char* {
      if (a == flag && i + 1 < argc) return argv[++i];
      if (a.rfind(flag + "=", 0) == 0) return argv[i] + flag.size() + 1;
      return nullptr;
    };
    if (a == "--udp")
      g_opt.udp = true;
    else if (const char* v = value("--target"))
      have_target = parse_target(v);
    else if (const char* v = value("--mode"))
      mode = v;
    else if (const char* v = value("--concurrency"))
      g_opt.concurrency = std::atoi(v);
    else if (const char* v = value("--count"))
      g_opt.count = std::atoll(v);
    else if (const char* v = value("--duration-ms"))
      g_opt.duration_ms = std::atoi(v);
    else if (const char* v = value("--interval-ms"))
      g_opt.interval_ms = std::atoi(v);
    else if (const char* v = value("--timeout-ms"))
      g_opt.timeout_ms = std::atoi(v);
    else if (const char* v = value("--out"))
      out = v;
    else if (const char* v = value("--ready-fd"))
      ready_fd = std::atoi(v);
    else {
      std::fprintf(stderr, "endpointd-loadclient: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (!have_target || (mode != "new" && mode != "keepalive") || g_opt.concurrency < 1 ||
      (g_opt.count <= 0 && g_opt.duration_ms <= 0)) {
    std::fprintf(stderr,
                 "endpointd-loadclient: need --target IP:PORT, --mode new|keepalive, and a bound "
                 "(--count or --duration-ms)\n");
    return 2;
  }
  g_opt.keepalive = mode == "keepalive";
  if (!out.empty()) {
    g_out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (g_out_fd < 0) {
      std::perror("open out");
      return 1;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  if (ready_fd >= 0) {
    char c = 1;
    ssize_t n = write(ready_fd, &c, 1);
    (void)n;
    close(ready_fd);
  }

  std::vector<std::thread> workers;
  for (int w = 0; w < g_opt.concurrency; ++w) {
    workers.emplace_back(g_opt.udp ? udp_worker : tcp_worker, w);
  }
  if (g_opt.duration_ms > 0) {
    auto end = Clock::now() + std::chrono::milliseconds(g_opt.duration_ms);
    while (!g_stop.load() && Clock::now() < end) {
      bool all_done = g_opt.count > 0 && g_issued.load() >= g_opt.count + g_opt.concurrency;
      if (all_done) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    g_stop = true;
  }
  for (auto& t : workers) t.join();
  std::printf("ok=%lld failed=%lld retried=%lld\n", static_cast<long long>(g_ok.load()),
              static_cast<long long>(g_failed.load()), static_cast<long long>(g_retried.load()));
  return 0;
}
