// The runtime-API client: a unix socket per command with one deadline over connect, write and
// read; and the `show servers state` parser.
#include "adapters/haproxy/runtime.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>

namespace endpointd::haproxy {
namespace {

using Clock = std::chrono::steady_clock;

// An answer larger than this is not one the adapter asked for (a backend's server list is
// about 200 bytes per server).
constexpr size_t kMaxAnswerBytes = 64 << 20;

// A file descriptor closed when it goes out of scope.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Milliseconds left until `deadline` (0 when it passed), for poll().
int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// Waits for `events` on fd until the deadline: 1 ready, 0 timed out, -1 error (errno set).
int wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    return r;
  }
}

std::vector<std::string_view> split_ws(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

template <typename T>
bool parse_uint(std::string_view s, T* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

// The first line of an answer, for error messages.
std::string quote(std::string_view text) {
  size_t eol = text.find('\n');
  std::string_view first = text.substr(0, eol);
  if (first.size() > 200) first = first.substr(0, 200);
  return "\"" + std::string(first) + "\"";
}

}  // namespace

SocketRuntime::SocketRuntime(std::string path, std::chrono::milliseconds timeout)
    : path_(std::move(path)), timeout_(timeout) {}

Result<std::string> SocketRuntime::call(const std::string& command) {
  const auto deadline = Clock::now() + timeout_;
  auto fail = [&](const std::string& what) {
    return Error{describe() + ": `" + command + "`: " + what};
  };
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  if (path_.size() >= sizeof sun.sun_path) return fail("socket path too long");
  std::memcpy(sun.sun_path, path_.data(), path_.size());

  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return fail(std::string("socket: ") + std::strerror(errno));
  // A unix-socket connect completes at once or fails (EAGAIN: HAProxy's backlog is full).
  if (connect(fd.get(), static_cast<sockaddr*>(static_cast<void*>(&sun)), sizeof sun) != 0) {
    return fail(std::string("connect: ") + std::strerror(errno));
  }

  const std::string line = command + "\n";
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = send(fd.get(), line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int r = wait_fd(fd.get(), POLLOUT, deadline);
      if (r == 0)
        return fail("timed out after " + std::to_string(timeout_.count()) + " ms sending");
      if (r < 0) return fail(std::string("poll: ") + std::strerror(errno));
      continue;
    }
    return fail(std::string("send: ") + std::strerror(errno));
  }

  // Without a prompt, HAProxy answers and closes the connection: the answer ends at EOF.
  std::string answer;
  char buf[16384];
  for (;;) {
    ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
    if (n > 0) {
      answer.append(buf, static_cast<size_t>(n));
      if (answer.size() > kMaxAnswerBytes)
        return fail("answer larger than " + std::to_string(kMaxAnswerBytes) + " bytes");
      continue;
    }
    if (n == 0) return answer;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int r = wait_fd(fd.get(), POLLIN, deadline);
      if (r == 0) return fail("no answer within " + std::to_string(timeout_.count()) + " ms");
      if (r < 0) return fail(std::string("poll: ") + std::strerror(errno));
      continue;
    }
    return fail(std::string("recv: ") + std::strerror(errno));
  }
}

Result<std::vector<ServerRow>> parse_servers_state(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Error{"`show servers state`: " + why + " in the answer " + quote(text)};
  };
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < text.size();) {
    size_t eol = text.find('\n', start);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view l = text.substr(start, eol - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    lines.push_back(l);
    start = eol + 1;
  }
  if (lines.empty() || lines[0] != "1") return bad("no format version 1");
  if (lines.size() < 2 || lines[1].empty() || lines[1][0] != '#') return bad("no column header");

  std::map<std::string_view, size_t> column;
  auto header = split_ws(lines[1].substr(1));
  for (size_t i = 0; i < header.size(); ++i) column.emplace(header[i], i);
  const char* needed[] = {"srv_id",          "srv_name",        "srv_addr",
                          "srv_admin_state", "srv_f_forced_id", "srv_port"};
  for (const char* c : needed)
    if (!column.count(c)) return bad(std::string("no column ") + c);

  std::vector<ServerRow> rows;
  for (size_t i = 2; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    if (l.empty() || l[0] == '#') continue;
    auto f = split_ws(l);
    if (f.size() < header.size()) return bad("a short line");
    ServerRow r;
    r.name = f[column["srv_name"]];
    r.addr = f[column["srv_addr"]];
    uint32_t forced = 0;
    if (!parse_uint(f[column["srv_id"]], &r.id) ||
        !parse_uint(f[column["srv_admin_state"]], &r.admin_state) ||
        !parse_uint(f[column["srv_f_forced_id"]], &forced) ||
        !parse_uint(f[column["srv_port"]], &r.port)) {
      return bad("a malformed number");
    }
    r.forced_id = forced != 0;
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace endpointd::haproxy
