// The conntrack sysctls against the kernel (root): the timeouts are per network namespace and
// writable there, nf_conntrack_max is not (an error naming it), and a read-only /sys leaves the
// hash table alone while everything else is applied.
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "proxy/conntrack_sysctl.h"
#include "tests/netns/fixture.h"
#include "tests/netns/netns.h"

namespace endpointd::proxy {
namespace {

using netns::Netns;
using std::chrono::seconds;

std::string host_sysctl(const std::string& name) {
  std::string v;
  std::ifstream("/proc/sys/net/netfilter/" + name) >> v;
  return v;
}

// Reads a value the way an operator would: `sysctl -n` in a process inside the namespace.
std::string sysctl_in(const Netns& ns, const std::string& name) {
  std::string out = ns.exec_checked({"sysctl", "-n", "net.netfilter." + name});
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

class ConntrackSysctlNetnsTest : public netns::NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    if (!std::filesystem::exists("/proc/sys/net/netfilter/nf_conntrack_udp_timeout"))
      GTEST_SKIP() << "nf_conntrack is not loaded";
    ns_ = std::make_unique<Netns>(netns::unique_prefix() + "ctsysctl");
  }
  void TearDown() override { ns_.reset(); }
  std::unique_ptr<Netns> ns_;
};

TEST_F(ConntrackSysctlNetnsTest, TimeoutsAreSetInTheCallersNamespaceOnly) {
  const char* names[] = {"nf_conntrack_tcp_timeout_established",
                         "nf_conntrack_tcp_timeout_close_wait", "nf_conntrack_tcp_be_liberal",
                         "nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"};
  std::map<std::string, std::string> host_before;
  for (const char* n : names) host_before[n] = host_sysctl(n);

  // Values no kernel default has.
  ConntrackSysctls s;
  s.tcp_established_timeout = seconds(86399);
  s.tcp_close_wait_timeout = seconds(3599);
  s.tcp_be_liberal = true;
  s.udp_timeout = seconds(31);
  s.udp_stream_timeout = seconds(121);
  if (sysctl_in(*ns_, "nf_conntrack_tcp_be_liberal") == "1") GTEST_SKIP() << "be_liberal is on";
  auto r = ns_->run([&] { return apply_conntrack_sysctls(s); });
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->written.size(), 5u);
  EXPECT_EQ(sysctl_in(*ns_, "nf_conntrack_tcp_timeout_established"), "86399");
  EXPECT_EQ(sysctl_in(*ns_, "nf_conntrack_tcp_timeout_close_wait"), "3599");
  EXPECT_EQ(sysctl_in(*ns_, "nf_conntrack_tcp_be_liberal"), "1");
  EXPECT_EQ(sysctl_in(*ns_, "nf_conntrack_udp_timeout"), "31");
  EXPECT_EQ(sysctl_in(*ns_, "nf_conntrack_udp_timeout_stream"), "121");
  for (const char* n : names) EXPECT_EQ(host_sysctl(n), host_before[n]) << n;

  // Applied again: nothing to write.
  auto again = ns_->run([&] { return apply_conntrack_sysctls(s); });
  ASSERT_TRUE(again) << again.error();
  EXPECT_TRUE(again->written.empty());
}

TEST_F(ConntrackSysctlNetnsTest, TheMaximumCannotBeSetOutsideTheHostNamespace) {
  uint64_t current = std::stoull(sysctl_in(*ns_, "nf_conntrack_max"));
  ConntrackSysctls s;
  s.max_per_core = static_cast<uint32_t>(current + 1);
  s.udp_timeout = seconds(33);
  auto r = ns_->run([&] { return apply_conntrack_sysctls(s, "/proc/sys", "/sys/module", 1); });
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("net.netfilter.nf_conntrack_max=" + std::to_string(current + 1)),
            std::string::npos)
      << r.error();
  EXPECT_NE(r.error().find("/proc/sys/net/netfilter/nf_conntrack_max"), std::string::npos)
      << r.error();
  EXPECT_EQ(host_sysctl("nf_conntrack_max"), std::to_string(current));
}

// /sys mounted read-only (docker#24000): stood in for by a read-only tmpfs in a mount
// namespace of the test's own thread.
TEST_F(ConntrackSysctlNetnsTest, AReadOnlySysLeavesTheHashTableAndAppliesTheRest) {
  auto dir = std::filesystem::temp_directory_path() / ("epd-ct-ro-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "proc/net/netfilter");
  std::filesystem::create_directories(dir / "module");
  std::ofstream(dir / "proc/net/netfilter/nf_conntrack_max") << "65536\n";
  std::ofstream(dir / "proc/net/netfilter/nf_conntrack_udp_timeout") << "30\n";
  std::string failure;
  Result<ConntrackSysctlsApplied> r = Error{"not run"};
  std::string hashsize_after;
  std::thread t([&] {
    if (unshare(CLONE_NEWNS) != 0) {
      failure = "unshare";
      return;
    }
    std::string m = (dir / "module").string();
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", m.c_str(), "tmpfs", 0, "size=64k") != 0) {
      failure = "mount";
      return;
    }
    std::filesystem::create_directories(dir / "module/nf_conntrack/parameters");
    std::ofstream(dir / "module/nf_conntrack/parameters/hashsize") << "16384\n";
    if (mount("tmpfs", m.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=64k") != 0) {
      failure = "remount read-only";
      return;
    }
    ConntrackSysctls s;
    s.max_per_core = 32768;
    s.udp_timeout = seconds(60);
    r = apply_conntrack_sysctls(s, (dir / "proc").string(), m, 4);
    std::ifstream(dir / "module/nf_conntrack/parameters/hashsize") >> hashsize_after;
    umount2(m.c_str(), MNT_DETACH);
  });
  t.join();
  std::string max_after, udp_after;
  std::ifstream(dir / "proc/net/netfilter/nf_conntrack_max") >> max_after;
  std::ifstream(dir / "proc/net/netfilter/nf_conntrack_udp_timeout") >> udp_after;
  std::filesystem::remove_all(dir);
  ASSERT_EQ(failure, "");
  ASSERT_TRUE(r) << r.error();
  EXPECT_NE(r->read_only_sys.find("read-only"), std::string::npos) << r->read_only_sys;
  EXPECT_NE(r->read_only_sys.find("/nf_conntrack/parameters/hashsize"), std::string::npos)
      << r->read_only_sys;
  EXPECT_EQ(hashsize_after, "16384");
  EXPECT_EQ(max_after, "131072");
  EXPECT_EQ(udp_after, "60");
  EXPECT_EQ(r->written, (std::vector<std::string>{"net.netfilter.nf_conntrack_max=131072",
                                                  "net.netfilter.nf_conntrack_udp_timeout=60"}));
}

}  // namespace
}  // namespace endpointd::proxy
