// `endpointd check` against the fake API server (RBAC by SelfSubjectAccessReview, clock skew
// by its Date header) and with an injected nftables probe and /proc/sys. The real nftables
// probe runs in a network namespace in tests/netns/check_test.sh.
#include "daemon/check.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/fakeapi/fake_api.h"

namespace endpointd::daemon {
namespace {

namespace fs = std::filesystem;

class CheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endpointd-check-XXXXXX";
    dir_ = mkdtemp(tmpl);
    ASSERT_TRUE(api_.ok()) << api_.error();
    kubeconfig_ = api_.write_kubeconfig();
    ASSERT_FALSE(kubeconfig_.empty());
    fs::create_directories(dir_ / "sys/net/netfilter");
    fs::create_directories(dir_ / "sys/net/ipv4");
    std::ofstream(dir_ / "sys/net/netfilter/nf_conntrack_max") << "262144\n";
    std::ofstream(dir_ / "sys/net/netfilter/nf_conntrack_count") << "12\n";
    std::ofstream(dir_ / "sys/net/ipv4/ip_forward") << "1\n";
    cfg_.kubeconfig = kubeconfig_;
    cfg_.node_name = "node-a";
    cfg_.dataplane = Dataplane::kNftables;
    cfg_.drain_socket = (dir_ / "drain.sock").string();
    env_.proc_sys = (dir_ / "sys").string();
    env_.nft_scratch = [this](const std::string& table) -> Status {
      probed_ = table;
      return nft_result_;
    };
  }
  void TearDown() override {
    fs::remove_all(dir_);
    if (!kubeconfig_.empty()) unlink(kubeconfig_.c_str());
  }
  const CheckLine* find(const std::vector<CheckLine>& lines, const std::string& name) {
    for (const auto& l : lines)
      if (l.name == name) return &l;
    return nullptr;
  }
  static size_t failed(const std::vector<CheckLine>& lines) {
    size_t n = 0;
    for (const auto& l : lines) n += l.state == CheckLine::State::kFail;
    return n;
  }

  fakeapi::FakeApiServer api_;
  fs::path dir_;
  std::string kubeconfig_;
  Config cfg_;
  CheckEnv env_;
  Status nft_result_;
  std::string probed_;
};

TEST_F(CheckTest, EverythingGrantedPasses) {
  auto lines = run_checks(cfg_, env_);
  EXPECT_EQ(failed(lines), 0u) << render_checks(lines, false);
  EXPECT_EQ(probed_.rfind("endpointd-check-", 0), 0u) << probed_;
  const CheckLine* api = find(lines, "api");
  ASSERT_NE(api, nullptr);
  EXPECT_NE(api->detail.find("v1.33.0-endpointd-fakeapi"), std::string::npos) << api->detail;
  // Every verb on every resource the agent watches was asked of the server.
  for (const char* r : {"services", "endpointslices", "nodes", "pods"})
    for (const char* v : {"list", "watch"}) {
      const CheckLine* l = find(lines, std::string("rbac ") + v + " " + r);
      ASSERT_NE(l, nullptr) << v << " " << r;
      EXPECT_EQ(l->state, CheckLine::State::kOk) << l->detail;
    }
  for (const char* v : {"create", "patch"}) {
    const CheckLine* l = find(lines, std::string("rbac ") + v + " events");
    ASSERT_NE(l, nullptr) << v;
    EXPECT_EQ(l->state, CheckLine::State::kOk) << l->detail;
  }
  size_t reviews = 0;
  for (const auto& r : api_.requests())
    reviews +=
        r.method == "POST" && r.path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
  EXPECT_EQ(reviews, 10u);
  const CheckLine* skew = find(lines, "clock skew");
  ASSERT_NE(skew, nullptr);
  EXPECT_EQ(skew->state, CheckLine::State::kOk) << skew->detail;
}

TEST_F(CheckTest, AVerbNotGrantedFailsNamingItAndWhatToGrant) {
  api_.deny_access("watch", "discovery.k8s.io", "endpointslices");
  auto lines = run_checks(cfg_, env_);
  EXPECT_EQ(failed(lines), 1u) << render_checks(lines, false);
  const CheckLine* l = find(lines, "rbac watch endpointslices");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->state, CheckLine::State::kFail);
  EXPECT_NE(l->detail.find("not granted"), std::string::npos) << l->detail;
  EXPECT_NE(l->fix.find("grant watch on discovery.k8s.io/endpointslices"), std::string::npos)
      << l->fix;
  EXPECT_EQ(find(lines, "rbac list endpointslices")->state, CheckLine::State::kOk);
  std::string text = render_checks(lines, false);
  EXPECT_NE(text.find("FAIL  rbac watch endpointslices"), std::string::npos) << text;
  EXPECT_NE(text.find("1 failed"), std::string::npos) << text;
}

TEST_F(CheckTest, EventsVerbsOnlyWithEvents) {
  api_.deny_access("patch", "events.k8s.io", "events");
  auto lines = run_checks(cfg_, env_);
  const CheckLine* l = find(lines, "rbac patch events");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->state, CheckLine::State::kFail);
  EXPECT_NE(l->fix.find("--events false"), std::string::npos) << l->fix;
  cfg_.events = false;
  lines = run_checks(cfg_, env_);
  EXPECT_EQ(find(lines, "rbac patch events"), nullptr);
  EXPECT_EQ(failed(lines), 0u) << render_checks(lines, false);
}

TEST_F(CheckTest, PodsAreAskedOnlyWhenWatched) {
  cfg_.watch_pods = false;
  api_.deny_access("list", "", "pods");
  auto lines = run_checks(cfg_, env_);
  EXPECT_EQ(find(lines, "rbac list pods"), nullptr);
  EXPECT_EQ(failed(lines), 0u) << render_checks(lines, false);
}

TEST_F(CheckTest, ClockSkewAgainstTheApisDate) {
  api_.set_clock_offset(std::chrono::seconds(60));
  auto lines = run_checks(cfg_, env_);
  const CheckLine* l = find(lines, "clock skew");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->state, CheckLine::State::kFail) << l->detail;
  EXPECT_NE(l->detail.find("behind the API server"), std::string::npos) << l->detail;
  EXPECT_NE(l->fix.find("synchronise"), std::string::npos) << l->fix;
}

TEST_F(CheckTest, AnUnreachableApiFails) {
  // A kubeconfig naming a port nothing listens on: one bound and closed again.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  std::string kc = (dir_ / "closed.kubeconfig").string();
  std::ofstream(kc) << "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: "
                       "\"http://127.0.0.1:"
                    << ntohs(a.sin_port)
                    << "\"}\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: "
                       "{cluster: c, user: u}\ncurrent-context: x\n";
  cfg_.kubeconfig = kc;
  auto lines = run_checks(cfg_, env_);
  unlink(kc.c_str());
  const CheckLine* l = find(lines, "api");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->state, CheckLine::State::kFail) << l->detail;
  EXPECT_EQ(find(lines, "rbac list services"), nullptr);
}

TEST_F(CheckTest, NftablesUnusable) {
  nft_result_ = Error{"cannot create table ip endpointd-check-1: Operation not permitted"};
  auto lines = run_checks(cfg_, env_);
  const CheckLine* l = find(lines, "nftables");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->state, CheckLine::State::kFail);
  EXPECT_NE(l->fix.find("CAP_NET_ADMIN"), std::string::npos) << l->fix;
  nft_result_ = Error{"netlink socket: Protocol not supported"};
  lines = run_checks(cfg_, env_);
  l = find(lines, "nftables");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->state, CheckLine::State::kFail);
  EXPECT_NE(l->fix.find("modprobe nf_tables"), std::string::npos) << l->fix;
  // --dataplane none asks nothing of nftables.
  cfg_.dataplane = Dataplane::kNone;
  probed_.clear();
  lines = run_checks(cfg_, env_);
  EXPECT_EQ(find(lines, "nftables")->state, CheckLine::State::kSkip);
  EXPECT_TRUE(probed_.empty());
}

// Without ctnetlink events the agent still drains (late senders go unnamed): a line that says
// so, not a failure.
TEST_F(CheckTest, ConntrackEventsUnavailableIsSaidNotFailed) {
  env_.conntrack_events = []() -> Status { return Error{"ctnetlink: operation not permitted"}; };
  auto lines = run_checks(cfg_, env_);
  const CheckLine* l = find(lines, "conntrack events");
  ASSERT_NE(l, nullptr) << render_checks(lines, false);
  EXPECT_EQ(l->state, CheckLine::State::kSkip);
  EXPECT_NE(l->detail.find("operation not permitted"), std::string::npos) << l->detail;
  EXPECT_NE(l->detail.find("late senders after a removal go unnamed"), std::string::npos)
      << l->detail;
  EXPECT_EQ(failed(lines), 0u) << render_checks(lines, false);
  env_.conntrack_events = []() -> Status { return {}; };
  lines = run_checks(cfg_, env_);
  l = find(lines, "conntrack events");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->state, CheckLine::State::kOk);
}

TEST_F(CheckTest, ConntrackSysctlsAndTheDrainSocketDirectory) {
  std::ofstream(dir_ / "sys/net/ipv4/ip_forward") << "0\n";
  fs::remove(dir_ / "sys/net/netfilter/nf_conntrack_max");
  cfg_.drain_socket = (dir_ / "missing/drain.sock").string();
  auto lines = run_checks(cfg_, env_);
  EXPECT_EQ(find(lines, "conntrack")->state, CheckLine::State::kFail);
  EXPECT_NE(find(lines, "conntrack")->fix.find("modprobe nf_conntrack"), std::string::npos);
  EXPECT_EQ(find(lines, "sysctl net.ipv4.ip_forward")->state, CheckLine::State::kFail);
  EXPECT_NE(find(lines, "sysctl net.ipv4.ip_forward")->fix.find("net.ipv4.ip_forward=1"),
            std::string::npos);
  const CheckLine* sock = find(lines, "drain socket");
  ASSERT_NE(sock, nullptr);
  EXPECT_EQ(sock->state, CheckLine::State::kFail);
  EXPECT_NE(sock->fix.find("mkdir -p " + (dir_ / "missing").string()), std::string::npos)
      << sock->fix;
  EXPECT_EQ(failed(lines), 3u) << render_checks(lines, false);
}

TEST_F(CheckTest, AManifestDirectorySkipsTheApi) {
  cfg_.kubeconfig.clear();
  cfg_.source_dir = dir_.string();
  auto lines = run_checks(cfg_, env_);
  EXPECT_EQ(find(lines, "api")->state, CheckLine::State::kSkip);
  EXPECT_EQ(failed(lines), 0u) << render_checks(lines, false);
  EXPECT_TRUE(api_.requests().empty());
}

}  // namespace
}  // namespace endpointd::daemon
