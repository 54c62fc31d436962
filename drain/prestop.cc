// The prestop socket and its client. The server identifies the caller by the kernel's
// credentials (nothing the client says identifies it) and answers one line: "released
// <reason>", "failed <reason>" or "refused <reason>". The client opens with one line,
// "prestop 2 action=<spec>" (its --drain-action, may be empty; a client that sends nothing is
// an older one and cannot run drain actions). When the pod is removed everywhere and it has a
// drain action, the server sends "drain <ms left> <spec>" first and the client answers "ran ok
// <what happened>" or "ran error <why>" once it ran it.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>

#include "drain/action.h"
#include "drain/identify.h"
#include "drain/servers.h"

namespace endpointd::drain {

namespace {

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// One line (without its newline) from fd by `deadline`; nullopt on timeout, hang-up or a line
// longer than `max`.
std::optional<std::string> read_line(int fd, std::string& buffer, TimePoint deadline, size_t max) {
  while (true) {
    if (auto nl = buffer.find('\n'); nl != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      return line;
    }
    if (buffer.size() > max) return std::nullopt;
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (r <= 0) continue;
    char buf[1024];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return std::nullopt;
    buffer.append(buf, static_cast<size_t>(n));
  }
}

constexpr size_t kMaxLine = 8192;

// The directory a socket path lies in ("." for a bare name).
std::string directory_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

bool peer_gone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

Coordinator::PrestopServer::PrestopServer(Coordinator* c, std::string node, size_t max_connections,
                                          std::function<void(const std::string&)> count)
    : c_(c), node_(std::move(node)), max_connections_(max_connections), count_(std::move(count)) {}

Coordinator::PrestopServer::~PrestopServer() {
  stop();
}

Status Coordinator::PrestopServer::start(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) return Error{"drain socket path too long: " + path};
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (listen_fd_ < 0 || stop_fd_ < 0)
    return Error{std::string("drain socket: ") + std::strerror(errno)};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  ::unlink(path.c_str());  // a socket left by the previous agent
  sockaddr* sa = static_cast<sockaddr*>(static_cast<void*>(&addr));
  if (::bind(listen_fd_, sa, sizeof addr) != 0 || ::listen(listen_fd_, 64) != 0)
    return Error{"drain socket " + path + ": " + std::strerror(errno)};
  // Any pod's user may connect; who it is comes from the kernel, not from file permissions.
  ::chmod(path.c_str(), 0666);
  // The directory is what keeps a pod from putting its own socket here; prestop clients
  // refuse a socket in a directory others may write (verify_drain_socket).
  std::string dir = directory_of(path);
  struct stat d {};
  if (::stat(dir.c_str(), &d) == 0 && (d.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    spdlog::warn(
        "drain socket directory {} is writable by group or others: prestop clients will "
        "refuse the socket (chmod go-w {})",
        dir, dir);
  path_ = path;
  accept_ = std::thread([this] { accept_loop(); });
  return {};
}

void Coordinator::PrestopServer::stop() {
  if (stopping_.exchange(true)) return;
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(stop_fd_, &one, sizeof one);
  }
  if (accept_.joinable()) accept_.join();
  std::map<uint64_t, std::thread> workers;
  {
    std::lock_guard lock(mu_);
    workers.swap(workers_);
    finished_.clear();
  }
  for (auto& [id, t] : workers) t.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
  listen_fd_ = stop_fd_ = -1;
  // The socket file stays: a restarting agent replaces it, and clients retry meanwhile.
}

void Coordinator::PrestopServer::accept_loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("drain: prestop socket poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    reap();
    if (fd < 0) continue;
    if (active_.load() >= max_connections_) {
      count_("limited");
      if (uint64_t n = ++limited_; (n & (n - 1)) == 0)
        spdlog::warn(
            "drain: prestop refused: {} calls in progress on this node ({} refused so far)",
            max_connections_, n);
      write_all(fd, "failed the agent has too many prestop calls in progress; retry\n");
      ::close(fd);
      continue;
    }
    // Who it is comes from the kernel at once; one pod (or one process outside any pod) may
    // hold at most kPerCaller calls, so that it cannot use up the other pods' share.
    Result<Caller> caller = caller_of_socket(fd);
    std::string key = !caller                      ? std::string()
                      : !caller->pod_uid.empty()   ? "pod " + caller->pod_uid
                      : !caller->addresses.empty() ? "netns of " + caller->addresses.front().str()
                                                   : "pid " + std::to_string(caller->pid);
    std::lock_guard lock(mu_);
    if (!key.empty() && per_caller_[key] >= kPerCaller) {
      count_("limited");
      // Logged at the 1st, 2nd, 4th, 8th... refusal: a caller opening thousands of
      // connections must not fill the node's log.
      if (uint64_t n = ++limited_; (n & (n - 1)) == 0)
        spdlog::warn(
            "drain: prestop refused: {} has {} calls in progress already ({} refused so far)", key,
            kPerCaller, n);
      write_all(fd, "failed " + key + " has " + std::to_string(kPerCaller) +
                        " prestop calls in progress already; retry\n");
      ::close(fd);
      continue;
    }
    if (!key.empty()) ++per_caller_[key];
    ++active_;
    uint64_t id = next_worker_++;
    workers_.emplace(id, std::thread([this, fd, id, key, caller = std::move(caller)]() mutable {
                       serve(fd, std::move(caller));
                       ::close(fd);
                       std::lock_guard lock(mu_);
                       if (!key.empty() && --per_caller_[key] == 0) per_caller_.erase(key);
                       finished_.push_back(id);
                       --active_;
                     }));
  }
}

void Coordinator::PrestopServer::reap() {
  std::vector<std::thread> done;
  {
    std::lock_guard lock(mu_);
    for (uint64_t id : finished_) {
      auto it = workers_.find(id);
      if (it == workers_.end()) continue;
      done.push_back(std::move(it->second));
      workers_.erase(it);
    }
    finished_.clear();
  }
  for (auto& t : done) t.join();
}

void Coordinator::PrestopServer::serve(int fd, Result<Caller> caller) {
  // A current client opens with its hello at once; an older one sends nothing.
  std::string buffer, action;
  bool can_run = false;
  if (auto hello = read_line(fd, buffer, Clock::now() + milliseconds(1000), kMaxLine)) {
    static const std::string kHello = "prestop 2 action=";
    if (hello->rfind(kHello, 0) == 0) {
      can_run = true;
      action = hello->substr(kHello.size());
    }
  }
  if (!caller) {
    spdlog::warn("drain: prestop refused: {}", caller.error());
    count_("refused");
    write_all(fd, "refused " + caller.error() + "\n");
    return;
  }
  // The agent may have just started: give the first pod list a moment to arrive (and stop
  // waiting for a caller that left).
  model::SnapshotPtr snap;
  for (auto until = Clock::now() + std::chrono::seconds(5); !snap && Clock::now() < until;) {
    snap = c_->wait_snapshot([](const model::Snapshot& s) { return s.synced; },
                             std::min(until, Clock::now() + milliseconds(100)));
    if (!snap && peer_gone(fd)) return;
  }
  if (!snap) {
    count_("failed");
    write_all(fd, "failed the agent has no synced cluster state yet; retry\n");
    return;
  }
  auto matched = match_pod(*snap, node_, *caller);
  if (!matched) {
    spdlog::warn("drain: prestop refused: {}", matched.error());
    count_("refused");
    write_all(fd, "refused " + matched.error() + "\n");
    return;
  }
  const model::Pod* pod = *matched;
  model::ObjectKey key = pod->key;
  std::string uid = pod->uid;
  spdlog::info("drain: prestop from pod {} ({})", key.str(), caller->describe());
  Coordinator::RunAction run;
  if (can_run)
    run = [fd, &buffer](const std::string& spec, TimePoint deadline) -> Result<std::string> {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      write_all(fd, "drain " + std::to_string(std::max<int64_t>(left, 0)) + " " + spec + "\n");
      auto line = read_line(fd, buffer, deadline, kMaxLine);
      if (!line)
        return Error{
            "the prestop client gave no answer before the drain budget ended (or hung up)"};
      if (line->rfind("ran ok", 0) == 0) return line->size() > 7 ? line->substr(7) : "ran";
      if (line->rfind("ran error ", 0) == 0) return Error{line->substr(10)};
      return Error{"the prestop client answered \"" + line->substr(0, 200) + "\""};
    };
  Verdict v = c_->prestop(
      key, uid, [fd] { return peer_gone(fd); }, action, run);
  count_(v.release ? "released" : "failed");
  if (v.release)
    spdlog::info("drain: prestop of {} released: {}", key.str(), v.reason);
  else
    spdlog::warn("drain: prestop of {} not released: {}", key.str(), v.reason);
  write_all(fd, (v.release ? "released " : "failed ") + v.reason + "\n");
}

// ---- client ----

std::optional<milliseconds> parse_duration(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double v = 0;
  try {
    v = std::stod(s.substr(0, i));
  } catch (...) {
    return std::nullopt;
  }
  std::string unit = s.substr(i);
  double ms = 0;
  if (unit.empty() || unit == "s")
    ms = v * 1000;
  else if (unit == "ms")
    ms = v;
  else if (unit == "m")
    ms = v * 60000;
  else if (unit == "h")
    ms = v * 3600000;
  else
    return std::nullopt;
  // A year at most: beyond it the number is a typo, and past int64 the cast is undefined.
  if (!(ms <= 365.0 * 24 * 3600 * 1000)) return std::nullopt;
  return milliseconds(static_cast<int64_t>(ms));
}

Status verify_drain_socket(const std::string& path, bool allow_writable_dir) {
  struct stat sock {};
  if (::lstat(path.c_str(), &sock) != 0)
    return Error{"cannot reach the agent at " + path + ": " + std::strerror(errno)};
  if (!S_ISSOCK(sock.st_mode)) return Error{path + " is not a socket (a link or a file?)"};
  std::string dir = directory_of(path);
  struct stat d {};
  if (::lstat(dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode))
    return Error{"the drain socket's directory " + dir + " is not a directory"};
  if (d.st_uid != 0 && d.st_uid != sock.st_uid)
    return Error{"the drain socket's directory " + dir + " is owned by uid " +
                 std::to_string(d.st_uid) + ", not by root or the socket's owner"};
  if ((d.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return Error{"the drain socket's directory " + dir +
                 " is writable by group or others: anyone could replace the socket"};
  if (!allow_writable_dir && ::access(dir.c_str(), W_OK) == 0)
    return Error{"the drain socket's directory " + dir +
                 " is writable by this pod: mount it read-only (readOnly: true), or a process "
                 "in a pod could replace the agent's socket with its own"};
  return {};
}

Status verify_drain_server(int fd, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return Error{std::string("drain socket credentials: ") + std::strerror(errno)};
  struct stat sock {};
  if (::stat(path.c_str(), &sock) != 0)
    return Error{"drain socket " + path + ": " + std::strerror(errno)};
  if (cred.uid != sock.st_uid)
    return Error{"the server on " + path + " runs as uid " + std::to_string(cred.uid) +
                 ", but the socket belongs to uid " + std::to_string(sock.st_uid)};
  return {};
}

PrestopOutcome run_prestop(const PrestopClientOptions& opts) {
  auto deadline = Clock::now() + opts.timeout;
  std::string last = "not tried";
  std::optional<std::string> action_ran;  // "ok <what>" or "error <why>" once run
  while (true) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (opts.socket.size() >= sizeof addr.sun_path) {
      return {2, "socket path too long: " + opts.socket};
    }
    std::memcpy(addr.sun_path, opts.socket.c_str(), opts.socket.size());
    sockaddr* sa = static_cast<sockaddr*>(static_cast<void*>(&addr));
    // A socket that is not verifiably the agent's is refused outright (never retried: it
    // will not become trustworthy, and waiting would only delay the pod's shutdown).
    // A missing socket is retried below, as an agent that is restarting.
    Status trusted = verify_drain_socket(opts.socket, opts.allow_writable_dir);
    if (!trusted && ::access(opts.socket.c_str(), F_OK) == 0) {
      if (fd >= 0) ::close(fd);
      return {6, "untrusted drain socket: " + trusted.error()};
    }
    if (fd >= 0 && trusted && ::connect(fd, sa, sizeof addr) == 0) {
      if (Status server = verify_drain_server(fd, opts.socket); !server) {
        ::close(fd);
        return {6, "untrusted drain socket: " + server.error()};
      }
      write_all(fd, "prestop 2 action=" + opts.action + "\n");
      std::string buffer;
      std::optional<std::string> got;
      while ((got = read_line(fd, buffer, deadline, kMaxLine)) && got->rfind("drain ", 0) == 0) {
        // "drain <ms left> <spec>": the pod is removed everywhere; run its drain action once
        // (a restarted agent asks again: the answer is the first run's).
        if (!action_ran) {
          auto sp = got->find(' ', 6);
          // The server's number, clamped to this client's own timeout (a bad one is 0).
          int64_t left = sp == std::string::npos
                             ? 0
                             : std::strtoll(got->substr(6, sp - 6).c_str(), nullptr, 10);
          left = std::clamp<int64_t>(left, 0, opts.timeout.count());
          std::string spec = sp == std::string::npos ? "" : got->substr(sp + 1);
          auto until = std::min(Clock::now() + milliseconds(left), deadline);
          auto budget = std::max(milliseconds(1),
                                 std::chrono::duration_cast<milliseconds>(until - Clock::now()));
          auto parsed = parse_drain_action(spec);
          auto r = parsed ? run_drain_action(*parsed, budget) : Result<std::string>(parsed.error());
          action_ran = r ? "ok " + *r : "error " + r.error();
          (r ? std::cout : std::cerr) << "endpointd prestop: drain action " << spec << ": "
                                      << (r ? *r : r.error()) << std::endl;
        }
        write_all(fd, "ran " + *action_ran + "\n");
      }
      ::close(fd);
      if (got) {
        std::string line = *got;
        auto sp = line.find(' ');
        std::string word = line.substr(0, sp);
        std::string reason = sp == std::string::npos ? "" : line.substr(sp + 1);
        if (word == "released") {
          return {0, reason};
        }
        if (word == "refused") {
          return {3, "refused: " + reason};
        }
        // "failed ... retry" answers from a starting or busy agent are retried.
        if (reason.size() < 5 || reason.substr(reason.size() - 5) != "retry") {
          return {4, "not released: " + reason};
        }
        last = reason;
      } else {
        // read_line gives up within a millisecond of the deadline: count that as the timeout.
        std::string before = last == "not tried" ? "" : "; before that: " + last;
        last = Clock::now() + milliseconds(2) >= deadline
                   ? "no answer within the timeout" + before
                   : "the agent closed the connection without an answer" + before;
      }
    } else {
      last = !trusted ? trusted.error()
                      : std::string("cannot reach the agent at ") + opts.socket + ": " +
                            std::strerror(errno);
      if (fd >= 0) ::close(fd);
    }
    if (Clock::now() + opts.retry >= deadline) {
      return {5, "timed out after " + std::to_string(opts.timeout.count()) + " ms; last: " + last};
    }
    std::this_thread::sleep_for(opts.retry);
  }
}

int prestop_main(int argc, char** argv) {
  PrestopClientOptions opts;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& flag) -> std::optional<std::string> {
      if (a == flag && i + 1 < argc) return std::string(argv[++i]);
      if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
      return std::nullopt;
    };
    if (auto v = value("--drain-socket")) {
      opts.socket = *v;
    } else if (auto act = value("--drain-action")) {
      // Checked here for the user at the terminal; the agent checks it again and reports it.
      if (auto parsed = parse_drain_action(*act); !parsed)
        std::cerr << "endpointd prestop: " << parsed.error()
                  << " (the pod is released after removal without it)\n";
      opts.action = *act;
    } else if (a == "--allow-writable-socket-dir") {
      opts.allow_writable_dir = true;
    } else if (auto t = value("--timeout")) {
      auto d = parse_duration(*t);
      if (!d) {
        std::cerr << "endpointd prestop: bad --timeout " << *t << "\n";
        return 2;
      }
      opts.timeout = *d;
    } else if (a == "prestop") {
      continue;
    } else {
      std::cerr << "usage: endpointd prestop [--drain-socket PATH] [--timeout DURATION] "
                   "[--allow-writable-socket-dir] [--drain-action "
                   "exec:COMMAND|signal:NAME[:PIDFILE]|http:URL]\n";
      return 2;
    }
  }
  PrestopOutcome out = run_prestop(opts);
  (out.exit_code == 0 ? std::cout : std::cerr) << "endpointd prestop: " << out.message << "\n";
  return out.exit_code;
}

}  // namespace endpointd::drain
