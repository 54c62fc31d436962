// endpointd-haproxy: its pure parts (mappings, the folded feed state, desired servers, the
// `show servers state` parser, the diff) and, end to end without root, a real HAProxy, the real
// `endpointd run` on a manifest directory, the adapter binary and three test servers on
// loopback addresses: servers appear, take traffic, drain, go away; a version is acknowledged
// only once HAProxy shows it; a static server with a colliding name is never touched.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "adapters/haproxy/adapter.h"
#include "adapters/haproxy/runtime.h"
#include "adapters/haproxy/sync.h"
#include "tests/netns/process.h"

namespace endpointd::haproxy {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Unit tests of the pure parts.

TEST(HaproxyMapping, ParsesTheFlag) {
  auto m = parse_mapping("demo/web:80=be_web");
  ASSERT_TRUE(m) << m.error();
  EXPECT_EQ(*m, (Mapping{"demo", "web", 80, "be_web"}));
  for (const char* bad :
       {"demo/web:80", "web:80=be", "demo/web=be", "demo/web:0=be", "demo/web:70000=be",
        "demo/web:http=be", "/web:80=be", "demo/:80=be", "demo/web:80=", "demo/web:80=be web"}) {
    auto r = parse_mapping(bad);
    EXPECT_FALSE(r) << bad;
    if (!r) {
      EXPECT_NE(r.error().find(bad), std::string::npos) << r.error();
    }
  }
}

TEST(HaproxyMapping, BackendAtMostOnce) {
  EXPECT_TRUE(check_mappings({{"a", "x", 80, "b1"}, {"a", "x", 81, "b2"}}));
  auto st = check_mappings({{"a", "x", 80, "b1"}, {"a", "y", 80, "b1"}});
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().find("b1"), std::string::npos);
  EXPECT_FALSE(check_mappings({}));
}

TEST(HaproxyMapping, SubscribesToEachServicePort) {
  auto s = subscription({{"demo", "web", 80, "be_web"}, {"demo", "api", 8443, "be_api"}}, "me");
  EXPECT_EQ(s.client_name(), "me");
  EXPECT_FALSE(s.all());
  ASSERT_EQ(s.selectors_size(), 2);
  EXPECT_EQ(s.selectors(1).namespace_(), "demo");
  EXPECT_EQ(s.selectors(1).name(), "api");
  EXPECT_EQ(s.selectors(1).port(), 8443u);
}

// An endpoint as the feed sends it: the verdict is the agent's (model/routing.h); the
// conditions, which the adapter never reads, are left unset.
struct Ep {
  std::string addr;
  uint32_t port = 8080;
  v1::Routing routing = v1::ROUTED;
};

v1::ServiceEndpoints svc(const std::string& name, std::vector<Ep> eps, uint32_t port = 80) {
  v1::ServiceEndpoints s;
  s.set_namespace_("demo");
  s.set_name(name);
  auto* p = s.add_ports();
  p->set_port(port);
  for (const auto& e : eps) {
    auto* x = p->add_endpoints();
    x->set_address(e.addr);
    x->set_port(e.port);
    x->set_routing(e.routing);
  }
  return s;
}

TEST(HaproxyFeedState, FullThenIncrementalThenRemoved) {
  FeedState st;
  v1::WatchResponse full;
  full.set_version(5);
  full.set_full(true);
  *full.add_services() = svc("web", {{"10.0.0.1"}});
  *full.add_services() = svc("api", {{"10.0.0.2"}});
  fold(st, full);
  EXPECT_TRUE(st.complete);
  EXPECT_EQ(st.version, 5u);
  EXPECT_EQ(st.services.size(), 2u);

  v1::WatchResponse inc;
  inc.set_version(7);
  *inc.add_services() = svc("web", {{"10.0.0.1"}, {"10.0.0.3"}});
  auto* r = inc.add_removed();
  r->set_namespace_("demo");
  r->set_name("api");
  fold(st, inc);
  EXPECT_EQ(st.version, 7u);
  ASSERT_EQ(st.services.size(), 1u);
  EXPECT_EQ(st.services.at({"demo", "web"}).ports(0).endpoints_size(), 2);

  // A new full answer replaces everything.
  v1::WatchResponse again;
  again.set_version(9);
  again.set_full(true);
  fold(st, again);
  EXPECT_TRUE(st.services.empty());
}

TEST(HaproxyDesired, StatesAreTheFeedsVerdicts) {
  FeedState st;
  st.complete = true;
  st.services[{"demo", "web"}] =
      svc("web", {{"10.0.0.1"},
                  {"10.0.0.2", 8080, v1::DRAINING},               // → drain
                  {"10.0.0.3", 8080, v1::NOT_ROUTED},             // → maint
                  {"10.0.0.4", 8080, v1::ROUTED_FALLBACK},        // → ready
                  {"fd00::7", 9090},                              // IPv6
                  {"not-an-ip", 8080},                            // skipped
                  {"10.0.0.5", 0},                                // skipped
                  {"10.0.0.6", 8080, v1::ROUTING_UNSPECIFIED}});  // skipped: an older agent
  st.services[{"demo", "other"}] = svc("other", {{"10.9.9.9"}});
  auto d = desired(st, {{"demo", "web", 80, "be_web"}, {"demo", "gone", 80, "be_gone"}});
  ASSERT_EQ(d.backends.size(), 2u);
  EXPECT_TRUE(d.backends.at("be_gone").empty());
  const auto& b = d.backends.at("be_web");
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ(b.at("10.0.0.1_8080"), (DesiredServer{"10.0.0.1", 8080, ServerState::kReady}));
  EXPECT_EQ(b.at("10.0.0.2_8080").state, ServerState::kDrain);
  EXPECT_EQ(b.at("10.0.0.3_8080").state, ServerState::kMaint);
  EXPECT_EQ(b.at("10.0.0.4_8080").state, ServerState::kReady);
  EXPECT_EQ(b.at("fd00--7_9090").addr, "fd00::7");
  EXPECT_EQ(d.skipped.size(), 3u);
}

TEST(HaproxyDesired, EveryVerdictHasOneServerState) {
  EXPECT_EQ(server_state(v1::ROUTED), ServerState::kReady);
  EXPECT_EQ(server_state(v1::ROUTED_FALLBACK), ServerState::kReady);
  EXPECT_EQ(server_state(v1::DRAINING), ServerState::kDrain);
  EXPECT_EQ(server_state(v1::NOT_ROUTED), ServerState::kMaint);
  EXPECT_EQ(server_state(v1::ROUTING_UNSPECIFIED), std::nullopt);
}

TEST(HaproxyDesired, OnlyTheMappedPortAndBestOfDuplicates) {
  FeedState st;
  auto s = svc("web", {{"10.0.0.1", 8080, v1::NOT_ROUTED}, {"10.0.0.1"}}, 80);
  auto* other = s.add_ports();
  other->set_port(443);
  auto* e8 = other->add_endpoints();
  e8->set_address("10.0.0.8");
  e8->set_port(8443);
  e8->set_routing(v1::ROUTED);
  auto* udp = s.add_ports();
  udp->set_port(80);
  udp->set_protocol(v1::UDP);
  auto* e9 = udp->add_endpoints();
  e9->set_address("10.0.0.9");
  e9->set_port(8080);
  e9->set_routing(v1::ROUTED);
  st.services[{"demo", "web"}] = s;
  auto d = desired(st, {{"demo", "web", 80, "be"}});
  ASSERT_EQ(d.backends.at("be").size(), 1u);
  EXPECT_EQ(d.backends.at("be").at("10.0.0.1_8080").state, ServerState::kReady);
  EXPECT_TRUE(d.skipped.empty());
}

TEST(HaproxyNames, DeterministicAndValid) {
  EXPECT_EQ(server_name("10.244.1.7", 8080), "10.244.1.7_8080");
  EXPECT_EQ(server_name("fd00::7", 80), "fd00--7_80");
}

// `show servers state be_web` as HAProxy 2.6.12 answers it: one static server in maintenance
// from the configuration, one added by the adapter and ready.
const char* kStateAnswer =
    "1\n"
    "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight "
    "srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health "
    "srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord "
    "srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n"
    "3 be_web 1 stat1 127.0.0.1 0 5 1 1 3 1 0 0 8 0 0 0 - 9 - 0 0 - - 0\n"
    "3 be_web 1000000 127.0.0.2_8080 127.0.0.2 2 0 1 1 1 1 0 0 0 0 0 1 - 8080 - 0 0 - - 0\n"
    "\n";

TEST(HaproxyServersState, ParsesFormatOne) {
  auto rows = parse_servers_state(kStateAnswer);
  ASSERT_TRUE(rows) << rows.error();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].name, "stat1");
  EXPECT_EQ((*rows)[0].port, 9u);
  EXPECT_EQ((*rows)[0].admin_state, 5u);
  EXPECT_FALSE((*rows)[0].forced_id);
  EXPECT_EQ((*rows)[1].name, "127.0.0.2_8080");
  EXPECT_EQ((*rows)[1].addr, "127.0.0.2");
  EXPECT_EQ((*rows)[1].id, 1000000u);
  EXPECT_TRUE((*rows)[1].forced_id);
  EXPECT_EQ((*rows)[1].admin_state, 0u);
}

TEST(HaproxyServersState, EmptyBackendAndErrors) {
  auto empty = parse_servers_state(
      "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state "
      "srv_admin_state srv_f_forced_id srv_port\n\n");
  ASSERT_TRUE(empty) << empty.error();
  EXPECT_TRUE(empty->empty());
  for (const char* bad :
       {"Can't find backend.\n", "", "2\n# srv_id\n", "1\n# srv_id srv_name\n",
        "1\n# srv_id srv_name srv_addr srv_admin_state srv_f_forced_id srv_port\n1 a b\n",
        "1\n# srv_id srv_name srv_addr srv_admin_state srv_f_forced_id srv_port\nx a b 0 0 1\n"}) {
    auto r = parse_servers_state(bad);
    EXPECT_FALSE(r) << bad;
  }
  auto r = parse_servers_state("Can't find backend.\n");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("Can't find backend."), std::string::npos) << r.error();
}

TEST(HaproxyServersState, AdminStateBits) {
  EXPECT_EQ(observed_state(0), ServerState::kReady);
  EXPECT_EQ(observed_state(kAdminForcedDrain), ServerState::kDrain);
  EXPECT_EQ(observed_state(kAdminForcedMaint), ServerState::kMaint);
  EXPECT_EQ(observed_state(kAdminForcedMaint | kAdminConfigMaint), ServerState::kMaint);
  EXPECT_EQ(observed_state(kAdminForcedMaint | kAdminForcedDrain), ServerState::kMaint);
  EXPECT_EQ(observed_state(kAdminInheritedMaint), ServerState::kMaint);
}

TEST(HaproxyCommands, Syntax) {
  EXPECT_EQ(command("be", {Action::Kind::kAdd, "10.0.0.1_80", "10.0.0.1", 80, 1000000, {}}),
            "add server be/10.0.0.1_80 10.0.0.1:80 id 1000000");
  EXPECT_EQ(command("be", {Action::Kind::kAdd, "fd00--1_80", "fd00::1", 80, 1000001, {}}),
            "add server be/fd00--1_80 [fd00::1]:80 id 1000001");
  EXPECT_EQ(command("be", {Action::Kind::kSetState, "s", {}, 0, 0, ServerState::kDrain}),
            "set server be/s state drain");
  EXPECT_EQ(command("be", {Action::Kind::kSetAddr, "s", "10.0.0.2", 81, 0, {}}),
            "set server be/s addr 10.0.0.2 port 81");
  EXPECT_EQ(command("be", {Action::Kind::kDelete, "s", {}, 0, 0, {}}), "del server be/s");
}

ServerRow row(const std::string& name, const std::string& addr, uint32_t port, uint32_t id,
              bool forced, uint32_t admin) {
  return ServerRow{name, addr, port, id, forced, admin};
}

constexpr uint32_t kBase = 1000000;

TEST(HaproxyAssess, AddsWithFreshIdsAndSetsState) {
  DesiredBackend want = {{"a_80", {"10.0.0.1", 80, ServerState::kReady}},
                         {"b_80", {"10.0.0.2", 80, ServerState::kMaint}}};
  auto a = assess(want, {row("x", "10.0.0.9", 80, kBase, true, 0)}, kBase);
  EXPECT_FALSE(a.converged);
  std::vector<Action> expect = {
      {Action::Kind::kAdd, "a_80", "10.0.0.1", 80, kBase + 1, {}},
      {Action::Kind::kSetState, "a_80", {}, 0, 0, ServerState::kReady},
      {Action::Kind::kAdd, "b_80", "10.0.0.2", 80, kBase + 2, {}},  // added in maint: stays
      {Action::Kind::kSetState, "x", {}, 0, 0, ServerState::kMaint},
      {Action::Kind::kDelete, "x", {}, 0, 0, {}},
  };
  EXPECT_EQ(a.actions, expect);
}

TEST(HaproxyAssess, ConvergedWhenStatesMatch) {
  DesiredBackend want = {{"a_80", {"10.0.0.1", 80, ServerState::kReady}},
                         {"b_80", {"10.0.0.2", 80, ServerState::kDrain}}};
  std::vector<ServerRow> have = {row("a_80", "10.0.0.1", 80, kBase, true, 0),
                                 row("b_80", "10.0.0.2", 80, kBase + 1, true, kAdminForcedDrain)};
  auto a = assess(want, have, kBase);
  EXPECT_TRUE(a.converged);
  EXPECT_TRUE(a.actions.empty());
  EXPECT_EQ(a.pending_deletions, 0u);

  have[1].admin_state = kAdminForcedMaint;  // drain wanted, maint shown
  a = assess(want, have, kBase);
  EXPECT_FALSE(a.converged);
  ASSERT_EQ(a.actions.size(), 1u);
  EXPECT_EQ(a.actions[0], (Action{Action::Kind::kSetState, "b_80", {}, 0, 0, ServerState::kDrain}));

  have[1].admin_state = kAdminForcedDrain;
  have[1].port = 81;  // moved by hand
  a = assess(want, have, kBase);
  EXPECT_FALSE(a.converged);
  ASSERT_EQ(a.actions.size(), 1u);
  EXPECT_EQ(a.actions[0].kind, Action::Kind::kSetAddr);
}

TEST(HaproxyAssess, RemovedServerInMaintIsPendingButConverged) {
  // Gone from the feed and already in maint: routes nothing, so the version counts as applied
  // while `del server` waits for its connections.
  auto a = assess({}, {row("a_80", "10.0.0.1", 80, kBase, true, kAdminForcedMaint)}, kBase);
  EXPECT_TRUE(a.converged);
  EXPECT_EQ(a.pending_deletions, 1u);
  ASSERT_EQ(a.actions.size(), 1u);
  EXPECT_EQ(a.actions[0].kind, Action::Kind::kDelete);
}

TEST(HaproxyAssess, NeverTouchesServersItDoesNotOwn) {
  DesiredBackend want = {{"a_80", {"10.0.0.1", 80, ServerState::kReady}},
                         {"b_80", {"10.0.0.2", 80, ServerState::kReady}}};
  // a_80 from haproxy.cfg (no forced id; another with a small forced id), in maint; b_80 ours.
  std::vector<ServerRow> have = {row("a_80", "127.0.0.1", 9, 1, false, 5),
                                 row("static", "10.0.0.3", 80, 7, true, 0),
                                 row("b_80", "10.0.0.2", 80, kBase, true, 0)};
  auto a = assess(want, have, kBase);
  EXPECT_EQ(a.collisions, std::vector<std::string>{"a_80"});
  EXPECT_TRUE(a.actions.empty());  // no change to a_80 nor to "static"
  EXPECT_TRUE(a.converged);
}

// A runtime API that answers from a script, and records the commands.
class FakeRuntime : public RuntimeApi {
 public:
  std::function<Result<std::string>(const std::string&)> answer;
  std::vector<std::string> calls;
  Result<std::string> call(const std::string& command) override {
    calls.push_back(command);
    return answer(command);
  }
  std::string describe() const override { return "HAProxy runtime API fake.sock"; }
};

std::string state_answer(const std::vector<ServerRow>& rows) {
  std::string s =
      "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state "
      "srv_f_forced_id srv_port\n";
  for (const auto& r : rows)
    s += "1 be " + std::to_string(r.id) + " " + r.name + " " + r.addr + " 2 " +
         std::to_string(r.admin_state) + " " + (r.forced_id ? "1" : "0") + " " +
         std::to_string(r.port) + "\n";
  return s;
}

TEST(HaproxySync, StopsAtTheFirstCallWithoutAnswer) {
  FakeRuntime rt;
  rt.answer = [](const std::string& cmd) -> Result<std::string> {
    return Error{"HAProxy runtime API fake.sock: `" + cmd + "`: no answer within 10 ms"};
  };
  Syncer s(rt, kBase);
  Desired d;
  d.backends["be"]["a_80"] = {"10.0.0.1", 80, ServerState::kReady};
  d.backends["be2"] = {};
  auto rep = s.sync(d);
  EXPECT_FALSE(rep.applied);
  EXPECT_EQ(rep.errors, 1u);
  EXPECT_EQ(rt.calls.size(), 1u);
  EXPECT_NE(rep.first_error.find("show servers state be"), std::string::npos) << rep.first_error;
}

TEST(HaproxySync, AppliesAndConfirmsByReadingBack) {
  FakeRuntime rt;
  std::vector<ServerRow> servers;
  rt.answer = [&](const std::string& cmd) -> Result<std::string> {
    if (cmd == "show servers state be") return state_answer(servers);
    if (cmd == "add server be/a_80 10.0.0.1:80 id 1000000") {
      servers.push_back(row("a_80", "10.0.0.1", 80, kBase, true, kAdminForcedMaint));
      return std::string("New server registered.\n\n");
    }
    if (cmd == "set server be/a_80 state ready") {
      servers[0].admin_state = 0;
      return std::string("\n");
    }
    return std::string("Unknown command.\n");
  };
  Syncer s(rt, kBase);
  Desired d;
  d.backends["be"]["a_80"] = {"10.0.0.1", 80, ServerState::kReady};
  auto rep = s.sync(d);
  EXPECT_TRUE(rep.applied) << rep.first_error;
  EXPECT_EQ(rep.commands, 2u);
  EXPECT_EQ(rep.errors, 0u);
  EXPECT_EQ(rt.calls.back(), "show servers state be");
}

TEST(HaproxySync, NotAppliedWhenHaproxyRefuses) {
  FakeRuntime rt;
  rt.answer = [&](const std::string& cmd) -> Result<std::string> {
    if (cmd == "show servers state be") return state_answer({});
    return std::string("Backend must use a dynamic load balancing to support dynamic servers.\n");
  };
  Syncer s(rt, kBase);
  Desired d;
  d.backends["be"]["a_80"] = {"10.0.0.1", 80, ServerState::kReady};
  auto rep = s.sync(d);
  EXPECT_FALSE(rep.applied);
  EXPECT_GE(rep.errors, 1u);
  EXPECT_NE(rep.first_error.find("dynamic load balancing"), std::string::npos) << rep.first_error;
}

TEST(HaproxySync, CollisionCountedOnceAndOthersApplied) {
  FakeRuntime rt;
  std::vector<ServerRow> servers = {row("a_80", "127.0.0.1", 9, 1, false, 5),
                                    row("b_80", "10.0.0.2", 80, kBase, true, 0)};
  rt.answer = [&](const std::string&) -> Result<std::string> { return state_answer(servers); };
  Syncer s(rt, kBase);
  Desired d;
  d.backends["be"]["a_80"] = {"10.0.0.1", 80, ServerState::kReady};
  d.backends["be"]["b_80"] = {"10.0.0.2", 80, ServerState::kReady};
  auto rep = s.sync(d);
  EXPECT_TRUE(rep.applied);
  EXPECT_EQ(rep.collisions, 1u);
  EXPECT_EQ(rep.new_collisions, 1u);
  rep = s.sync(d);
  EXPECT_EQ(rep.collisions, 1u);
  EXPECT_EQ(rep.new_collisions, 0u);
  for (const auto& c : rt.calls) EXPECT_EQ(c.rfind("show servers state", 0), 0u) << c;
}

// A unix socket that accepts connections and never answers, as a stopped HAProxy does.
class SilentSocket {
 public:
  explicit SilentSocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sun{};
    sun.sun_family = AF_UNIX;
    std::memcpy(sun.sun_path, path.data(), path.size());
    unlink(path.c_str());
    ok_ = bind(fd_, static_cast<sockaddr*>(static_cast<void*>(&sun)), sizeof sun) == 0 &&
          listen(fd_, 16) == 0;
  }
  ~SilentSocket() {
    close(fd_);
    unlink(path_.c_str());
  }
  bool ok() const { return ok_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool ok_ = false;
};

TEST(HaproxyRuntime, EveryCallIsBoundedByItsTimeout) {
  std::string path = "/tmp/endpointd-haproxy-silent-" + std::to_string(getpid()) + ".sock";
  SilentSocket silent(path);
  ASSERT_TRUE(silent.ok());
  SocketRuntime rt(path, 200ms);
  auto t0 = Clock::now();
  auto r = rt.call("show servers state be_web");
  auto took = Clock::now() - t0;
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find(path), std::string::npos) << r.error();
  EXPECT_NE(r.error().find("show servers state be_web"), std::string::npos) << r.error();
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 2s);

  SocketRuntime missing(path + ".none", 200ms);
  auto m = missing.call("show info");
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().find("connect"), std::string::npos) << m.error();
}

// ---------------------------------------------------------------------------------------------
// End to end: haproxy, `endpointd run`, endpointd-haproxy and test servers, all on loopback.

// A free TCP port on 127.0.0.1 (bound, read, released; the caller binds it right after).
uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), sizeof sin);
  socklen_t len = sizeof sin;
  getsockname(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), &len);
  close(fd);
  return ntohs(sin.sin_port);
}

// Polls `pred` until it holds or the timeout passes: these are other processes' states,
// nothing in this process to await.
bool eventually(const std::function<bool()>& pred, Clock::duration timeout = 10s) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

struct Endpoint {
  std::string addr;
  bool ready = true;
  bool serving = true;
  bool terminating = false;
};

// Resumes a process on scope exit, so that a test failing while HAProxy is stopped still
// leaves a process that the teardown can end.
class ResumeOnExit {
 public:
  explicit ResumeOnExit(netns::Process& p) : p_(p) {}
  ~ResumeOnExit() { p_.signal(SIGCONT); }
  ResumeOnExit(const ResumeOnExit&) = delete;
  ResumeOnExit& operator=(const ResumeOnExit&) = delete;

 private:
  netns::Process& p_;
};

// A TCP connection through HAProxy's frontend in tcp mode: each line sent is answered by the
// test server behind it with its name.
class LineClient {
 public:
  explicit LineClient(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, static_cast<sockaddr*>(static_cast<void*>(&sin)), sizeof sin) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~LineClient() {
    if (fd_ >= 0) close(fd_);
  }
  LineClient(const LineClient&) = delete;
  LineClient& operator=(const LineClient&) = delete;

  // The answer to one line, without its newline; nullopt when none came within 2 s.
  std::optional<std::string> ask() {
    if (fd_ < 0 || send(fd_, "hi\n", 3, MSG_NOSIGNAL) != 3) return std::nullopt;
    std::string line;
    auto deadline = Clock::now() + 2s;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char c;
      if (recv(fd_, &c, 1, 0) != 1) return std::nullopt;
      if (c == '\n') return line;
      line += c;
    }
    return std::nullopt;
  }

 private:
  int fd_ = -1;
};

class HaproxyAdapterE2E : public ::testing::Test {
 protected:
  // Endpoints live on 127.0.0.2..4 (all loopback), one port for all.
  const std::vector<std::string> kAddrs = {"127.0.0.2", "127.0.0.3", "127.0.0.4"};

  void SetUp() override {
    char tmpl[] = "/tmp/endpointd-haproxy-e2e-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "manifests");
    port_ = free_port();
    for (size_t i = 0; i < kAddrs.size(); ++i) {
      netns::SpawnOptions o;
      o.argv = {ENDPOINTD_TESTSERVER_PATH,
                "--name",
                "web-" + std::to_string(i + 1),
                "--tcp",
                std::to_string(port_),
                "--bind",
                kAddrs[i],
                "--ready-fd",
                "3"};
      o.log_path = (dir_ / ("web-" + std::to_string(i + 1) + ".log")).string();
      o.ready_pipe = true;
      servers_.push_back(std::make_unique<netns::Process>(o));
      ASSERT_TRUE(servers_.back()->wait_ready(5s)) << servers_.back()->log();
    }
  }

  void TearDown() override {
    if (HasFailure()) {
      for (const char* name : {"adapter.log", "haproxy.log", "endpointd.log"}) {
        std::ifstream in(dir_ / name);
        std::stringstream ss;
        ss << in.rdbuf();
        std::cerr << "==== " << name << "\n" << ss.str() << "\n";
      }
    }
    // Reverse order of start: the adapter first, HAProxy last but for the servers.
    adapter_.reset();
    daemon_.reset();
    if (haproxy_) haproxy_->signal(SIGCONT);
    haproxy_.reset();
    servers_.clear();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string socket_path() const { return (dir_ / "admin.sock").string(); }

  // HAProxy with one frontend and be_web, in `mode` (http or tcp); `static_server` is a
  // server line for be_web.
  void start_haproxy(const std::string& static_server = "", const std::string& mode = "http") {
    fe_port_ = free_port();
    std::ofstream(dir_ / "haproxy.cfg")
        << "global\n"
        << "  stats socket " << socket_path() << " mode 600 level admin expose-fd listeners\n"
        << "defaults\n"
        << "  mode " << mode << "\n"
        << "  timeout connect 2s\n"
        << "  timeout client 10s\n"
        << "  timeout server 10s\n"
        << "frontend fe\n"
        << "  bind 127.0.0.1:" << fe_port_ << "\n"
        << "  default_backend be_web\n"
        << "backend be_web\n"
        << "  balance roundrobin\n"
        << static_server;
    netns::SpawnOptions o;
    o.argv = {"haproxy", "-db", "-f", (dir_ / "haproxy.cfg").string()};
    o.log_path = (dir_ / "haproxy.log").string();
    haproxy_ = std::make_unique<netns::Process>(o);
    SocketRuntime rt(socket_path(), 500ms);
    ASSERT_TRUE(eventually([&] { return rt.call("show info").ok(); }, 10s))
        << "HAProxy did not answer on " << socket_path() << "\n"
        << haproxy_->log();
  }

  void write_manifest(const std::vector<Endpoint>& eps) {
    std::string s =
        "kind: Service\n"
        "metadata: {name: web, namespace: demo}\n"
        "spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: http}]}\n"
        "---\n"
        "kind: EndpointSlice\n"
        "metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}\n"
        "addressType: IPv4\n"
        "ports: [{name: http, port: " +
        std::to_string(port_) + "}]\nendpoints:\n";
    for (const auto& e : eps) {
      s += "- addresses: [" + e.addr + "]\n  conditions: {ready: " + (e.ready ? "true" : "false") +
           ", serving: " + (e.serving ? "true" : "false") +
           ", terminating: " + (e.terminating ? "true" : "false") + "}\n";
    }
    // Written aside and renamed, so the daemon never reads half a file.
    std::ofstream(dir_ / "web.yaml.tmp") << s;
    fs::rename(dir_ / "web.yaml.tmp", dir_ / "manifests" / "web.yaml");
  }

  // `endpointd run` on the manifest directory; a restart keeps the ports.
  void start_daemon() {
    std::ofstream(dir_ / "manifests" / "nodes.yaml") << "kind: Node\nmetadata: {name: node-a}\n";
    if (admin_port_ == 0) admin_port_ = free_port();
    if (feed_port_ == 0) feed_port_ = free_port();
    netns::SpawnOptions o;
    o.argv = {ENDPOINTD_BIN_PATH,    "run",
              "--source-dir",        (dir_ / "manifests").string(),
              "--dataplane",         "none",
              "--node-name",         "node-a",
              "--admin-listen",      "127.0.0.1:" + std::to_string(admin_port_),
              "--feed-listen",       "127.0.0.1:" + std::to_string(feed_port_),
              "--drain-socket",      (dir_ / "drain.sock").string(),
              "--drain-peer-listen", "",
              "--health-listen",     ""};
    o.log_path = (dir_ / "endpointd.log").string();
    daemon_ = std::make_unique<netns::Process>(o);
    ASSERT_TRUE(eventually([&] {
      httplib::Client c("127.0.0.1", admin_port_);
      auto r = c.Get("/readyz");
      return r && r->status == 200;
    })) << daemon_->log();
  }

  void start_adapter() {
    metrics_port_ = free_port();
    netns::SpawnOptions o;
    o.argv = {ENDPOINTD_HAPROXY_PATH,
              "--feed",
              "127.0.0.1:" + std::to_string(feed_port_),
              "--haproxy-socket",
              socket_path(),
              "--backend",
              "demo/web:80=be_web",
              "--metrics-listen",
              "127.0.0.1:" + std::to_string(metrics_port_),
              "--runtime-timeout-ms",
              "300",
              "--retry-max-ms",
              "300",
              "--resync-ms",
              "1000"};
    o.log_path = (dir_ / "adapter.log").string();
    adapter_ = std::make_unique<netns::Process>(o);
    ASSERT_TRUE(eventually([&] { return metric("endpointd_haproxy_feed_streams_total") >= 1; }))
        << adapter_->log();
  }

  // `show servers state be_web`, by name; empty when HAProxy does not answer.
  std::map<std::string, ServerRow> servers() {
    SocketRuntime rt(socket_path(), 1s);
    auto answer = rt.call("show servers state be_web");
    if (!answer) return {};
    auto rows = parse_servers_state(*answer);
    std::map<std::string, ServerRow> out;
    if (rows)
      for (auto& r : *rows) out[r.name] = r;
    return out;
  }
  std::string name_of(const std::string& addr) const { return server_name(addr, port_); }
  // The server's state, or nullopt when it is not there.
  std::optional<ServerState> state_of(const std::string& addr) {
    auto s = servers();
    auto it = s.find(name_of(addr));
    if (it == s.end()) return std::nullopt;
    return observed_state(it->second.admin_state);
  }

  struct FeedAcks {
    uint64_t generation = 0;  // the daemon's newest snapshot
    uint64_t applied = 0;     // what the feed's subscribers acknowledged
  };
  std::optional<FeedAcks> feed_acks() {
    httplib::Client c("127.0.0.1", admin_port_);
    auto r = c.Get("/debug/state");
    if (!r || r->status != 200) return std::nullopt;
    simdjson::dom::parser p;
    simdjson::dom::element root;
    if (p.parse(r->body).get(root)) return std::nullopt;
    FeedAcks a;
    a.generation = uint64_t(root["generation"]);
    for (auto sink : root["sinks"].get_array()) {
      if (std::string_view(sink["name"].get_string()) == "feed")
        a.applied = uint64_t(sink["appliedGeneration"]);
    }
    return a;
  }
  // True once every feed subscriber acknowledged the daemon's newest generation, and that
  // generation is at least `min_generation`.
  bool acked_newest(uint64_t min_generation = 0) {
    auto a = feed_acks();
    return a && a->generation >= min_generation && a->applied == a->generation;
  }

  // A metric of the adapter, -1 when it cannot be read.
  double metric(const std::string& name) {
    httplib::Client c("127.0.0.1", metrics_port_);
    auto r = c.Get("/metrics");
    if (!r || r->status != 200) return -1;
    std::istringstream in(r->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    }
    return -1;
  }

  // `n` requests through HAProxy's frontend, each on a new connection; the names of the test
  // servers that answered, with counts.
  std::map<std::string, int> spread(int n) {
    std::map<std::string, int> out;
    for (int i = 0; i < n; ++i) {
      httplib::Client c("127.0.0.1", fe_port_);
      c.set_keep_alive(false);
      c.set_connection_timeout(2);
      auto r = c.Get("/");
      if (!r) {
        out["<no answer>"]++;
      } else if (r->status != 200) {
        out["<status " + std::to_string(r->status) + ">"]++;
      } else {
        std::string body = r->body;
        while (!body.empty() && body.back() == '\n') body.pop_back();
        out[body]++;
      }
    }
    return out;
  }

  fs::path dir_;
  uint16_t port_ = 0, fe_port_ = 0, admin_port_ = 0, feed_port_ = 0, metrics_port_ = 0;
  std::vector<std::unique_ptr<netns::Process>> servers_;
  std::unique_ptr<netns::Process> haproxy_, daemon_, adapter_;
};

TEST_F(HaproxyAdapterE2E, ServersFollowTheFeedAndVersionsAreAckedOnceApplied) {
  start_haproxy();
  write_manifest({{kAddrs[0]}, {kAddrs[1]}, {kAddrs[2]}});
  start_daemon();
  start_adapter();

  // Every endpoint becomes a ready server; the version is acknowledged.
  ASSERT_TRUE(eventually([&] {
    for (const auto& a : kAddrs)
      if (state_of(a) != ServerState::kReady) return false;
    return acked_newest();
  }));
  auto acks = feed_acks();
  ASSERT_TRUE(acks);
  EXPECT_TRUE(eventually(
      [&] { return metric("endpointd_haproxy_acked_version") == double(acks->generation); }));
  auto rows = servers();
  EXPECT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows.at(name_of(kAddrs[0])).addr, kAddrs[0]);
  EXPECT_EQ(rows.at(name_of(kAddrs[0])).port, port_);

  // Traffic through HAProxy reaches all three.
  auto hits = spread(30);
  EXPECT_EQ(hits.size(), 3u) << ::testing::PrintToString(hits);
  for (const char* name : {"web-1", "web-2", "web-3"}) EXPECT_GT(hits[name], 0) << name;

  // web-1 terminating but serving: its server drains; no new request reaches it.
  const uint64_t before_drain = acks->generation;
  write_manifest({{kAddrs[0], false, true, true}, {kAddrs[1]}, {kAddrs[2]}});
  ASSERT_TRUE(eventually([&] {
    return state_of(kAddrs[0]) == ServerState::kDrain && acked_newest(before_drain + 1);
  }));
  EXPECT_EQ(state_of(kAddrs[1]), ServerState::kReady);
  hits = spread(30);
  EXPECT_EQ(hits.count("web-1"), 0u) << ::testing::PrintToString(hits);
  EXPECT_GT(hits["web-2"], 0);
  EXPECT_GT(hits["web-3"], 0);
  EXPECT_EQ(hits["web-2"] + hits["web-3"], 30) << ::testing::PrintToString(hits);

  // web-1 gone from the slice: its server is deleted.
  const uint64_t before_remove = feed_acks()->generation;
  write_manifest({{kAddrs[1]}, {kAddrs[2]}});
  ASSERT_TRUE(eventually([&] {
    return servers().size() == 2 && !state_of(kAddrs[0]) && acked_newest(before_remove + 1);
  }));
  EXPECT_EQ(spread(10).count("web-1"), 0u);
  EXPECT_EQ(metric("endpointd_haproxy_runtime_errors_total"), 0);
  EXPECT_EQ(metric("endpointd_haproxy_name_collisions"), 0);
}

TEST_F(HaproxyAdapterE2E, NoAckWhileHaproxyDoesNotAnswerThenAckOnceItDoes) {
  start_haproxy();
  write_manifest({{kAddrs[0]}, {kAddrs[1]}});
  start_daemon();
  start_adapter();
  ASSERT_TRUE(eventually([&] {
    return state_of(kAddrs[0]) == ServerState::kReady &&
           state_of(kAddrs[1]) == ServerState::kReady && acked_newest();
  }));
  const uint64_t g1 = feed_acks()->generation;
  const double errors_before = metric("endpointd_haproxy_runtime_errors_total");
  ASSERT_EQ(errors_before, 0);

  // HAProxy stopped: its socket accepts but nothing answers.
  haproxy_->signal(SIGSTOP);
  ResumeOnExit resume(*haproxy_);
  write_manifest({{kAddrs[0]}, {kAddrs[1]}, {kAddrs[2]}});
  ASSERT_TRUE(eventually([&] {
    auto a = feed_acks();
    return a && a->generation > g1;
  }));
  const uint64_t g2 = feed_acks()->generation;
  ASSERT_TRUE(eventually([&] { return metric("endpointd_haproxy_received_version") >= g2; }));
  ASSERT_TRUE(
      eventually([&] { return metric("endpointd_haproxy_runtime_errors_total") > errors_before; }));
  // Several retries (300 ms timeout, backoff up to 300 ms) later, still no ack.
  auto until = Clock::now() + 1500ms;
  while (Clock::now() < until) {
    auto a = feed_acks();
    ASSERT_TRUE(a);
    ASSERT_LT(a->applied, g2);
    ASSERT_LT(metric("endpointd_haproxy_acked_version"), g2);
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_GT(metric("endpointd_haproxy_syncs_failed_total"), 0);

  // HAProxy answers again: the new server appears and the version is acknowledged.
  haproxy_->signal(SIGCONT);
  ASSERT_TRUE(
      eventually([&] { return state_of(kAddrs[2]) == ServerState::kReady && acked_newest(g2); }));
  EXPECT_TRUE(eventually([&] { return metric("endpointd_haproxy_acked_version") == double(g2); }));
  auto hits = spread(30);
  EXPECT_GT(hits["web-3"], 0) << ::testing::PrintToString(hits);
}

TEST_F(HaproxyAdapterE2E, StaticServerWithTheSameNameIsReportedAndLeftAlone) {
  // haproxy.cfg declares a server named as web-1's would be, pointing elsewhere and disabled.
  const std::string taken = server_name(kAddrs[0], port_);
  start_haproxy("  server " + taken + " 127.0.0.1:9 disabled\n");
  write_manifest({{kAddrs[0]}, {kAddrs[1]}, {kAddrs[2]}});
  start_daemon();
  start_adapter();

  ASSERT_TRUE(eventually([&] {
    return state_of(kAddrs[1]) == ServerState::kReady &&
           state_of(kAddrs[2]) == ServerState::kReady && acked_newest();
  }));
  ASSERT_TRUE(eventually([&] { return metric("endpointd_haproxy_name_collisions") == 1; }));
  EXPECT_TRUE(eventually([&] { return metric("endpointd_haproxy_name_collisions_total") >= 1; }));
  // The static server as haproxy.cfg made it: same address, still in maintenance.
  auto rows = servers();
  ASSERT_TRUE(rows.count(taken));
  EXPECT_EQ(rows.at(taken).addr, "127.0.0.1");
  EXPECT_EQ(rows.at(taken).port, 9u);
  EXPECT_FALSE(rows.at(taken).forced_id);
  EXPECT_EQ(observed_state(rows.at(taken).admin_state), ServerState::kMaint);
  auto hits = spread(20);
  EXPECT_EQ(hits["web-2"] + hits["web-3"], 20) << ::testing::PrintToString(hits);

  // web-1 removed: the static server stays; the collision is over.
  const uint64_t g = feed_acks()->generation;
  write_manifest({{kAddrs[1]}, {kAddrs[2]}});
  ASSERT_TRUE(eventually([&] { return acked_newest(g + 1); }));
  ASSERT_TRUE(eventually([&] { return metric("endpointd_haproxy_name_collisions") == 0; }));
  rows = servers();
  ASSERT_TRUE(rows.count(taken));
  EXPECT_EQ(rows.at(taken).addr, "127.0.0.1");
  EXPECT_EQ(observed_state(rows.at(taken).admin_state), ServerState::kMaint);
  EXPECT_EQ(rows.size(), 3u);
}

TEST_F(HaproxyAdapterE2E, RestartedAdapterAdoptsItsServersAndRemovesStaleOnes) {
  start_haproxy();
  write_manifest({{kAddrs[0]}, {kAddrs[1]}});
  start_daemon();
  start_adapter();
  ASSERT_TRUE(eventually([&] {
    return state_of(kAddrs[0]) == ServerState::kReady &&
           state_of(kAddrs[1]) == ServerState::kReady && acked_newest();
  }));
  adapter_.reset();  // SIGTERM: HAProxy keeps the servers
  EXPECT_EQ(servers().size(), 2u);

  const uint64_t g = feed_acks()->generation;
  write_manifest({{kAddrs[1]}, {kAddrs[2]}});
  start_adapter();
  ASSERT_TRUE(eventually([&] {
    return !state_of(kAddrs[0]) && state_of(kAddrs[1]) == ServerState::kReady &&
           state_of(kAddrs[2]) == ServerState::kReady && acked_newest(g + 1);
  }));
  EXPECT_EQ(metric("endpointd_haproxy_name_collisions"), 0);
}

TEST_F(HaproxyAdapterE2E, DrainKeepsOpenConnectionsAndDeletionWaitsForThem) {
  start_haproxy("", "tcp");
  write_manifest({{kAddrs[0]}, {kAddrs[1]}, {kAddrs[2]}});
  start_daemon();
  start_adapter();
  ASSERT_TRUE(eventually([&] { return servers().size() == 3 && acked_newest(); }));

  // A connection that landed on web-1 (round robin: one of the first three).
  std::vector<std::unique_ptr<LineClient>> conns;
  LineClient* on_web1 = nullptr;
  for (int i = 0; i < 6 && !on_web1; ++i) {
    conns.push_back(std::make_unique<LineClient>(fe_port_));
    if (conns.back()->ask() == "web-1") on_web1 = conns.back().get();
  }
  ASSERT_NE(on_web1, nullptr);

  // Terminating: drain. The open connection carries on; new ones go elsewhere.
  uint64_t g = feed_acks()->generation;
  write_manifest({{kAddrs[0], false, true, true}, {kAddrs[1]}, {kAddrs[2]}});
  ASSERT_TRUE(eventually(
      [&] { return state_of(kAddrs[0]) == ServerState::kDrain && acked_newest(g + 1); }));
  EXPECT_EQ(on_web1->ask(), "web-1");
  for (int i = 0; i < 6; ++i) {
    auto who = LineClient(fe_port_).ask();
    EXPECT_TRUE(who == "web-2" || who == "web-3") << who.value_or("<no answer>");
  }

  // Gone: maint at once (acknowledged: it routes nothing new), deleted only once the
  // connection is closed.
  g = feed_acks()->generation;
  write_manifest({{kAddrs[1]}, {kAddrs[2]}});
  ASSERT_TRUE(eventually(
      [&] { return state_of(kAddrs[0]) == ServerState::kMaint && acked_newest(g + 1); }));
  ASSERT_TRUE(eventually([&] { return metric("endpointd_haproxy_pending_deletions") == 1; }));
  EXPECT_EQ(on_web1->ask(), "web-1");
  EXPECT_TRUE(state_of(kAddrs[0]).has_value());  // still there: HAProxy refused the deletion
  conns.clear();
  ASSERT_TRUE(eventually([&] { return !state_of(kAddrs[0]).has_value(); }));
  EXPECT_TRUE(eventually([&] { return metric("endpointd_haproxy_pending_deletions") == 0; }));
  EXPECT_EQ(metric("endpointd_haproxy_runtime_errors_total"), 0);
}

TEST_F(HaproxyAdapterE2E, RestartedHaproxyIsRefilled) {
  start_haproxy();
  write_manifest({{kAddrs[0]}, {kAddrs[1]}});
  start_daemon();
  start_adapter();
  ASSERT_TRUE(eventually([&] { return servers().size() == 2 && acked_newest(); }));

  // HAProxy restarted from haproxy.cfg: the dynamic servers are gone until the adapter's
  // periodic pass (1 s here) adds them again.
  const double commands = metric("endpointd_haproxy_commands_total");
  haproxy_.reset();
  start_haproxy();
  ASSERT_TRUE(eventually([&] {
    return state_of(kAddrs[0]) == ServerState::kReady && state_of(kAddrs[1]) == ServerState::kReady;
  }));
  // Two `add server` and two `set server … state ready` more: the adapter put them back.
  EXPECT_TRUE(
      eventually([&] { return metric("endpointd_haproxy_commands_total") >= commands + 4; }));
  auto hits = spread(10);
  EXPECT_EQ(hits["web-1"] + hits["web-2"], 10) << ::testing::PrintToString(hits);
}

TEST_F(HaproxyAdapterE2E, FeedRestartStartsOverFromTheFullState) {
  start_haproxy();
  write_manifest({{kAddrs[0]}, {kAddrs[1]}});
  start_daemon();
  start_adapter();
  ASSERT_TRUE(eventually([&] { return servers().size() == 2 && acked_newest(); }));
  const double streams = metric("endpointd_haproxy_feed_streams_total");

  // endpointd restarted (same ports), and web-1 went away meanwhile: the new stream's full
  // response replaces the state and its version (counting from 1 again) is acknowledged.
  daemon_.reset();
  write_manifest({{kAddrs[1]}, {kAddrs[2]}});
  start_daemon();
  ASSERT_TRUE(eventually(
      [&] {
        return !state_of(kAddrs[0]) && state_of(kAddrs[2]) == ServerState::kReady &&
               acked_newest(1);
      },
      20s));
  EXPECT_GT(metric("endpointd_haproxy_feed_streams_total"), streams);
  EXPECT_GE(metric("endpointd_haproxy_feed_stream_errors_total"), 1);
}

}  // namespace
}  // namespace endpointd::haproxy
