// The drain socket against a hostile caller: connections that come and go leave no thread or
// stack behind, and one caller holding calls open gets its own limit while the agent answers
// at once (the coordinator here has no cluster state, so every admitted call waits for one).
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "drain/coordinator.h"
#include "pipeline/ack_board.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;

int connect_to(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

size_t vsz_mib() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0;
  f >> pages;
  return pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) >> 20;
}

size_t rss_mib() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) >> 20;
}

size_t threads() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Runs `fn` in a forked child and returns its exit code and what it wrote to the fd it is
// given. This process has threads (the coordinator's, the logger's): one of them may hold the
// allocator's or a logger's lock at the fork, so the child only makes system calls — no
// allocation, no logging — and anything more runs in a program it executes.
std::pair<int, std::string> in_child(const std::function<int(int out)>& fn) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return {-1, "pipe"};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    ::_exit(fn(pipefd[1]));
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// What another caller reads from the socket within 8 s: a child in a network namespace of
// its own, as another pod would be (the server keys callers by pod, else by network
// namespace, else by pid).
std::string answer_to_another_caller(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size());
  return in_child([&](int out) {
           if (::unshare(CLONE_NEWNET) != 0) return 100;
           int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
           if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
             return 101;
           }
           timeval tv{8, 0};
           ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
           char buf[256];
           ssize_t n = ::recv(fd, buf, sizeof buf, 0);
           if (n > 0 && ::write(out, buf, static_cast<size_t>(n)) != n) return 102;
           return 0;
         })
      .second;
}

// A server that would "release" every caller at once: what a pod able to write the socket's
// directory could put there.
struct Impostor {
  explicit Impostor(const std::string& path) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size());
    ::unlink(path.c_str());
    bound = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 8) == 0;
  }
  ~Impostor() { ::close(fd); }
  // Whether any client connected (a connection waits in the backlog).
  bool contacted() const {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  int fd = -1;
  bool bound = false;
};

class PrestopServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("prestop-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    CoordinatorOptions o;
    o.machine.node_name = "node-a";
    o.drain_socket = (dir_ / "drain.sock").string();
    o.peer_listen = "";
    o.peer_insecure = true;
    c_ = std::make_unique<Coordinator>(&board_, nullptr, o);
    auto st = c_->start();
    ASSERT_TRUE(st.ok()) << st.error();
  }
  void TearDown() override {
    if (c_) c_->stop();
    std::filesystem::remove_all(dir_);
  }
  std::string socket() const { return (dir_ / "drain.sock").string(); }

  std::filesystem::path dir_;
  pipeline::AckBoard board_;
  std::unique_ptr<Coordinator> c_;
};

TEST_F(PrestopServerTest, ConnectionsThatComeAndGoLeaveNoThreadBehind) {
  size_t before = vsz_mib();
  int connected = 0;
  for (int i = 0; i < 1000; ++i) {
    int fd = connect_to(socket());
    if (fd >= 0) {
      ++connected;
      ::close(fd);
    }
    std::this_thread::sleep_for(3ms);
  }
  std::this_thread::sleep_for(500ms);
  // One more connection makes the accept loop join the workers that finished.
  int fd = connect_to(socket());
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::this_thread::sleep_for(300ms);
  size_t after = vsz_mib();
  EXPECT_EQ(connected, 1000);
  // A worker's stack is 8 MiB of address space until it is joined: hundreds of workers left
  // unjoined would be gigabytes.
  EXPECT_LT(after, before + 512) << "VSZ " << before << " MiB → " << after << " MiB";
}

TEST_F(PrestopServerTest, OneCallerHoldingCallsOpenIsLimitedAlone) {
  std::vector<int> held;
  for (int i = 0; i < 16; ++i) {
    int fd = connect_to(socket());
    ASSERT_GE(fd, 0);
    held.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);
  int extra = connect_to(socket());
  ASSERT_GE(extra, 0);
  char buf[256] = {};
  timeval tv{2, 0};
  ::setsockopt(extra, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ssize_t n = ::recv(extra, buf, sizeof buf - 1, 0);
  ::close(extra);
  for (int fd : held) ::close(fd);
  ASSERT_GT(n, 0) << "no answer within 2 s";
  std::string answer(buf, static_cast<size_t>(n));
  EXPECT_EQ(answer.rfind("failed ", 0), 0u) << answer;
  EXPECT_NE(answer.find("has 16 prestop calls in progress already; retry"), std::string::npos)
      << answer;
}

TEST_F(PrestopServerTest, ThreeThousandIdleConnectionsFromOneCallerLeaveOthersServed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the other caller is in a namespace of its own";
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  rlim_t want = std::min<rlim_t>(lim.rlim_max, 8192);
  if (lim.rlim_cur < want) {
    lim.rlim_cur = want;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  ASSERT_GE(want, 3100u) << "the test needs 3,000 descriptors";
  size_t rss_before = rss_mib();
  std::vector<int> held;
  for (int i = 0; i < 3000; ++i) {
    int fd = connect_to(socket());
    ASSERT_GE(fd, 0) << "connection " << i;
    held.push_back(fd);
  }
  std::this_thread::sleep_for(500ms);
  size_t t = threads();
  size_t rss_after = rss_mib();
  // Another caller is still served rather than left behind 3,000 connections. This agent
  // has no cluster state, so what it answers is that (after waiting 5 s for one), not the
  // per-caller limit the first caller hit.
  std::string other = answer_to_another_caller(socket());
  for (int fd : held) ::close(fd);
  std::cout << "3,000 idle connections from one caller: " << t << " threads, RSS " << rss_before
            << " → " << rss_after << " MiB\n";
  EXPECT_LE(t, 256u) << "threads with 3,000 idle connections";
  EXPECT_LE(rss_after, rss_before + 200) << "RSS " << rss_before << " → " << rss_after << " MiB";
  EXPECT_EQ(other.rfind("failed the agent has no synced cluster state", 0), 0u)
      << "another caller read: '" << other << "'";
}

TEST_F(PrestopServerTest, ImpostorInADirectoryThePodCanWriteIsRefused) {
  auto dir = dir_ / "writable";
  std::filesystem::create_directories(dir);
  ::chmod(dir.c_str(), 0755);
  std::string path = (dir / "drain.sock").string();
  Impostor impostor(path);
  ASSERT_TRUE(impostor.bound);
  PrestopClientOptions o;
  o.socket = path;
  o.timeout = 2s;
  PrestopOutcome out = run_prestop(o);
  EXPECT_EQ(out.exit_code, 6) << out.message;
  EXPECT_NE(out.message.find("writable by this pod"), std::string::npos) << out.message;
  EXPECT_FALSE(impostor.contacted()) << "the client talked to the impostor";
}

TEST_F(PrestopServerTest, SocketInADirectoryOthersCanWriteIsRefusedEvenWhenAllowed) {
  auto dir = dir_ / "open";
  std::filesystem::create_directories(dir);
  ::chmod(dir.c_str(), 0777);
  std::string path = (dir / "drain.sock").string();
  Impostor impostor(path);
  ASSERT_TRUE(impostor.bound);
  PrestopClientOptions o;
  o.socket = path;
  o.timeout = 2s;
  o.allow_writable_dir = true;
  PrestopOutcome out = run_prestop(o);
  EXPECT_EQ(out.exit_code, 6) << out.message;
  EXPECT_NE(out.message.find("writable by group or others"), std::string::npos) << out.message;
  EXPECT_FALSE(impostor.contacted());
}

TEST_F(PrestopServerTest, ALinkToTheSocketIsRefused) {
  auto link = dir_ / "link.sock";
  std::filesystem::create_symlink(socket(), link);
  PrestopClientOptions o;
  o.socket = link.string();
  o.timeout = 2s;
  o.allow_writable_dir = true;
  PrestopOutcome out = run_prestop(o);
  EXPECT_EQ(out.exit_code, 6) << out.message;
  EXPECT_NE(out.message.find("not a socket"), std::string::npos) << out.message;
}

TEST_F(PrestopServerTest, ASocketWhoseOwnerIsNotTheServerIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the socket another owner";
  ASSERT_EQ(::chown(socket().c_str(), 65534, 65534), 0);
  PrestopClientOptions o;
  o.socket = socket();
  o.timeout = 2s;
  o.allow_writable_dir = true;
  PrestopOutcome out = run_prestop(o);
  EXPECT_EQ(out.exit_code, 6) << out.message;
  EXPECT_NE(out.message.find("belongs to uid 65534"), std::string::npos) << out.message;
}

// As the chart mounts it: the pod sees the directory read-only, so the agent's socket is
// trusted and the call reaches the agent (which refuses it: the test process is no pod). The
// child makes the mount and executes this test program again, where PrestopChild.Call (below)
// runs the client and writes its message to fd 3.
TEST_F(PrestopServerTest, TheAgentBehindAReadOnlyMountIsTrusted) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace";
  // Everything the child needs is made before the fork.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back("ENDPOINTD_TEST_PRESTOP_SOCKET=" + socket());
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=PrestopChild.Call";
  std::vector<char*> argv{exe.data(), filter.data(), nullptr};
  const char* d = dir_.c_str();
  auto [code, message] = in_child([&](int out) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) ||
        ::mount(d, d, nullptr, MS_BIND, nullptr) ||
        ::mount(nullptr, d, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr)) {
      return 100;
    }
    if (out != 3 && ::dup2(out, 3) != 3) return 101;
    ::execve(exe.c_str(), argv.data(), envp.data());
    return 102;
  });
  ASSERT_NE(code, 100) << "no read-only bind mount";
  ASSERT_NE(code, 102) << "could not execute " << exe;
  // The client talked to the agent: it answers that it has no cluster state yet (this
  // fixture's coordinator has none), which the client retries until its timeout.
  EXPECT_EQ(code, 5) << message;
  EXPECT_NE(message.find("no synced cluster state"), std::string::npos) << message;
}

// The client's half of the test above, in the program it executes behind the read-only mount;
// skipped when run on its own.
TEST(PrestopChild, Call) {
  const char* path = std::getenv("ENDPOINTD_TEST_PRESTOP_SOCKET");
  if (path == nullptr) GTEST_SKIP() << "run by TheAgentBehindAReadOnlyMountIsTrusted";
  PrestopClientOptions o;
  o.socket = path;
  o.timeout = 8s;  // the agent waits 5 s for cluster state before it answers
  PrestopOutcome r = run_prestop(o);
  [[maybe_unused]] auto w = ::write(3, r.message.data(), r.message.size());
  ::_exit(r.exit_code);
}

}  // namespace
}  // namespace endpointd::drain
