// Running a drain action, in the prestop client inside the container.
#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "drain/action.h"

namespace endpointd::drain {

namespace {
Result<std::string> run_exec(const DrainAction& a, std::chrono::milliseconds timeout) {
  auto start = std::chrono::steady_clock::now();
  // The child only makes system calls until exec (another thread of this process may hold the
  // allocator's lock at the fork), so argv is made here.
  std::vector<char*> argv;
  for (const auto& w : a.argv) argv.push_back(const_cast<char*>(w.c_str()));
  argv.push_back(nullptr);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return Error{std::string("pipe: ") + std::strerror(errno)};
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    return Error{std::string("fork: ") + std::strerror(errno)};
  }
  if (pid == 0) {
    ::execvp(argv[0], argv.data());
    int e = errno;
    [[maybe_unused]] auto n = ::write(pipefd[1], &e, sizeof e);
    ::_exit(127);
  }
  ::close(pipefd[1]);
  int exec_errno = 0;
  // The pipe closes on a successful exec (CLOEXEC) or carries exec's errno.
  if (::read(pipefd[0], &exec_errno, sizeof exec_errno) != sizeof exec_errno) exec_errno = 0;
  ::close(pipefd[0]);
  int status = 0;
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() - start >= timeout) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return Error{"`" + a.spec.substr(5) + "` did not finish within " +
                   std::to_string(timeout.count()) + " ms (killed)"};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  start)
                .count();
  if (exec_errno != 0) return Error{"cannot run `" + a.argv[0] + "`: " + std::strerror(exec_errno)};
  if (WIFSIGNALED(status))
    return Error{"`" + a.spec.substr(5) + "` was killed by " + signal_name(WTERMSIG(status))};
  if (WEXITSTATUS(status) != 0)
    return Error{"`" + a.spec.substr(5) + "` exited with " + std::to_string(WEXITSTATUS(status))};
  return "`" + a.spec.substr(5) + "` exited 0 after " + std::to_string(ms) + " ms";
}

Result<std::string> run_signal(const DrainAction& a) {
  pid_t pid = 1;
  if (!a.pidfile.empty()) {
    std::ifstream f(a.pidfile);
    if (!f) return Error{"cannot read pidfile " + a.pidfile + ": " + std::strerror(errno)};
    long v = 0;
    if (!(f >> v) || v <= 0) return Error{"pidfile " + a.pidfile + " holds no process id"};
    pid = static_cast<pid_t>(v);
  }
  if (::kill(pid, a.signal) != 0)
    return Error{"cannot send " + signal_name(a.signal) + " to pid " + std::to_string(pid) + ": " +
                 std::strerror(errno)};
  return signal_name(a.signal) + " sent to pid " + std::to_string(pid);
}

Result<std::string> run_http(const DrainAction& a, std::chrono::milliseconds timeout) {
  CURL* h = curl_easy_init();
  if (!h) return Error{"cannot start an HTTP client"};
  curl_easy_setopt(h, CURLOPT_URL, a.url.c_str());
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  // The answer's body is not needed; a sink keeps it off stdout.
  curl_easy_setopt(
      h, CURLOPT_WRITEFUNCTION,
      +[](char*, size_t size, size_t n, void*) -> size_t { return size * n; });
  CURLcode rc = curl_easy_perform(h);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK) return Error{"POST " + a.url + ": " + curl_easy_strerror(rc)};
  if (code < 200 || code > 299)
    return Error{"POST " + a.url + " answered HTTP " + std::to_string(code)};
  return "POST " + a.url + " answered HTTP " + std::to_string(code);
}

}  // namespace

Result<std::string> run_drain_action(const DrainAction& action, std::chrono::milliseconds timeout) {
  switch (action.kind) {
    case DrainAction::Kind::kExec:
      return run_exec(action, timeout);
    case DrainAction::Kind::kSignal:
      return run_signal(action);
    case DrainAction::Kind::kHttp:
      return run_http(action, timeout);
  }
  return Error{"unknown drain action"};
}

}  // namespace endpointd::drain
