// datapath_probe: the client and the server of bench/datapath. The same binary serves and
// connects for every rule set, so the only thing that differs between rounds is the rules.
//
//   datapath_probe serve --port P
//       accepts and closes, forever (until SIGTERM)
//   datapath_probe latency --to IP:PORT --count N [--warmup W]
//       N blocking connect()s one after another, each timed from socket() returning to connect()
//       returning (the SYN, the rules on its first packet, the SYN-ACK), then closed with a
//       reset (SO_LINGER 0: no TIME_WAIT, the next connect may reuse the port at once)
//       prints: n=N p50_us=.. p99_us=.. mean_us=.. failed=F
//   datapath_probe rate --to IP:PORT --seconds S [--inflight C] [--per-second R]
//       C non-blocking connects kept in flight for S seconds (at most R started a second, when
//       given), each closed with a reset as soon as it completes; prints conns=.. wall_s=..
//       cpu_s=.. failed=F (cpu_s: this process's user+system time, which on veth includes the
//       softirq work of the whole path: the packet is forwarded in the sender's context)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

bool parse_addr(const std::string& s, sockaddr_in* out) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  const long port = std::strtol(s.c_str() + colon + 1, nullptr, 10);
  if (port <= 0 || port > 65535) return false;
  out->sin_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET, s.substr(0, colon).c_str(), &out->sin_addr) == 1;
}

void close_with_reset(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

int serve(int port) {
  signal(SIGPIPE, SIG_IGN);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 4096) != 0) {
    std::perror("serve: bind/listen");
    return 1;
  }
  std::printf("listening\n");
  std::fflush(stdout);
  for (;;) {
    const int c = accept(fd, nullptr, nullptr);
    if (c >= 0) close(c);
  }
}

int latency(const sockaddr_in& to, int count, int warmup) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(count));
  int failed = 0;
  for (int i = 0; i < warmup + count; ++i) {
    const int64_t t0 = now_ns();
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to));
    const int64_t t1 = now_ns();
    if (rc != 0) {
      ++failed;
      close(fd);
      continue;
    }
    close_with_reset(fd);
    if (i >= warmup) us.push_back(static_cast<double>(t1 - t0) / 1000.0);
  }
  if (us.empty()) {
    std::printf("n=0 failed=%d\n", failed);
    return 1;
  }
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double v : us) sum += v;
  auto pct = [&](double p) {
    return us[std::min(us.size() - 1, static_cast<size_t>(p * static_cast<double>(us.size())))];
  };
  std::printf("n=%zu p50_us=%.1f p99_us=%.1f mean_us=%.1f failed=%d\n", us.size(), pct(0.50),
              pct(0.99), sum / static_cast<double>(us.size()), failed);
  return 0;
}

int rate(const sockaddr_in& to, double seconds, int inflight, double per_second) {
  const int ep = epoll_create1(0);
  int failed = 0;
  int64_t conns = 0;
  auto start_one = [&]() {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to));
    if (rc != 0 && errno != EINPROGRESS) {
      ++failed;
      close(fd);
      return false;
    }
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.fd = fd;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    return true;
  };
  const double cpu0 = cpu_seconds();
  const int64_t t0 = now_ns();
  const int64_t end = t0 + static_cast<int64_t>(seconds * 1e9);
  int open = 0;
  int64_t started = 0;
  // Paced: no more started than R × the time so far.
  auto allowed = [&] {
    return per_second <= 0 ||
           static_cast<double>(started) < per_second * static_cast<double>(now_ns() - t0) / 1e9;
  };
  auto top_up = [&] {
    while (open < inflight && now_ns() < end && allowed()) {
      ++started;
      open += start_one() ? 1 : 0;
    }
  };
  if (per_second <= 0)
    for (int i = 0; i < inflight; ++i) open += start_one() ? 1 : 0;
  top_up();
  std::vector<epoll_event> evs(static_cast<size_t>(inflight));
  while (open > 0 || (per_second > 0 && now_ns() < end)) {
    const int n = epoll_wait(ep, evs.data(), inflight, per_second > 0 ? 1 : 1000);
    const bool more = now_ns() < end;
    for (int i = 0; i < n; ++i) {
      const int fd = evs[static_cast<size_t>(i)].data.fd;
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) {
        ++conns;
      } else {
        ++failed;
      }
      epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
      close_with_reset(fd);
      --open;
      if (more && per_second <= 0) open += start_one() ? 1 : 0;
    }
    if (per_second > 0) top_up();
    if (n <= 0 && !more) break;
  }
  const double wall = static_cast<double>(now_ns() - t0) / 1e9;
  std::printf("conns=%lld wall_s=%.3f cpu_s=%.3f failed=%d\n", static_cast<long long>(conns), wall,
              cpu_seconds() - cpu0, failed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: datapath_probe serve|latency|rate [options]\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::string to;
  int port = 8080, count = 2000, warmup = 100, inflight = 8;
  double seconds = 3, per_second = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--to") {
      to = v;
    } else if (k == "--port") {
      port = std::atoi(v.c_str());
    } else if (k == "--count") {
      count = std::atoi(v.c_str());
    } else if (k == "--warmup") {
      warmup = std::atoi(v.c_str());
    } else if (k == "--seconds") {
      seconds = std::atof(v.c_str());
    } else if (k == "--per-second") {
      per_second = std::atof(v.c_str());
    } else if (k == "--inflight") {
      inflight = std::max(1, std::atoi(v.c_str()));
    } else {
      std::fprintf(stderr, "datapath_probe: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (mode == "serve") return serve(port);
  sockaddr_in addr{};
  if (!parse_addr(to, &addr)) {
    std::fprintf(stderr, "datapath_probe: --to IP:PORT\n");
    return 2;
  }
  if (mode == "latency") return latency(addr, count, warmup);
  if (mode == "rate") return rate(addr, seconds, inflight, per_second);
  std::fprintf(stderr, "datapath_probe: unknown mode %s\n", mode.c_str());
  return 2;
}
