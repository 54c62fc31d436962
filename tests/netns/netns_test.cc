// Tests of the namespace harness itself: namespaces and processes are cleaned up, the cluster
// routes pod to pod across nodes, the test server and load client do what tests rely on.
#include <net/if.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <stdexcept>

#include "tests/netns/cluster.h"
#include "tests/netns/fixture.h"

namespace endpointd::netns {
namespace {

bool ns_exists(const std::string& name) {
  struct stat st {};
  return stat(("/run/netns/" + name).c_str(), &st) == 0;
}

bool pid_alive(pid_t pid) {
  return kill(pid, 0) == 0;
}

using HarnessTest = NetnsTest;

TEST_F(HarnessTest, NamespaceIsDeletedOnDestruction) {
  std::string name;
  {
    Netns ns(unique_prefix() + "t");
    name = ns.name();
    EXPECT_TRUE(ns_exists(name));
    std::string links = ns.ip({"-o", "link", "show"});
    EXPECT_NE(links.find("lo"), std::string::npos);
    EXPECT_NE(links.find("UP"), std::string::npos) << links;
  }
  EXPECT_FALSE(ns_exists(name));
}

TEST_F(HarnessTest, NamespaceAndProcessesAreGoneAfterAThrow) {
  std::string name;
  pid_t pid = -1;
  EXPECT_THROW(
      {
        Netns ns(unique_prefix() + "t");
        name = ns.name();
        Process& p = ns.spawn({"sleep", "1000"}, "sleep.log");
        pid = p.pid();
        ASSERT_TRUE(pid_alive(pid));
        throw std::runtime_error("test failed midway");
      },
      std::runtime_error);
  EXPECT_FALSE(ns_exists(name));
  EXPECT_FALSE(pid_alive(pid));
}

TEST_F(HarnessTest, RunExecutesInsideTheNamespace) {
  Netns ns(unique_prefix() + "t");
  ns.ip({"link", "add", "dummy7", "type", "veth", "peer", "name", "dummy8"});
  // if_nametoindex looks the name up in the calling thread's namespace.
  unsigned inside = ns.run([] { return if_nametoindex("dummy7"); });
  EXPECT_NE(inside, 0u);
  EXPECT_THROW(ns.run([]() -> int { throw std::logic_error("inside"); }), std::logic_error);
  ns.set_sysctl("net.ipv4.ip_forward", "1");
  EXPECT_EQ(ns.sysctl("net.ipv4.ip_forward"), "1");
  EXPECT_TRUE(ns.exec({"true"}).ok());
}

TEST_F(HarnessTest, SweeperRemovesNamespacesOfDeadRuns) {
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);
  std::string stale = "epd-" + std::to_string(dead) + "-0-stale";
  run_checked({"ip", "netns", "add", stale});
  Netns mine(unique_prefix() + "alive");
  EXPECT_GE(sweep_stale_namespaces(), 1);
  EXPECT_FALSE(ns_exists(stale));
  EXPECT_TRUE(ns_exists(mine.name()));
}

TEST_F(HarnessTest, ProcessExitStatusAndReadiness) {
  Netns ns(unique_prefix() + "t");
  Process& p = ns.spawn({"sh", "-c", "echo hello; exit 3"}, "sh.log");
  EXPECT_EQ(p.wait_exit(std::chrono::seconds(10)), 3);
  EXPECT_EQ(p.log(), "hello\n");
  // A child that exits without writing the ready byte is not ready.
  Process& q = ns.spawn({"true"}, "", /*ready_pipe=*/true);
  EXPECT_FALSE(q.wait_ready(std::chrono::seconds(10)));
}

class ClusterTest : public NetnsTest {};

TEST_F(ClusterTest, PodToPodAcrossNodesAndServerAnswersWithItsName) {
  std::vector<std::string> names;
  {
    Cluster c(ClusterSpec::demo());
    names = c.namespace_names();
    EXPECT_EQ(names.size(), 2u + 2u + 5u);
    Server web3 =
        start_server(c.pod("web-3"), {.name = "web-3", .tcp_port = 8080, .udp_port = 5353});

    LoadClient tcp(c.pod("web-1"), {.target = "10.244.2.10:8080", .count = 20, .interval_ms = 0});
    LoadResult r = tcp.wait();
    EXPECT_EQ(r.ok, 20);
    EXPECT_EQ(r.failed, 0) << r.records.front().what;
    EXPECT_EQ(r.by_backend["web-3"], 20);

    LoadClient udp(c.pod("web-1"),
                   {.target = "10.244.2.10:5353", .udp = true, .count = 10, .interval_ms = 0});
    LoadResult u = udp.wait();
    EXPECT_EQ(u.ok, 10);
    EXPECT_EQ(u.by_backend["web-3"], 10);

    // From the client namespace, through node-b's forwarding.
    LoadClient from_client(c.client(),
                           {.target = "10.244.2.10:8080", .count = 5, .interval_ms = 0});
    EXPECT_EQ(from_client.wait().ok, 5);

    // The server logged every connection with the peer's (unNATed) address.
    auto events = read_server_events(web3.events_path);
    int accepts_from_web1 = 0, udp_from_web1 = 0, accepts_from_client = 0;
    for (const auto& e : events) {
      if (e.kind == "accept" && e.peer.rfind("10.244.1.10:", 0) == 0) ++accepts_from_web1;
      if (e.kind == "udp" && e.peer.rfind("10.244.1.10:", 0) == 0) ++udp_from_web1;
      if (e.kind == "accept" && e.peer.rfind("192.168.77.100:", 0) == 0) ++accepts_from_client;
      EXPECT_GT(e.time_ns, 0);
    }
    EXPECT_EQ(accepts_from_web1, 20);
    EXPECT_EQ(udp_from_web1, 10);
    EXPECT_EQ(accepts_from_client, 5);
  }
  for (const auto& n : names) EXPECT_FALSE(ns_exists(n)) << n;
}

TEST_F(ClusterTest, KeepAliveReusesConnections) {
  Cluster c(ClusterSpec::make(1, 2));
  Server s = start_server(c.pod("node-1-pod-2"), {.name = "p2"});
  LoadClient load(c.pod("node-1-pod-1"), {.target = "10.244.1.11:8080",
                                          .keepalive = true,
                                          .concurrency = 2,
                                          .count = 40,
                                          .interval_ms = 0,
                                          // A loaded machine must not turn a slow answer into
                                          // a timeout and a new connection.
                                          .timeout_ms = 10000});
  LoadResult r = load.wait();
  EXPECT_EQ(r.ok, 40);
  // 40 requests over at most one connection per worker (a worker that found no request left
  // may never have connected).
  int accepts = 0;
  for (const auto& e : read_server_events(s.events_path)) accepts += e.kind == "accept";
  EXPECT_GE(accepts, 1);
  EXPECT_LE(accepts, 2);
}

TEST_F(ClusterTest, LoadClientCountsFailuresWhenTheServerIsKilled) {
  Cluster c(ClusterSpec::demo());
  Server web1 = start_server(c.pod("web-1"), {.name = "web-1"});
  LoadClient load(
      c.client(),
      {.target = "10.244.1.10:8080", .duration_ms = 3000, .interval_ms = 5, .timeout_ms = 500});
  ASSERT_TRUE(eventually([&] { return load.results_so_far().ok >= 10; }));
  web1.process->signal(SIGKILL);
  ASSERT_TRUE(web1.process->wait_exit(std::chrono::seconds(5)).has_value());
  ASSERT_TRUE(eventually([&] { return load.results_so_far().failed >= 10; }));
  LoadResult r = load.stop();
  EXPECT_GE(r.ok, 10);
  EXPECT_GE(r.failed, 10);
  // A request in flight at the kill may fail otherwise (reset, eof); the rest are refused.
  EXPECT_GE(r.errors["connect:ECONNREFUSED"], 5) << ::testing::PrintToString(r.errors);
  // Every success precedes every failure: nothing answered after the kill.
  int64_t last_ok = 0, first_fail = INT64_MAX;
  for (const auto& rec : r.records) {
    if (rec.ok) last_ok = std::max(last_ok, rec.time_ns);
    if (!rec.ok) first_fail = std::min(first_fail, rec.time_ns);
  }
  EXPECT_LT(last_ok, first_fail);
}

TEST_F(ClusterTest, ServerDrainsKeepAliveConnectionsOnSigterm) {
  Cluster c(ClusterSpec::make(1, 2));
  Server s = start_server(c.pod("node-1-pod-2"), {.name = "p2", .grace_ms = 5000});
  LoadClient load(c.pod("node-1-pod-1"), {.target = "10.244.1.11:8080",
                                          .keepalive = true,
                                          .duration_ms = 3000,
                                          .interval_ms = 5,
                                          .timeout_ms = 500});
  ASSERT_TRUE(eventually([&] { return load.results_so_far().ok >= 5; }));
  s.process->signal(SIGTERM);
  // The open connection gets "Connection: close" on its next answer, so the server exits well
  // before its grace period, and that answer still succeeds.
  auto status = s.process->wait_exit(std::chrono::seconds(4));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0);
  auto events = read_server_events(s.events_path);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, "exit");
  LoadResult r = load.stop();
  EXPECT_GE(r.ok, 5);
}

}  // namespace
}  // namespace endpointd::netns
