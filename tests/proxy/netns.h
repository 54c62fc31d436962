// Throwaway network namespaces for the proxy's root tests: created with `ip netns add`,
// deleted in the destructor even when a test fails. Code runs inside one on a thread that
// setns()-es into it, so the test process itself never touches the host's namespace.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

namespace endpointd::proxy::testing {

inline std::string run_cmd(const std::string& cmd, int* status = nullptr) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  if (status) *status = st;
  return out;
}

class NetNs {
 public:
  explicit NetNs(const std::string& tag) {
    static std::atomic<int> counter{0};
    name_ =
        "endpointd-proxy-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    int st = 0;
    std::string out = run_cmd("ip netns add " + name_, &st);
    if (st != 0) throw std::runtime_error("ip netns add: " + out);
    exec("ip link set lo up");
  }
  ~NetNs() { run_cmd("ip netns del " + name_); }
  NetNs(const NetNs&) = delete;
  NetNs& operator=(const NetNs&) = delete;

  const std::string& name() const { return name_; }
  // Runs a shell command inside the namespace.
  std::string exec(const std::string& cmd, int* status = nullptr) const {
    return run_cmd("ip netns exec " + name_ + " " + cmd, status);
  }
  // Runs fn on a thread that joined the namespace; returns when fn does.
  void run(const std::function<void()>& fn) const {
    std::exception_ptr err;
    std::thread t([&] {
      try {
        enter();
        fn();
      } catch (...) {
        err = std::current_exception();
      }
    });
    t.join();
    if (err) std::rethrow_exception(err);
  }
  // Moves the calling thread into the namespace (for threads the test owns).
  void enter() const {
    int fd = open(("/var/run/netns/" + name_).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      if (fd >= 0) close(fd);
      throw std::runtime_error("setns " + name_);
    }
    close(fd);
  }

 private:
  std::string name_;
};

}  // namespace endpointd::proxy::testing
