// The drain socket against a hostile caller: connections that come and go leave no thread or
// stack behind, and one caller holding calls open gets its own limit while the agent answers
// at once (the coordinator here has no cluster state, so every admitted call waits for one).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
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
    c_ = std::make_unique<Coordinator>(&board_, nullptr, Coordinator::DnsExpiry{}, o);
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

}  // namespace
}  // namespace endpointd::drain
