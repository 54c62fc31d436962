// Measures an httpd::Server over loopback, the same source built twice: httpd_bench on
// httpd/server.cc, httpd_bench_mhd on libmicrohttpd (bench/httpd/server_mhd.cc). Each scenario
// prints one line; bench/httpd/run runs them all for bench/results/httpd.md.
//   idle        threads and RSS before and with 1,000 idle connections; /livez latency then
//   load        /livez latency while 200 slowloris clients and 20 never-reading clients of an
//               8 MiB page hold on (each reconnects when the server drops it), and what the
//               server holds meanwhile
//   trickle     one client sending a header byte every 500 ms, header_timeout 2 s: when closed
//   subsecond   idle_timeout 300 ms: when an idle keep-alive connection is closed
//   stream      a never-reading client of a stream, max_pending_output 256 KiB: what the
//               handler got written before write() blocked, and when write() returned false
//   emfile      no descriptor left for accept() for 2 s: the server's CPU time meanwhile
//   serve       serves /livez, /page, /stream on a port until killed (for poking by hand)
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "httpd/server.h"

namespace {

using namespace endpointd;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

int dial(int port, int rcvbuf = 0) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, std::string_view d) {
  while (!d.empty()) {
    ssize_t n = send(fd, d.data(), d.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    d.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Whether the peer closed (EOF or reset) without blocking.
bool peer_closed(int fd) {
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

// /livez on a fresh connection; milliseconds, or -1 on a wrong or missing answer.
double probe(int port) {
  auto t0 = Clock::now();
  int fd = dial(port);
  if (fd < 0) return -1;
  send_all(fd, "GET /livez HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n");
  std::string got;
  char buf[1024];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
  close(fd);
  if (got.rfind("HTTP/1.1 200", 0) != 0 || got.find("\r\n\r\nok\n") == std::string::npos) return -1;
  return ms_since(t0);
}

struct Latency {
  std::vector<double> ms;
  int failed = 0;
  void add(double v) {
    if (v < 0)
      ++failed;
    else
      ms.push_back(v);
  }
  std::string str() {
    if (ms.empty()) return "no answers, " + std::to_string(failed) + " failed";
    std::sort(ms.begin(), ms.end());
    auto at = [&](double q) {
      return ms[static_cast<size_t>(q * static_cast<double>(ms.size() - 1))];
    };
    char b[200];
    std::snprintf(b, sizeof b, "n=%zu p50=%.2fms p99=%.2fms max=%.2fms failed=%d", ms.size(),
                  at(0.5), at(0.99), ms.back(), failed);
    return b;
  }
};

size_t thread_count() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

double cpu_ms() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](timeval t) { return static_cast<double>(t.tv_sec) * 1e3 + t.tv_usec / 1e3; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

void raise_nofile(rlim_t want) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = std::min(rl.rlim_max, std::max(rl.rlim_cur, want));
  setrlimit(RLIMIT_NOFILE, &rl);
}

httpd::Response text(std::string body) {
  httpd::Response r;
  r.body = std::move(body);
  return r;
}

std::unique_ptr<httpd::Server> serve(httpd::Limits l, int port = 0) {
  auto s = std::make_unique<httpd::Server>(l, "bench");
  s->get("/livez", [](const httpd::Request&) { return text("ok\n"); });
  s->get("/page", [](const httpd::Request&) { return text(std::string(8 << 20, 'p')); });
  s->get_stream("/stream", "text/plain", [](const httpd::Request& r, httpd::Writer& w) {
    std::string chunk(64 * 1024, 's');
    size_t n = r.param("chunks").empty() ? 4 : std::stoul(r.param("chunks"));
    for (size_t i = 0; i < n; ++i)
      if (!w.write(chunk)) return;
  });
  auto st = s->start(model::HostPort{"127.0.0.1", static_cast<uint16_t>(port)});
  if (!st.ok()) {
    std::fprintf(stderr, "start: %s\n", st.error().c_str());
    std::exit(1);
  }
  return s;
}

void idle() {
  raise_nofile(4096);
  httpd::Limits l;
  l.max_connections = 2000;
  l.max_connections_per_peer = 2000;
  l.header_timeout = 120s;
  auto s = serve(l);
  probe(s->port());
  size_t threads0 = thread_count();
  long rss0 = rss_kib();
  std::vector<int> fds;
  for (int i = 0; i < 1000; ++i) fds.push_back(dial(s->port()));
  while (s->stats().open_connections < 1000) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(200ms);
  Latency lat;
  for (int i = 0; i < 200; ++i) lat.add(probe(s->port()));
  std::printf("idle: threads %zu -> %zu, RSS %ld -> %ld KiB (+%ld KiB for 1000), /livez %s\n",
              threads0, thread_count(), rss0, rss_kib(), rss_kib() - rss0, lat.str().c_str());
  for (int fd : fds) close(fd);
}

void load() {
  raise_nofile(4096);
  httpd::Limits l;  // the defaults, as the admin listener has them
  auto s = serve(l);
  int port = s->port();
  std::atomic<bool> done{false};
  std::atomic<uint64_t> slow_reconnects{0};
  // 200 slowloris clients: a request line, then one header byte a second; reconnect when dropped.
  std::thread slow([&] {
    std::vector<int> fds(200, -1);
    while (!done) {
      for (int& fd : fds) {
        if (fd >= 0 && peer_closed(fd)) {
          close(fd);
          fd = -1;
          ++slow_reconnects;
        }
        if (fd < 0) {
          fd = dial(port);
          send_all(fd, "GET /livez HTTP/1.1\r\nX-Slow: ");
        } else {
          send_all(fd, "a");
        }
      }
      std::this_thread::sleep_for(1s);
    }
    for (int fd : fds) close(fd);
  });
  // 20 never-reading clients of an 8 MiB page. The server's close does not reach a client that
  // reads nothing, so each one dials again once write_timeout (10 s) and a second have passed.
  std::thread sinks([&] {
    std::vector<std::pair<int, Clock::time_point>> fds(20, {-1, {}});
    while (!done) {
      for (auto& [fd, since] : fds) {
        if (fd >= 0 && Clock::now() - since > 11s) {
          close(fd);
          fd = -1;
        }
        if (fd < 0) {
          fd = dial(port, 4096);
          since = Clock::now();
          send_all(fd, "GET /page HTTP/1.1\r\nHost: b\r\n\r\n");
        }
      }
      std::this_thread::sleep_for(100ms);
    }
    for (auto& [fd, since] : fds) close(fd);
  });
  std::this_thread::sleep_for(2s);
  long rss0 = rss_kib();
  Latency lat;
  auto t0 = Clock::now();
  size_t most_open = 0;
  while (ms_since(t0) < 20000) {
    lat.add(probe(port));
    most_open = std::max(most_open, s->stats().open_connections);
    std::this_thread::sleep_for(20ms);
  }
  httpd::Stats st = s->stats();
  std::printf(
      "load (20 s): /livez %s; open connections up to %zu; slowloris dropped %llu times "
      "(header_timeouts %llu); never-readers dropped (write_timeouts) %llu; RSS %ld KiB\n",
      lat.str().c_str(), most_open, static_cast<unsigned long long>(slow_reconnects.load()),
      static_cast<unsigned long long>(st.header_timeouts),
      static_cast<unsigned long long>(st.write_timeouts), rss0);
  done = true;
  slow.join();
  sinks.join();
}

void trickle() {
  httpd::Limits l;
  l.header_timeout = 2s;
  auto s = serve(l);
  int fd = dial(s->port());
  auto t0 = Clock::now();
  send_all(fd, "GET /livez HTTP/1.1\r\nX-Slow: ");
  bool closed = false;
  while (ms_since(t0) < 20000) {
    std::this_thread::sleep_for(500ms);
    if (peer_closed(fd) || !send_all(fd, "a")) {
      closed = true;
      break;
    }
  }
  if (closed)
    std::printf("trickle: header_timeout 2 s, closed after %.0f ms (header_timeouts %llu)\n",
                ms_since(t0), static_cast<unsigned long long>(s->stats().header_timeouts));
  else
    std::printf("trickle: header_timeout 2 s, still open after %.0f ms\n", ms_since(t0));
  close(fd);
}

void subsecond() {
  httpd::Limits l;
  l.idle_timeout = 300ms;
  auto s = serve(l);
  int fd = dial(s->port());
  send_all(fd, "GET /livez HTTP/1.1\r\nHost: b\r\n\r\n");
  char buf[4096];
  recv(fd, buf, sizeof buf, 0);
  auto t0 = Clock::now();
  while (!peer_closed(fd) && ms_since(t0) < 10000) std::this_thread::sleep_for(5ms);
  std::printf("subsecond: idle_timeout 300 ms, closed after %.0f ms (idle_closed %llu)\n",
              ms_since(t0), static_cast<unsigned long long>(s->stats().idle_closed));
  close(fd);
}

void stream() {
  httpd::Limits l;
  l.max_pending_output = 256 * 1024;
  l.write_timeout = 3s;
  std::atomic<size_t> written{0};
  std::promise<double> refused;
  auto t_start = std::make_shared<Clock::time_point>();
  httpd::Server s(l, "bench");
  s.get("/livez", [](const httpd::Request&) { return text("ok\n"); });
  s.get_stream("/big", "text/plain", [&](const httpd::Request&, httpd::Writer& w) {
    *t_start = Clock::now();
    std::string chunk(64 * 1024, 'z');
    while (w.write(chunk)) written += chunk.size();
    refused.set_value(ms_since(*t_start));
  });
  if (!s.start(model::HostPort{"127.0.0.1", 0}).ok()) std::exit(1);
  int fd = dial(s.port(), 4096);
  send_all(fd, "GET /big HTTP/1.1\r\nHost: b\r\n\r\n");
  std::this_thread::sleep_for(1500ms);
  size_t at_block = written;
  auto f = refused.get_future();
  double when = f.wait_for(10s) == std::future_status::ready ? f.get() : -1;
  std::printf(
      "stream: max_pending_output 256 KiB, write_timeout 3 s: %zu KiB written before write() "
      "blocked; write() false after %.0f ms (write_timeouts %llu)\n",
      at_block / 1024, when, static_cast<unsigned long long>(s.stats().write_timeouts));
  close(fd);
}

void emfile() {
  auto s = serve({});
  int port = s->port();
  int lowest_free = dup(0);
  close(lowest_free);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  rlimit saved{};
  getrlimit(RLIMIT_NOFILE, &saved);
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(lowest_free + 1);
  setrlimit(RLIMIT_NOFILE, &tight);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  double cpu0 = cpu_ms();
  std::this_thread::sleep_for(2s);
  double cpu = cpu_ms() - cpu0;
  uint64_t errors = s->stats().accept_errors;
  setrlimit(RLIMIT_NOFILE, &saved);
  close(fd);
  std::this_thread::sleep_for(300ms);
  double after = probe(port);
  std::printf(
      "emfile: 2 s without a descriptor for accept(): %.0f ms CPU, accept_errors %llu; /livez "
      "after: %s\n",
      cpu, static_cast<unsigned long long>(errors),
      after < 0 ? "failed" : (std::to_string(after) + " ms").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string what = argc > 1 ? argv[1] : "";
  if (what == "idle") {
    idle();
  } else if (what == "load") {
    load();
  } else if (what == "trickle") {
    trickle();
  } else if (what == "subsecond") {
    subsecond();
  } else if (what == "stream") {
    stream();
  } else if (what == "emfile") {
    emfile();
  } else if (what == "serve") {
    auto s = serve({}, argc > 2 ? std::atoi(argv[2]) : 0);
    std::printf("%d\n", s->port());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::hours(1));
  } else {
    std::fprintf(stderr, "usage: %s idle|load|trickle|subsecond|stream|emfile|serve [port]\n",
                 argv[0]);
    return 2;
  }
  return 0;
}
