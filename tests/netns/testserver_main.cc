// endpointd-testserver: a tiny pod server for the namespace tests. Answers every TCP request
// (an HTTP/1.1 request or a bare line) and every UDP datagram with its name, and logs each
// accepted connection and datagram with a wall-clock timestamp so tests can check ordering.
//
//   endpointd-testserver --name web-1 --events FILE [--tcp PORT] [--udp PORT] [--bind ADDR]
//                        [--grace-ms N] [--ready-fd FD]
//
// On SIGTERM it stops accepting, answers the next request on each open connection with
// "Connection: close", and exits when they are all closed or --grace-ms passed (0: at once).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>

namespace {

std::string g_name = "server";
int g_events_fd = -1;
std::atomic<bool> g_draining{false};
std::atomic<int> g_active{0};
std::atomic<uint64_t> g_conn_ids{0};
int g_signal_pipe[2] = {-1, -1};

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// One write per line on an O_APPEND file: lines never interleave.
void event(const std::string& what) {
  if (g_events_fd < 0) return;
  std::string line = std::to_string(now_ns()) + " " + what + "\n";
  ssize_t n = write(g_events_fd, line.data(), line.size());
  (void)n;
}

std::string peer_string(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, &ss, sizeof sin);
    inet_ntop(AF_INET, &sin.sin_addr, buf, sizeof buf);
    port = ntohs(sin.sin_port);
  } else {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, &ss, sizeof sin6);
    inet_ntop(AF_INET6, &sin6.sin6_addr, buf, sizeof buf);
    port = ntohs(sin6.sin6_port);
    return "[" + std::string(buf) + "]:" + std::to_string(port);
  }
  return std::string(buf) + ":" + std::to_string(port);
}

void on_signal(int) {
  char c = 1;
  ssize_t n = write(g_signal_pipe[1], &c, 1);
  (void)n;
}

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool has_header(const std::string& head, const char* header_and_value) {
  std::string lower;
  for (char c : head) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find(header_and_value) != std::string::npos;
}

void serve_connection(int fd, std::string peer, uint64_t id) {
  std::string buf;
  int requests = 0;
  char tmp[4096];
  bool open = true;
  bool peer_closes_first = false;
  while (open) {
    // Parse every complete request in the buffer.
    for (;;) {
      size_t eol = buf.find('\n');
      if (eol == std::string::npos) break;
      std::string first = buf.substr(0, eol);
      if (first.find(" HTTP/1.") != std::string::npos) {
        size_t end = buf.find("\r\n\r\n");
        size_t skip = 4;
        if (end == std::string::npos) {
          end = buf.find("\n\n");
          skip = 2;
        }
        if (end == std::string::npos) break;  // headers incomplete
        std::string head = buf.substr(0, end);
        buf.erase(0, end + skip);
        bool close_after = g_draining.load() || has_header(head, "connection: close");
        std::string body = g_name + "\n";
        std::string resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\nX-Server: " + g_name +
                           (close_after ? "\r\nConnection: close" : "\r\nConnection: keep-alive") +
                           "\r\n\r\n" + body;
        ++requests;
        if (!send_all(fd, resp)) {
          open = false;
          break;
        }
        if (close_after) {
          open = false;
          peer_closes_first = true;
          break;
        }
      } else {
        buf.erase(0, eol + 1);
        ++requests;
        if (!send_all(fd, g_name + "\n")) {
          open = false;
          break;
        }
        if (g_draining.load()) {
          open = false;
          break;
        }
      }
    }
    if (!open) break;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, 100);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
  }
  // After "Connection: close" the client closes first (it has the whole response), so the
  // TIME-WAIT is the client's, as with any HTTP client that reads to the end. A server that
  // closed first would keep one TIME-WAIT per connection; the node's masquerade (fully-random)
  // may then pick a source port still in one, the SYN is refused by its timestamp (PAWS,
  // TcpExtPAWSTimewait) and the client's connect waits for a retransmit: a ~1 s stall that
  // is the kernel's with any proxy's rules, not what a test measures. Bounded: 1 s.
  if (peer_closes_first) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      until - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) break;
      pollfd p{fd, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(left));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      ssize_t n = recv(fd, tmp, sizeof tmp, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the client's FIN (or its reset)
    }
  }
  event("close " + peer + " " + std::to_string(id) + " " + std::to_string(requests));
  close(fd);
  g_active--;
}

int make_socket(int type, const std::string& bind_addr, uint16_t port) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  if (bind_addr.find(':') != std::string::npos) {
    sockaddr_in6 sin6{};
    sin6.sin6_family = AF_INET6;
    sin6.sin6_port = htons(port);
    if (inet_pton(AF_INET6, bind_addr.c_str(), &sin6.sin6_addr) != 1) return -1;
    std::memcpy(&ss, &sin6, sizeof sin6);
    len = sizeof sin6;
    family = AF_INET6;
  } else {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    if (inet_pton(AF_INET, bind_addr.c_str(), &sin.sin_addr) != 1) return -1;
    std::memcpy(&ss, &sin, sizeof sin);
    len = sizeof sin;
  }
  int fd = socket(family, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, static_cast<sockaddr*>(static_cast<void*>(&ss)), len) != 0) {
    close(fd);
    return -1;
  }
  if (type == SOCK_STREAM && listen(fd, 512) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  std::string events, bind_addr = "0.0.0.0";
  int tcp_port = -1, udp_port = -1, grace_ms = 0, ready_fd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& flag) -> const char* {
      if (a == flag && i + 1 < argc) return argv[++i];
      if (a.rfind(flag + "=", 0) == 0) return argv[i] + flag.size() + 1;
      return nullptr;
    };
    if (const char* v = value("--name"))
      g_name = v;
    else if (const char* v = value("--events"))
      events = v;
    else if (const char* v = value("--tcp"))
      tcp_port = std::atoi(v);
    else if (const char* v = value("--udp"))
      udp_port = std::atoi(v);
    else if (const char* v = value("--bind"))
      bind_addr = v;
    else if (const char* v = value("--grace-ms"))
      grace_ms = std::atoi(v);
    else if (const char* v = value("--ready-fd"))
      ready_fd = std::atoi(v);
    else {
      std::fprintf(stderr, "endpointd-testserver: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (tcp_port < 0 && udp_port < 0) {
    std::fprintf(stderr, "endpointd-testserver: give --tcp and/or --udp\n");
    return 2;
  }
  if (!events.empty()) {
    g_events_fd = open(events.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (g_events_fd < 0) {
      std::perror("open events");
      return 1;
    }
  }
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return 1;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  int tcp_fd = -1, udp_fd = -1;
  if (tcp_port >= 0 &&
      (tcp_fd = make_socket(SOCK_STREAM, bind_addr, static_cast<uint16_t>(tcp_port))) < 0) {
    std::perror("tcp listen");
    return 1;
  }
  if (udp_port >= 0 &&
      (udp_fd = make_socket(SOCK_DGRAM, bind_addr, static_cast<uint16_t>(udp_port))) < 0) {
    std::perror("udp bind");
    return 1;
  }
  event("listen " + g_name + " tcp=" + std::to_string(tcp_port) +
        " udp=" + std::to_string(udp_port));
  if (ready_fd >= 0) {
    char c = 1;
    ssize_t n = write(ready_fd, &c, 1);
    (void)n;
    close(ready_fd);
  }

  for (;;) {
    pollfd fds[3] = {{g_signal_pipe[0], POLLIN, 0}, {tcp_fd, POLLIN, 0}, {udp_fd, POLLIN, 0}};
    int r = poll(fds, 3, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (fds[0].revents & POLLIN) break;
    if (tcp_fd >= 0 && (fds[1].revents & POLLIN)) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      int c = accept4(tcp_fd, static_cast<sockaddr*>(static_cast<void*>(&ss)), &len, SOCK_CLOEXEC);
      if (c >= 0) {
        uint64_t id = ++g_conn_ids;
        std::string peer = peer_string(ss);
        event("accept " + peer + " " + std::to_string(id));
        g_active++;
        std::thread(serve_connection, c, peer, id).detach();
      }
    }
    if (udp_fd >= 0 && (fds[2].revents & POLLIN)) {
      char buf[2048];
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ssize_t n = recvfrom(udp_fd, buf, sizeof buf, 0,
                           static_cast<sockaddr*>(static_cast<void*>(&ss)), &len);
      if (n >= 0) {
        event("udp " + peer_string(ss));
        std::string reply = g_name + "\n";
        sendto(udp_fd, reply.data(), reply.size(), 0,
               static_cast<sockaddr*>(static_cast<void*>(&ss)), len);
      }
    }
  }

  // SIGTERM: stop accepting, let open connections finish within the grace period.
  event("sigterm " + g_name);
  g_draining = true;
  if (tcp_fd >= 0) close(tcp_fd);
  if (udp_fd >= 0) close(udp_fd);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  while (g_active.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  event("exit " + g_name + " open=" + std::to_string(g_active.load()));
  std::_Exit(0);
}
