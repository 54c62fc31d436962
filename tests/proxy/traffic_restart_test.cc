// Restart safety of the dataplane with real traffic: node-1's proxy runs as its own process
// (endpointd-traffic-agent: the real ProxySink + NetlinkBackend + Monitor) in the node-1
// namespace of a two-node cluster, while a pod keeps requesting a ClusterIP.
#include <signal.h>
#include <time.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/netns/cluster.h"
#include "tests/netns/fixture.h"

namespace endpointd::proxy {
namespace {

using namespace std::chrono_literals;
using netns::Cluster;
using netns::ClusterSpec;

int64_t wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);  // the load client stamps its records with this clock
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The top-level blocks of an `nft list table` text (each set, map and chain), sorted: `nft
// list` prints chains in creation order, and a repaired chain is created after the others.
std::vector<std::string> blocks(const std::string& table) {
  std::vector<std::string> out;
  std::string cur;
  size_t pos = 0;
  while (pos < table.size()) {
    size_t nl = table.find('\n', pos);
    if (nl == std::string::npos) nl = table.size();
    std::string line = table.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    cur += line + "\n";
    if (line == "\t}" || line == "}") {
      out.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  std::sort(out.begin(), out.end());
  return out;
}

class RestartTest : public netns::NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    cluster_ = std::make_unique<Cluster>(ClusterSpec::make(2, 2));
    for (const auto& name : cluster_->pod_names()) {
      netns::start_server(cluster_->pod(name), {.name = name, .tcp_port = 8080});
    }
  }
  void TearDown() override { cluster_.reset(); }

  netns::Netns& node1() { return cluster_->node("node-1"); }

  // Starts node-1's proxy process and waits for its first full sync.
  netns::Process& start_agent(const std::string& log_name) {
    std::vector<std::string> argv = {
        ENDPOINTD_TRAFFIC_AGENT_PATH,
        "--node-name",
        "node-1",
        "--node-ip",
        "192.168.77.2",
        "--cluster-cidr",
        "10.244.0.0/16",
        "--service",
        "web:10.96.0.60:80=10.244.1.10:8080@node-1,10.244.1.11:8080@node-1,"
        "10.244.2.10:8080@node-2,10.244.2.11:8080@node-2",
        "--service",
        "empty:10.96.0.61:80=",
        "--ready-fd",
        "3"};
    netns::Process& p = node1().spawn(argv, log_name, /*ready_pipe=*/true);
    if (!p.wait_ready(10s)) throw std::runtime_error("agent did not sync: " + p.log());
    return p;
  }

  std::string table() { return node1().exec_checked({"nft", "list", "table", "ip", "endpointd"}); }

  std::unique_ptr<Cluster> cluster_;
};

// 11a. kill -9 of the process holding the dataplane under continuous load through a ClusterIP,
// then a restart: no request fails, the table ends as it was, and the restart changed no element.
TEST_F(RestartTest, KillNineUnderLoadThenRestartDropsNothingAndKeepsTheTable) {
  netns::Process& first = start_agent("agent-1.log");
  const std::string before = table();

  netns::LoadClient load(
      cluster_->pod("node-1-pod-1"),
      {.target = "10.96.0.60:80", .concurrency = 2, .duration_ms = 2500, .interval_ms = 5});
  std::this_thread::sleep_for(500ms);
  int64_t killed_ns = wall_ns();
  first.signal(SIGKILL);
  ASSERT_TRUE(first.wait_exit(5s).has_value());
  std::this_thread::sleep_for(400ms);  // no agent at all: the kernel keeps serving
  EXPECT_EQ(table(), before);
  int64_t restart_ns = wall_ns();
  netns::Process& second = start_agent("agent-2.log");
  int64_t synced_ns = wall_ns();
  netns::LoadResult r = load.wait();

  EXPECT_EQ(r.failed, 0) << (r.errors.empty() ? "" : r.errors.begin()->first);
  EXPECT_GT(r.ok, 100);
  EXPECT_EQ(r.by_backend.size(), 4u);
  int while_dead = 0, after_sync = 0;
  for (const auto& rec : r.records) {
    while_dead += rec.time_ns > killed_ns && rec.time_ns < restart_ns;
    after_sync += rec.time_ns > synced_ns;
  }
  EXPECT_GT(while_dead, 10);
  EXPECT_GT(after_sync, 10);
  EXPECT_EQ(table(), before);
  EXPECT_TRUE(second.running()) << second.log();
  // The restarted agent listed what the kernel held and found every element already right.
  EXPECT_NE(second.log().find(": 0 elements changed"), std::string::npos) << second.log();
}

// 11b. `nft delete chain` on one of endpointd's chains from outside is repaired within 1 s
// (Monitor -> request_resync -> full sync), and the table ends as it was.
TEST_F(RestartTest, ForeignChainDeleteIsRepairedWithinOneSecond) {
  netns::Process& agent = start_agent("agent.log");
  const std::string before = table();
  auto served = [&] {
    netns::LoadClient c(cluster_->pod("node-1-pod-2"),
                        {.target = "10.96.0.60:80", .count = 8, .interval_ms = 0});
    return c.wait();
  };
  ASSERT_EQ(served().ok, 8);

  for (const char* chain : {"nat-prerouting", "filter-forward"}) {
    auto t0 = std::chrono::steady_clock::now();
    node1().exec_checked({"nft", "delete", "chain", "ip", "endpointd", chain});
    bool back = netns::eventually(
        [&] {
          return node1().exec({"nft", "list", "chain", "ip", "endpointd", chain}).ok();
        },
        3s);
    auto took = std::chrono::steady_clock::now() - t0;
    ASSERT_TRUE(back) << chain << " not repaired: " << agent.log();
    EXPECT_LT(took, 1s) << chain;
    EXPECT_TRUE(netns::eventually([&] { return blocks(table()) == blocks(before); }, 1s))
        << table();
    EXPECT_EQ(served().ok, 8) << "after repairing " << chain;
  }
}

}  // namespace
}  // namespace endpointd::proxy
