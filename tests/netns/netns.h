// Network namespaces for real-traffic tests: created with `ip netns add`, deleted on
// destruction (and by a sweeper when a killed run left them behind). Code runs inside one on a
// dedicated thread; processes run inside one and die with it.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tests/netns/process.h"

namespace endpointd::netns {

// Every namespace this harness makes is named "epd-<pid>-<n>-<what>", so a sweeper can tell
// leftovers of dead runs from namespaces in use.
std::string unique_prefix();
// Deletes namespaces named "epd-<pid>-..." whose pid is no longer alive (and their log
// directories /tmp/epd-test-<pid>). Returns how many namespaces it deleted.
int sweep_stale_namespaces();
// Where the harness writes logs (servers, clients): a per-process directory under /tmp.
std::string scratch_dir();
bool running_as_root();

class Netns {
 public:
  // Creates the namespace (throws std::runtime_error on failure) and brings up `lo`.
  explicit Netns(std::string name);
  ~Netns();
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  const std::string& name() const { return name_; }
  int fd() const { return fd_; }

  // Runs fn on a new thread that entered this namespace; returns its result and rethrows its
  // exception. Sockets made inside fn stay in this namespace after it returns.
  template <typename F>
  auto run(F&& fn) -> std::invoke_result_t<F> {
    using R = std::invoke_result_t<F>;
    std::exception_ptr error;
    if constexpr (std::is_void_v<R>) {
      run_on_thread([&] {
        try {
          fn();
        } catch (...) {
          error = std::current_exception();
        }
      });
      if (error) std::rethrow_exception(error);
    } else {
      std::optional<R> out;
      run_on_thread([&] {
        try {
          out.emplace(fn());
        } catch (...) {
          error = std::current_exception();
        }
      });
      if (error) std::rethrow_exception(error);
      return std::move(*out);
    }
  }

  // `ip netns exec <name> <argv...>`.
  CommandResult exec(const std::vector<std::string>& argv) const;
  std::string exec_checked(const std::vector<std::string>& argv) const;
  // A shell command line run inside (`sh -c`, pipes and all); returns its output and, if asked,
  // its exit code.
  std::string sh(const std::string& cmd, int* exit_code = nullptr) const;
  // `ip -n <name> <args...>` (throws on failure).
  std::string ip(const std::vector<std::string>& args) const;
  // Writes /proc/sys/<key with dots as slashes> inside the namespace (throws on failure).
  void set_sysctl(const std::string& key, const std::string& value);
  std::string sysctl(const std::string& key);

  // Starts a process inside this namespace. The namespace owns it: it is stopped before the
  // namespace is deleted. The reference stays valid for the namespace's life. The child gets
  // SIGKILL when the spawning thread dies, so spawn from the test's own thread, not inside run().
  Process& spawn(std::vector<std::string> argv, const std::string& log_name,
                 bool ready_pipe = false, std::vector<std::string> env = {});

 private:
  void run_on_thread(const std::function<void()>& body);

  std::string name_;
  int fd_ = -1;
  std::vector<std::unique_ptr<Process>> processes_;
};

}  // namespace endpointd::netns
