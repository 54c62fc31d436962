// Child processes for the namespace tests: fork + setns + exec, output to a file, reaped.
#include "tests/netns/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace endpointd::netns {
namespace {

// argv/envp as the C arrays exec wants, built before fork (no allocation in the child).
struct CArgs {
  explicit CArgs(const std::vector<std::string>& v) {
    for (const auto& s : v) ptrs.push_back(const_cast<char*>(s.c_str()));
    ptrs.push_back(nullptr);
  }
  std::vector<char*> ptrs;
};

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int pidfd_open(pid_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

// Waits until the pidfd is readable (the process exited) or the timeout passes.
bool wait_pidfd(pid_t pid, std::chrono::milliseconds timeout) {
  int fd = pidfd_open(pid);
  if (fd < 0) return true;  // already reaped or gone
  pollfd p{fd, POLLIN, 0};
  int r;
  do {
    r = poll(&p, 1, static_cast<int>(timeout.count()));
  } while (r < 0 && errno == EINTR);
  close(fd);
  return r > 0;
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv) {
  CommandResult result;
  if (argv.empty()) return result;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    result.output = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  CArgs args(argv);
  pid_t pid = -1;
  int err = posix_spawnp(&pid, args.ptrs[0], &fa, nullptr, args.ptrs.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (err != 0) {
    close(fds[0]);
    result.output = "spawn " + argv[0] + ": " + std::strerror(err);
    return result;
  }
  char buf[4096];
  for (;;) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      result.output.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string run_checked(const std::vector<std::string>& argv) {
  CommandResult r = run_command(argv);
  if (!r.ok()) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    throw std::runtime_error("command failed (" + std::to_string(r.exit_code) + "): " + cmd + "\n" +
                             r.output);
  }
  return r.output;
}

Process::Process(const SpawnOptions& opts) : log_path_(opts.log_path) {
  if (opts.argv.empty()) throw std::runtime_error("Process: empty argv");
  int ready[2] = {-1, -1};
  if (opts.ready_pipe && pipe2(ready, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  CArgs args(opts.argv);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& e : opts.env) env_strings.push_back(e);
  CArgs envp(env_strings);
  std::string log = opts.log_path.empty() ? "/dev/null" : opts.log_path;
  pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    if (ready[0] >= 0) close(ready[0]), close(ready[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    if (opts.netns_fd >= 0 && setns(opts.netns_fd, CLONE_NEWNET) != 0) _exit(126);
    int in = open("/dev/null", O_RDONLY);
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (in < 0 || out < 0) _exit(125);
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    if (ready[1] >= 0) {
      if (ready[1] == 3) {
        fcntl(3, F_SETFD, 0);
      } else {
        dup2(ready[1], 3);
      }
    }
    close_range(ready[1] >= 0 ? 4 : 3, ~0U, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvpe(args.ptrs[0], args.ptrs.data(), envp.ptrs.data());
    _exit(127);
  }
  pid_ = pid;
  if (ready[1] >= 0) close(ready[1]);
  ready_fd_ = ready[0];
}

Process::~Process() {
  stop();
  if (ready_fd_ >= 0) close(ready_fd_);
}

bool Process::wait_ready(std::chrono::milliseconds timeout) {
  if (ready_fd_ < 0) return false;
  pollfd p{ready_fd_, POLLIN, 0};
  int r;
  do {
    r = poll(&p, 1, static_cast<int>(timeout.count()));
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return false;
  char c;
  return read(ready_fd_, &c, 1) == 1;  // 0 bytes: the child closed it by exiting
}

void Process::signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(-pid_, sig), kill(pid_, sig);
}

std::optional<int> Process::wait_exit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return std::nullopt;
  if (reaped_) return exit_status_;
  if (!wait_pidfd(pid_, timeout)) return std::nullopt;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  reaped_ = true;
  exit_status_ = r == pid_ ? decode_status(status) : -1;
  return exit_status_;
}

bool Process::running() {
  if (pid_ <= 0 || reaped_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    exit_status_ = decode_status(status);
    return false;
  }
  return r == 0;
}

void Process::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0 || reaped_) return;
  signal(SIGTERM);
  if (!wait_exit(grace)) {
    signal(SIGKILL);
    wait_exit(std::chrono::milliseconds(10000));
  }
}

std::string Process::log() const {
  if (log_path_.empty()) return {};
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace endpointd::netns
