// Network namespaces for real-traffic tests.
#include "tests/netns/netns.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace endpointd::netns {
namespace {

std::atomic<int> g_counter{0};

std::string sysctl_path(const std::string& key) {
  std::string p = "/proc/sys/";
  for (char c : key) p += c == '.' ? '/' : c;
  return p;
}

}  // namespace

std::string unique_prefix() {
  return "epd-" + std::to_string(getpid()) + "-" + std::to_string(g_counter++) + "-";
}

bool running_as_root() {
  return geteuid() == 0;
}

std::string scratch_dir() {
  static const std::string dir = [] {
    std::string d = "/tmp/epd-test-" + std::to_string(getpid());
    mkdir(d.c_str(), 0755);
    return d;
  }();
  return dir;
}

int sweep_stale_namespaces() {
  int removed = 0;
  DIR* d = opendir("/run/netns");
  if (d == nullptr) return 0;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("epd-", 0) != 0) continue;
    size_t end = name.find('-', 4);
    if (end == std::string::npos || end == 4) continue;
    std::string digits = name.substr(4, end - 4);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == getpid()) continue;
    if (kill(pid, 0) == 0 || errno == EPERM) continue;  // that run is still alive
    stale.push_back(name);
  }
  closedir(d);
  for (const auto& name : stale) {
    if (run_command({"ip", "netns", "delete", name}).ok()) ++removed;
  }
  // Log directories of dead runs, too.
  if (DIR* t = opendir("/tmp")) {
    std::vector<std::string> dirs;
    while (dirent* e = readdir(t)) {
      std::string name = e->d_name;
      if (name.rfind("epd-test-", 0) != 0) continue;
      std::string digits = name.substr(9);
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      pid_t pid = static_cast<pid_t>(std::stol(digits));
      if (pid != getpid() && kill(pid, 0) != 0 && errno != EPERM) dirs.push_back("/tmp/" + name);
    }
    closedir(t);
    for (const auto& d : dirs) run_command({"rm", "-rf", "--", d});
  }
  return removed;
}

Netns::Netns(std::string name) : name_(std::move(name)) {
  run_checked({"ip", "netns", "add", name_});
  std::string path = "/run/netns/" + name_;
  fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    int e = errno;
    run_command({"ip", "netns", "delete", name_});
    throw std::runtime_error("open " + path + ": " + std::strerror(e));
  }
  try {
    ip({"link", "set", "lo", "up"});
  } catch (...) {
    close(fd_);
    run_command({"ip", "netns", "delete", name_});
    throw;
  }
}

Netns::~Netns() {
  processes_.clear();  // stop every process before its namespace goes
  if (fd_ >= 0) close(fd_);
  run_command({"ip", "netns", "delete", name_});
}

void Netns::run_on_thread(const std::function<void()>& body) {
  std::exception_ptr setns_error;
  std::thread t([&] {
    if (setns(fd_, CLONE_NEWNET) != 0) {
      setns_error = std::make_exception_ptr(
          std::runtime_error("setns " + name_ + ": " + std::strerror(errno)));
      return;
    }
    body();
  });
  t.join();
  if (setns_error) std::rethrow_exception(setns_error);
}

CommandResult Netns::exec(const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {"ip", "netns", "exec", name_};
  full.insert(full.end(), argv.begin(), argv.end());
  return run_command(full);
}

std::string Netns::exec_checked(const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {"ip", "netns", "exec", name_};
  full.insert(full.end(), argv.begin(), argv.end());
  return run_checked(full);
}

std::string Netns::sh(const std::string& cmd, int* exit_code) const {
  CommandResult r = exec({"sh", "-c", cmd});
  if (exit_code) *exit_code = r.exit_code;
  return r.output;
}

std::string Netns::ip(const std::vector<std::string>& args) const {
  std::vector<std::string> full = {"ip", "-n", name_};
  full.insert(full.end(), args.begin(), args.end());
  return run_checked(full);
}

void Netns::set_sysctl(const std::string& key, const std::string& value) {
  // /proc/sys/net resolves against the opening thread's namespace.
  run([&] {
    std::string path = sysctl_path(key);
    std::ofstream out(path);
    out << value;
    out.flush();
    if (!out) throw std::runtime_error("sysctl " + key + "=" + value + " in " + name_ + " failed");
  });
}

std::string Netns::sysctl(const std::string& key) {
  return run([&] {
    std::ifstream in(sysctl_path(key));
    if (!in) throw std::runtime_error("sysctl " + key + " unreadable in " + name_);
    std::string v;
    std::getline(in, v);
    return v;
  });
}

Process& Netns::spawn(std::vector<std::string> argv, const std::string& log_name, bool ready_pipe,
                      std::vector<std::string> env) {
  SpawnOptions opts;
  opts.argv = std::move(argv);
  opts.log_path = log_name.empty() ? "" : scratch_dir() + "/" + name_ + "-" + log_name;
  opts.netns_fd = fd_;
  opts.ready_pipe = ready_pipe;
  opts.env = std::move(env);
  processes_.push_back(std::make_unique<Process>(opts));
  return *processes_.back();
}

}  // namespace endpointd::netns
