// The conntrack sysctl writer against a temporary directory standing in for /proc/sys and
// /sys/module: kube-proxy's arithmetic and its write-only-what-differs rule.
#include "proxy/conntrack_sysctl.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace endpointd::proxy {
namespace {

using std::chrono::hours;
using std::chrono::seconds;

class SysctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("epd-ct-sysctl-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(root_ / "proc/net/netfilter");
    std::filesystem::create_directories(root_ / "module/nf_conntrack/parameters");
    put("nf_conntrack_max", "65536");
    put("nf_conntrack_tcp_timeout_established", "432000");
    put("nf_conntrack_tcp_timeout_close_wait", "60");
    put("nf_conntrack_tcp_be_liberal", "0");
    put("nf_conntrack_udp_timeout", "30");
    put("nf_conntrack_udp_timeout_stream", "120");
    put_hashsize("16384");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void put(const std::string& name, const std::string& v) {
    std::ofstream(root_ / "proc/net/netfilter" / name) << v << "\n";
  }
  void put_hashsize(const std::string& v) {
    std::ofstream(root_ / "module/nf_conntrack/parameters/hashsize") << v << "\n";
  }
  std::string get(const std::string& name) {
    std::string v;
    std::ifstream(root_ / "proc/net/netfilter" / name) >> v;
    return v;
  }
  std::string hashsize() {
    std::string v;
    std::ifstream(root_ / "module/nf_conntrack/parameters/hashsize") >> v;
    return v;
  }
  Result<ConntrackSysctlsApplied> apply(const ConntrackSysctls& s, unsigned cpus) {
    return apply_conntrack_sysctls(s, (root_ / "proc").string(), (root_ / "module").string(), cpus);
  }

  std::filesystem::path root_;
};

TEST(ConntrackMax, FollowsKubeProxy) {
  ConntrackSysctls s;
  EXPECT_EQ(conntrack_max_for(s, 8), 0u);  // nothing set
  s.min = 131072;
  EXPECT_EQ(conntrack_max_for(s, 8), 0u);  // min alone does nothing
  s.max_per_core = 0;
  EXPECT_EQ(conntrack_max_for(s, 8), 0u);  // maxPerCore 0: leave the node's value
  s.max_per_core = 32768;
  EXPECT_EQ(conntrack_max_for(s, 2), 131072u);  // 65536 scaled is below the floor
  EXPECT_EQ(conntrack_max_for(s, 8), 262144u);  // scaled above the floor
  s.min.reset();
  EXPECT_EQ(conntrack_max_for(s, 1), 32768u);
  EXPECT_EQ(conntrack_max_for(s, 0), 32768u);  // at least one CPU
}

TEST_F(SysctlTest, WritesWhatIsConfiguredAndDifferentOnly) {
  ConntrackSysctls s;
  s.max_per_core = 32768;
  s.min = 131072;
  s.tcp_established_timeout = hours(24);
  s.tcp_close_wait_timeout = hours(1);
  s.tcp_be_liberal = true;
  s.udp_timeout = seconds(30);  // already so
  s.udp_stream_timeout = seconds(180);
  auto r = apply(s, 8);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->written,
            (std::vector<std::string>{"net.netfilter.nf_conntrack_max=262144", "hashsize=65536",
                                      "net.netfilter.nf_conntrack_tcp_timeout_established=86400",
                                      "net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600",
                                      "net.netfilter.nf_conntrack_tcp_be_liberal=1",
                                      "net.netfilter.nf_conntrack_udp_timeout_stream=180"}));
  EXPECT_TRUE(r->read_only_sys.empty());
  EXPECT_EQ(get("nf_conntrack_max"), "262144");
  EXPECT_EQ(hashsize(), "65536");
  EXPECT_EQ(get("nf_conntrack_tcp_timeout_established"), "86400");
  EXPECT_EQ(get("nf_conntrack_tcp_timeout_close_wait"), "3600");
  EXPECT_EQ(get("nf_conntrack_tcp_be_liberal"), "1");
  EXPECT_EQ(get("nf_conntrack_udp_timeout"), "30");
  EXPECT_EQ(get("nf_conntrack_udp_timeout_stream"), "180");

  // A second run finds everything in place.
  auto again = apply(s, 8);
  ASSERT_TRUE(again) << again.error();
  EXPECT_TRUE(again->written.empty());
}

TEST_F(SysctlTest, UnsetOrZeroSettingsAreLeftAlone) {
  ConntrackSysctls s;
  s.min = 1000000;                         // without maxPerCore: nothing
  s.tcp_established_timeout = seconds(0);  // kube-proxy: 0 means leave it
  s.udp_timeout = seconds(0);
  s.tcp_be_liberal = false;  // never written as 0
  put("nf_conntrack_tcp_be_liberal", "1");
  auto r = apply(s, 4);
  ASSERT_TRUE(r) << r.error();
  EXPECT_TRUE(r->written.empty());
  EXPECT_EQ(get("nf_conntrack_max"), "65536");
  EXPECT_EQ(get("nf_conntrack_tcp_timeout_established"), "432000");
  EXPECT_EQ(get("nf_conntrack_tcp_be_liberal"), "1");
  EXPECT_EQ(hashsize(), "16384");
}

TEST_F(SysctlTest, LowersTheMaximumButNeverTheHashTable) {
  // kube-proxy sets nf_conntrack_max to its value whichever way it moves; the hash table only
  // grows.
  put_hashsize("262144");
  ConntrackSysctls s;
  s.max_per_core = 1000;
  s.min = 2000;
  auto r = apply(s, 4);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->written, std::vector<std::string>{"net.netfilter.nf_conntrack_max=4000"});
  EXPECT_EQ(get("nf_conntrack_max"), "4000");
  EXPECT_EQ(hashsize(), "262144");
}

TEST_F(SysctlTest, DetectsTheCpuCountWhenNotGiven) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  ASSERT_GT(cpus, 0);
  ConntrackSysctls s;
  s.max_per_core = 100003;  // a value no test tree starts with
  auto r = apply(s, 0);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(get("nf_conntrack_max"), std::to_string(100003 * cpus));
}

TEST_F(SysctlTest, AnErrorNamesTheSettingAndTheFile) {
  std::filesystem::remove(root_ / "proc/net/netfilter/nf_conntrack_udp_timeout_stream");
  ConntrackSysctls s;
  s.tcp_close_wait_timeout = seconds(7);
  s.udp_stream_timeout = seconds(120);
  auto r = apply(s, 1);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("net.netfilter.nf_conntrack_udp_timeout_stream=120"), std::string::npos)
      << r.error();
  EXPECT_NE(r.error().find((root_ / "proc/net/netfilter/nf_conntrack_udp_timeout_stream").string()),
            std::string::npos)
      << r.error();
  EXPECT_EQ(get("nf_conntrack_tcp_timeout_close_wait"), "7");  // the ones before it were set
}

TEST_F(SysctlTest, AMissingHashSizeIsAnErrorNamingIt) {
  std::filesystem::remove(root_ / "module/nf_conntrack/parameters/hashsize");
  ConntrackSysctls s;
  s.max_per_core = 32768;
  auto r = apply(s, 8);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find((root_ / "module/nf_conntrack/parameters/hashsize").string()),
            std::string::npos)
      << r.error();
  EXPECT_NE(r.error().find("nf_conntrack_max=262144"), std::string::npos) << r.error();
}

TEST_F(SysctlTest, AGarbledValueIsRewritten) {
  put("nf_conntrack_tcp_timeout_established", "garbage");
  ConntrackSysctls s;
  s.tcp_established_timeout = seconds(86400);
  auto r = apply(s, 1);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->written,
            std::vector<std::string>{"net.netfilter.nf_conntrack_tcp_timeout_established=86400"});
  EXPECT_EQ(get("nf_conntrack_tcp_timeout_established"), "86400");
}

}  // namespace
}  // namespace endpointd::proxy
