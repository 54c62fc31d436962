// Child processes for the namespace tests: one-shot commands whose output is captured, and
// long-running processes (servers, clients, agents) that are killed and reaped on destruction.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace endpointd::netns {

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal or not started
  std::string output;  // stdout and stderr, interleaved
  bool ok() const { return exit_code == 0; }
};

// Runs argv[0] (searched in PATH) and waits for it. Never throws on a failing command.
CommandResult run_command(const std::vector<std::string>& argv);
// Like run_command, but throws std::runtime_error with the output when the command fails.
std::string run_checked(const std::vector<std::string>& argv);

struct SpawnOptions {
  std::vector<std::string> argv;
  std::string log_path;  // stdout and stderr go here (truncated); empty: /dev/null
  int netns_fd = -1;     // setns(CLONE_NEWNET) into this namespace before exec; -1: stay
  // Pass the write end of a pipe as fd 3; the child writes one byte to it when it is ready
  // (the test programs take --ready-fd=3). Process::wait_ready() waits for that byte.
  bool ready_pipe = false;
  std::vector<std::string> env;  // extra NAME=VALUE entries
};

// A spawned process. The child dies with the thread that spawned it (PR_SET_PDEATHSIG), so a
// killed test run leaves no process behind; the destructor sends SIGTERM, then SIGKILL after
// a short grace, and reaps it.
class Process {
 public:
  explicit Process(const SpawnOptions& opts);  // throws std::runtime_error if fork fails
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // True once the ready byte arrived; false on timeout or if the child exited first.
  bool wait_ready(std::chrono::milliseconds timeout);
  void signal(int sig);
  // Waits for exit; returns the wait status decoded (exit code, or 128+signal), or nullopt on
  // timeout. Reaps the child.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  bool running();
  // SIGTERM, wait up to `grace`, then SIGKILL; reaps. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  std::string log() const;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_status_ = -1;
  int ready_fd_ = -1;
  std::string log_path_;
};

}  // namespace endpointd::netns
