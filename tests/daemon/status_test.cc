// `endpointd status`: the screen drawn from a captured /debug/state, the answers that are not
// endpointd's (exit 2), and the command against a running agent.
#include "daemon/status.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon/daemon.h"
#include "daemon/version.h"

namespace endpointd::daemon {
namespace {

namespace fs = std::filesystem;

// /debug/state as node-a's agent wrote it during a rolling update (shortened): the dataplane
// one generation behind, three feed subscribers, node-b excluded, web-2 draining and two
// earlier releases. The wall clock is 1'800'000'000'000 ms + a few seconds.
constexpr int64_t kNow = 1'800'000'010'000;
const char* kCaptured = R"({"agent":"endpointd","version":"0.1.0","stateSchema":1,
"source":"manifest directory /etc/endpointd/manifests","generation":12,"synced":true,
"node":"node-a","counts":{"services":4,"endpoints":6,"nodes":3},
"sinks":[{"name":"proxy","appliedGeneration":11,"appliedSecondsAgo":0.250},
         {"name":"dns","appliedGeneration":12,"appliedSecondsAgo":0.010},
         {"name":"feed","appliedGeneration":12,"appliedSecondsAgo":0.020}],
"feed":[{"client":"envoy-1","api":"ads","peer":"ipv4:127.0.0.1:40000","subscription":"*",
         "sentVersion":7,"ackedVersion":7,"ackedGeneration":12,"nacks":0,"lastNack":"",
         "connected":true,"holding":true,"lapsed":""},
        {"client":"haproxy-edge","api":"watch","peer":"ipv4:127.0.0.1:40001","subscription":"*",
         "sentVersion":7,"ackedVersion":5,"ackedGeneration":10,"nacks":1,
         "lastNack":"cluster demo/web: bad port","connected":true,"holding":true,"lapsed":""},
        {"client":"envoy-2","api":"delta-ads","peer":"","subscription":"*","sentVersion":6,
         "ackedVersion":6,"ackedGeneration":11,"nacks":0,"lastNack":"","connected":false,
         "holding":false,"lapsed":"disconnected"}],
"drains":[
 {"address":"10.244.1.10","pod":"demo/web-1","pod_uid":"u1","stage":"released",
  "release_after":"removed","start_unix_ms":1799999990000,
  "timeline_ms":{"stop_accepting":0,"removed":140,"released":141},
  "timeline_unix_ms":{"stop_accepting":1799999990000,"removed":1799999990140,"released":1799999990141},
  "revision":40,"peers":[],"live_flows":null,"outcome":"confirmed","unconfirmed":[],"notes":[],
  "late":{"before_removal":4,"after_removal":{"total":0,"others":0,"senders":[]},
   "after_release":{"total":13,"others":1,"senders":[{"source":"pod","name":"ingress/nginx-1",
   "node":"node-c","address":"10.244.2.7","count":12}]}}},
 {"address":"10.244.1.12","pod":"demo/web-4","pod_uid":"u4","stage":"released",
  "release_after":"removed","start_unix_ms":1800000000000,
  "timeline_ms":{"stop_accepting":0,"removed":5002,"released":5003},
  "timeline_unix_ms":{"stop_accepting":1800000000000,"removed":1800000005002,"released":1800000005003},
  "revision":44,"peers":[],"live_flows":null,"outcome":"unconfirmed",
  "unconfirmed":[{"node":"node-b","consumer":"agent","reason":"excluded: silent past the liveness deadline"}],
  "notes":[]},
 {"address":"10.244.1.11","pod":"demo/web-2","pod_uid":"u2","stage":"stop-accepting",
  "release_after":"drained","start_unix_ms":1800000008000,
  "timeline_ms":{"stop_accepting":0,"budget_end":30000},
  "timeline_unix_ms":{"stop_accepting":1800000008000,"budget_end":1800000038000},
  "revision":47,"peers":[],"live_flows":3,"outcome":null,"unconfirmed":[],"notes":[]}],
"drainCluster":{"node":"node-a","local_watermark":47,"cluster_watermark":44,
 "cluster_dns_watermark":44,"coverage_current":true,"holdouts":0,"member":true,"members":3,
 "root":"node-a","depth":1,"parent":null,"children":["node-b","node-c"],"excluded":["node-b"],
 "suspects":[],"streams":{"incoming":["node-c"],"outgoing":[],"unnamed":0},
 "counters":{},"members_from":"nodes","agents_at":"InternalIP","departed":[]},
"sourceErrors":[]})";

std::string draw(bool colour = false) {
  auto v = parse_status(kCaptured);
  EXPECT_TRUE(v) << v.error();
  if (!v) return {};
  RenderOptions o;
  o.colour = colour;
  o.now_unix_ms = kNow;
  o.admin = "127.0.0.1:10249";
  return render_status(*v, o);
}

// The line that starts with `heading` (after trimming nothing: headings start lines).
std::string line_of(const std::string& screen, std::string_view start) {
  std::istringstream in(screen);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(start, 0) == 0) return l;
  return {};
}

bool has_line(const std::string& screen, std::initializer_list<std::string_view> parts) {
  std::istringstream in(screen);
  for (std::string l; std::getline(in, l);) {
    bool all = true;
    for (auto p : parts) all = all && l.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

TEST(StatusRender, OneLinePerPartStateFirst) {
  std::string s = draw();
  EXPECT_NE(line_of(s, "endpointd 0.1.0 on node-a").find("127.0.0.1:10249"), std::string::npos)
      << s;
  EXPECT_NE(line_of(s, "Source:").find("Ok"), std::string::npos) << s;
  EXPECT_NE(line_of(s, "Sinks:").find("Behind"), std::string::npos) << s;
  EXPECT_NE(line_of(s, "Sinks:").find("2/3 at generation 12"), std::string::npos) << s;
  EXPECT_TRUE(has_line(s, {"proxy", "applied 11", "lag 1"})) << s;
  EXPECT_TRUE(has_line(s, {"dns", "applied 12", "lag 0"})) << s;
  // Feed: one of each word, and the NACK's reason.
  EXPECT_NE(line_of(s, "Feed:").find("1 SYNCED, 1 STALE, 1 NACKED"), std::string::npos) << s;
  EXPECT_TRUE(has_line(s, {"envoy-1", "ads", "SYNCED", "7", "7"})) << s;
  EXPECT_TRUE(has_line(s, {"haproxy-edge", "NACKED", "cluster demo/web: bad port"})) << s;
  EXPECT_TRUE(has_line(s, {"envoy-2", "STALE", "gone", "lapsed: disconnected"})) << s;
  // Peers: node-c's stream is up, node-b excluded.
  EXPECT_NE(line_of(s, "Peers:").find("Degraded"), std::string::npos) << s;
  EXPECT_NE(line_of(s, "Peers:").find("1/2 neighbours reachable"), std::string::npos) << s;
  EXPECT_TRUE(has_line(s, {"node-b", "child", "EXCLUDED"})) << s;
  EXPECT_TRUE(has_line(s, {"node-c", "child", "UP"})) << s;
  EXPECT_TRUE(has_line(s, {"watermark: local 47, cluster 44, DNS 44"})) << s;
}

TEST(StatusRender, DrainsInFlightWithTimeLeftAndWhoIsAwaited) {
  std::string s = draw();
  EXPECT_NE(line_of(s, "Drains:").find("1 in flight"), std::string::npos) << s;
  // Started 2 s before now, budget ends 28 s after it.
  EXPECT_TRUE(has_line(s, {"demo/web-2", "10.244.1.11", "stop-accepting for 2.0 s", "28.0 s left",
                           "3 live flow(s)", "release after drained"}))
      << s;
  EXPECT_TRUE(has_line(s, {"cluster watermark 44, needs 47", "node-b (excluded)"})) << s;
}

TEST(StatusRender, ReleasesNewestFirstWithOutcomeAndWhoMayStillRoute) {
  std::string s = draw();
  EXPECT_NE(line_of(s, "Releases:").find("last 2 of 2: 1 confirmed, 1 unconfirmed"),
            std::string::npos)
      << s;
  auto web4 = s.find("demo/web-4");
  auto web1 = s.find("demo/web-1");
  ASSERT_NE(web4, std::string::npos);
  ASSERT_NE(web1, std::string::npos);
  EXPECT_LT(web4, web1) << "newest first:\n" << s;
  EXPECT_TRUE(has_line(s, {"demo/web-4", "unconfirmed", "removed 5002 ms", "released 5003 ms"}))
      << s;
  EXPECT_TRUE(has_line(s, {"may still route: node-b/agent", "excluded"})) << s;
  EXPECT_TRUE(has_line(s, {"demo/web-1", "confirmed", "removed 140 ms"})) << s;
  // Who sent after web-1's release (observed on its node): where its errors came from.
  EXPECT_TRUE(has_line(s, {"then 13 new connection(s) after the release",
                           "from pod ingress/nginx-1 on node-c (10.244.2.7): 12, 1 from others"}))
      << s;
}

TEST(StatusRender, OnlyTheLastTenReleases) {
  std::string j = kCaptured;
  // Twelve more releases, revisions 100..111, the newest released last.
  std::string more;
  for (int i = 0; i < 12; ++i) {
    std::string n = std::to_string(i);
    int64_t at = 1'800'000'000'000 + i * 100;
    more += R"({"address":"10.244.9.)" + n + R"(","pod":"demo/batch-)" + n +
            R"(","stage":"released","release_after":"removed","start_unix_ms":)" +
            std::to_string(at) +
            R"(,"timeline_ms":{"released":1},"timeline_unix_ms":{"released":)" +
            std::to_string(at + 1) + R"(},"outcome":"confirmed","unconfirmed":[]},)";
  }
  j.replace(j.find("\"drains\":[") + 10, 0, more);
  auto v = parse_status(j);
  ASSERT_TRUE(v) << v.error();
  RenderOptions o;
  o.now_unix_ms = kNow;
  std::string s = render_status(*v, o);
  EXPECT_NE(line_of(s, "Releases:").find("last 10 of 14"), std::string::npos) << s;
  EXPECT_NE(s.find("demo/batch-11 "), std::string::npos) << s;
  EXPECT_EQ(s.find("demo/batch-0 "), std::string::npos) << s;
  EXPECT_EQ(s.find("demo/batch-1 "), std::string::npos) << s;
}

TEST(StatusRender, ColourOnlyWhenAsked) {
  EXPECT_EQ(draw(false).find('\033'), std::string::npos);
  std::string c = draw(true);
  EXPECT_NE(c.find("\033[32m"), std::string::npos);  // green Ok
  EXPECT_NE(c.find("\033[31m"), std::string::npos);  // red NACKED / EXCLUDED
}

TEST(StatusRender, AnAgentAloneAndWithoutConsumers) {
  auto v = parse_status(R"({"agent":"endpointd","version":"0.1.0","stateSchema":1,"source":"s",
    "generation":1,"synced":false,"node":"n","counts":{"services":0,"endpoints":0,"nodes":1},
    "sinks":[],"feed":null,"drains":[],"drainCluster":{"members":1,"member":true,"root":"n",
    "parent":null,"children":[],"excluded":[],"suspects":[],"streams":{"incoming":[],"outgoing":[]}},
    "sourceErrors":[{"where":"x.yaml","reason":"not YAML"}]})");
  ASSERT_TRUE(v) << v.error();
  std::string s = render_status(*v, {});
  EXPECT_NE(line_of(s, "Source:").find("Syncing"), std::string::npos) << s;
  EXPECT_NE(line_of(s, "Feed:").find("Off"), std::string::npos) << s;
  EXPECT_NE(line_of(s, "Peers:").find("1 member: no peers"), std::string::npos) << s;
  EXPECT_NE(line_of(s, "Releases:").find("None"), std::string::npos) << s;
  EXPECT_TRUE(has_line(s, {"x.yaml", "not YAML"})) << s;
}

TEST(StatusParse, WhatIsNotEndpointdIsRefusedWithAReason) {
  auto not_json = parse_status("<html>hello</html>");
  ASSERT_FALSE(not_json);
  EXPECT_NE(not_json.error().find("not an endpointd admin port"), std::string::npos);
  auto other = parse_status(R"({"status":"ok"})");
  ASSERT_FALSE(other);
  EXPECT_NE(other.error().find("not endpointd's"), std::string::npos);
  // An agent from before stateSchema: its /debug/state had generation and sinks only.
  auto old = parse_status(R"({"generation":3,"synced":true,"sinks":[],"drains":[]})");
  ASSERT_FALSE(old);
  EXPECT_NE(old.error().find("older than this client"), std::string::npos) << old.error();
  auto newer = parse_status(R"({"agent":"endpointd","version":"9.0.0","stateSchema":99})");
  ASSERT_FALSE(newer);
  EXPECT_NE(newer.error().find("state schema 99"), std::string::npos) << newer.error();
}

// ---- against servers ----

class Served : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  int serve(std::function<void(httplib::Server&)> routes) {
    server_ = std::make_unique<httplib::Server>();
    routes(*server_);
    int port = server_->bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return port;
  }
  int status(const std::string& admin, std::string* out_text, std::string* err_text,
             std::string output = "text") {
    StatusFlags f;
    f.admin = admin;
    f.output = std::move(output);
    f.timeout = 2;
    std::ostringstream out, err;
    int rc = run_status(f, out, err);
    *out_text = out.str();
    *err_text = err.str();
    return rc;
  }
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

TEST_F(Served, APortThatIsNotEndpointdExitsTwo) {
  int port = serve([](httplib::Server& s) {
    s.Get("/debug/state", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("<html>it works</html>", "text/html");
    });
  });
  std::string out, err;
  EXPECT_EQ(status("127.0.0.1:" + std::to_string(port), &out, &err), 2);
  EXPECT_TRUE(out.empty()) << out;
  EXPECT_NE(err.find("not an endpointd admin port"), std::string::npos) << err;
}

TEST_F(Served, NoDebugStateOrAnOldAgentExitsTwo) {
  int port = serve([](httplib::Server& s) {
    s.Get("/old/debug/state", [](const httplib::Request&, httplib::Response&) {});
  });
  std::string out, err;
  EXPECT_EQ(status("127.0.0.1:" + std::to_string(port), &out, &err), 2);
  EXPECT_NE(err.find("has no /debug/state"), std::string::npos) << err;
  TearDown();
  port = serve([](httplib::Server& s) {
    s.Get("/debug/state", [](const httplib::Request&, httplib::Response& r) {
      r.set_content(R"({"generation":3,"synced":true,"sinks":[]})", "application/json");
    });
  });
  EXPECT_EQ(status("127.0.0.1:" + std::to_string(port), &out, &err), 2);
  EXPECT_NE(err.find("older than this client"), std::string::npos) << err;
}

TEST_F(Served, NothingListeningExitsTwo) {
  // A port that was bound and closed: nothing listens there now.
  int port = serve([](httplib::Server&) {});
  TearDown();
  server_.reset();
  std::string out, err;
  EXPECT_EQ(status("127.0.0.1:" + std::to_string(port), &out, &err), 2);
  EXPECT_NE(err.find("nothing answered"), std::string::npos) << err;
}

TEST_F(Served, AgainstARunningAgent) {
  char tmpl[] = "/tmp/endpointd-status-XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  struct Cleanup {
    fs::path d;
    ~Cleanup() { fs::remove_all(d); }
  } cleanup{dir};
  std::ofstream(dir / "nodes.yaml") << "kind: Node\nmetadata: {name: node-a}\n";
  std::ofstream(dir / "web.yaml") << R"(kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
)";
  Config cfg;
  cfg.source_dir = dir;
  cfg.admin_listen = model::HostPort{"127.0.0.1", 0};
  cfg.health_listen = std::nullopt;
  cfg.node_name = "node-a";
  cfg.dataplane = Dataplane::kNone;
  cfg.feed_listen = model::HostPort{"127.0.0.1", 0};
  cfg.drain_socket = (dir / "drain.sock").string();
  cfg.drain_peer_listen = std::nullopt;
  Daemon d(cfg);
  auto st = d.start();
  ASSERT_TRUE(st) << st.error();
  std::string admin = "127.0.0.1:" + std::to_string(d.admin_port());
  std::string out, err;
  // Until the first sync the screen says Syncing; wait for Ok.
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(status(admin, &out, &err), 0) << err;
    if (line_of(out, "Source:").find("Ok") != std::string::npos &&
        line_of(out, "Sinks:").find("Ok") != std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(line_of(out, "endpointd " + std::string(kVersion) + " on node-a").empty(), false)
      << out;
  EXPECT_NE(line_of(out, "Source:").find("manifest directory"), std::string::npos) << out;
  EXPECT_TRUE(has_line(out, {"1 services", "1 nodes"})) << out;
  EXPECT_NE(line_of(out, "Sinks:").find("1/1"), std::string::npos) << out;
  EXPECT_NE(line_of(out, "Feed:").find("0 subscriber(s)"), std::string::npos) << out;
  EXPECT_NE(line_of(out, "Drains:").find("0 in flight"), std::string::npos) << out;
  EXPECT_EQ(out.find('\033'), std::string::npos) << "no colour off a TTY";
  // -o json: the state as read, which parses back.
  ASSERT_EQ(status(admin, &out, &err, "json"), 0) << err;
  auto v = parse_status(out);
  ASSERT_TRUE(v) << v.error();
  EXPECT_EQ(v->node, "node-a");
  ASSERT_TRUE(v->feed.has_value());
  d.stop();
}

}  // namespace
}  // namespace endpointd::daemon
