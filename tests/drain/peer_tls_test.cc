// The peer port under mutual TLS, with real coordinators on loopback addresses of their own
// (127.1.9.x, one port): the cluster watermark crosses it; a plaintext client, a client with a
// certificate of another CA, a client whose certificate names another node, a certificate
// for a node outside the Node list, and a message with no report in it are each refused; 1,000 idle
// connections to every agent's peer port do not stop an agent that joins afterwards from taking
// part, nor the watermark from advancing. And without certificates the peer server does not start
// unless asked for plaintext by name.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "drain/coordinator.h"
#include "endpointd/v1/drain.grpc.pb.h"
#include "model/snapshot.h"
#include "pipeline/ack_board.h"
#include "tests/support/test_certs.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using endpointd::testing::make_node_certs;
using endpointd::testing::slurp_file;
namespace pb = endpointd::v1;

std::string address_of(int i) {
  return "127.1.9." + std::to_string(i + 1);
}

// A port free on every test address (the agents all listen on one port, as in a cluster).
uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  inet_pton(AF_INET, "127.1.9.1", &a.sin_addr);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One node's agent: a board with one consumer and a coordinator serving peers.
struct Agent {
  pipeline::AckBoard board;
  std::unique_ptr<Coordinator> coordinator;
};

class PeerTls : public ::testing::Test {
 protected:
  void SetUp() override {
    // 1,000 idle connections on each of two agents, both ends in this process.
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, 16384);
    setrlimit(RLIMIT_NOFILE, &rl);
    std::string tmpl = (std::filesystem::temp_directory_path() / "endpointd-peer-tls-XXXXXX");
    ASSERT_TRUE(mkdtemp(tmpl.data()));
    dir_ = tmpl;
    ASSERT_EQ(make_node_certs(dir_, {"node-a", "node-b", "node-c", "node-x"}), "");
    other_ = dir_ + "/other";
    std::filesystem::create_directory(other_);
    ASSERT_EQ(make_node_certs(other_, {"node-b"}), "");  // a CA nobody trusts
    port_ = free_port();
    ASSERT_NE(port_, 0);
  }
  void TearDown() override {
    for (int fd : idle_) close(fd);
    for (auto& [n, a] : agents_) a->coordinator->stop();
    agents_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  CoordinatorOptions options(int i, const std::string& node) {
    CoordinatorOptions o;
    o.machine.node_name = node;
    o.peer_listen = address_of(i) + ":" + std::to_string(port_);
    o.peer_port = port_;
    o.peer_tls = {dir_ + "/ca.crt", dir_ + "/" + node + ".crt", dir_ + "/" + node + ".key"};
    o.aggregator.heartbeat = 100ms;
    o.aggregator.silence = 1500ms;
    o.aggregator.probe = 300ms;
    return o;
  }

  // Every agent sees the same Node list (node-a, node-b, node-c at 127.1.9.1..3) and applies
  // slice revision `rev` at generation `gen`.
  model::SnapshotPtr snapshot(uint64_t gen, uint64_t rev) {
    auto s = std::make_shared<model::Snapshot>();
    s->generation = gen;
    s->synced = true;
    s->slice_revision = rev;
    const char* names[] = {"node-a", "node-b", "node-c"};
    for (int i = 0; i < 3; ++i) {
      auto n = std::make_shared<model::Node>();
      n->name = names[i];
      n->addresses.push_back({"InternalIP", address_of(i)});
      s->nodes.push_back(n);
    }
    return s;
  }

  void start(int i, const std::string& node) {
    auto a = std::make_unique<Agent>();
    a->board.add("dataplane");
    a->coordinator = std::make_unique<Coordinator>(&a->board, nullptr, options(i, node));
    auto st = a->coordinator->start();
    ASSERT_TRUE(st.ok()) << st.error();
    agents_[node] = std::move(a);
  }

  void apply(uint64_t gen, uint64_t rev) {
    auto s = snapshot(gen, rev);
    for (auto& [n, a] : agents_) {
      a->coordinator->on_snapshot(s);
      a->board.applied("dataplane", s);
    }
  }

  // Whether every agent's cluster watermark reached `rev` within `d`.
  bool wait_cluster(uint64_t rev, std::chrono::milliseconds d) {
    return wait_all("\"cluster_watermark\":" + std::to_string(rev) + ",", d);
  }

  // Whether every agent's view contained `want` within `d`.
  bool wait_all(const std::string& want, std::chrono::milliseconds d) {
    auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      for (auto& [n, a] : agents_)
        if (a->coordinator->cluster_json().find(want) == std::string::npos) all = false;
      if (all) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  // The counter once it reached `want` (the view is published after the refusal is sent), or
  // its value after 5 s.
  uint64_t counter_reaching(const std::string& node, const std::string& name, uint64_t want) {
    auto until = std::chrono::steady_clock::now() + 5s;
    uint64_t v = counter(node, name);
    while (v != want && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(10ms);
      v = counter(node, name);
    }
    return v;
  }

  // The counter once it stopped moving for 300 ms (at most 5 s): the tree's own streams may
  // still be opening after the watermark went round.
  uint64_t settled_counter(const std::string& node, const std::string& name) {
    auto until = std::chrono::steady_clock::now() + 5s;
    uint64_t v = counter(node, name);
    while (std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(300ms);
      uint64_t now = counter(node, name);
      if (now == v) break;
      v = now;
    }
    return v;
  }

  uint64_t counter(const std::string& node, const std::string& name) {
    std::string j = agents_.at(node)->coordinator->cluster_json();
    auto at = j.find("\"" + name + "\":");
    if (at == std::string::npos) return ~0ull;
    return std::stoull(j.substr(at + name.size() + 3));
  }

  // Opens an Exchange stream to node-a with `creds` (dialled as node-a), sends an up report as
  // `from` and returns the stream's status.
  grpc::Status speak_as(const std::shared_ptr<grpc::ChannelCredentials>& creds,
                        const std::string& from) {
    pb::PeerMessage m;
    m.mutable_up()->set_from(from);
    m.mutable_up()->set_watermark(1);
    return send_as(creds, m);
  }

  grpc::Status send_as(const std::shared_ptr<grpc::ChannelCredentials>& creds,
                       const pb::PeerMessage& m) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("node-a");
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto ch = grpc::CreateCustomChannel(address_of(0) + ":" + std::to_string(port_), creds, args);
    auto stub = pb::Peer::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    auto stream = stub->Exchange(&ctx);
    stream->Write(m);
    pb::PeerMessage in;
    while (stream->Read(&in)) {
    }
    return stream->Finish();
  }

  std::shared_ptr<grpc::ChannelCredentials> tls_as(const std::string& dir,
                                                   const std::string& node) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = slurp_file(dir_ + "/ca.crt");
    o.pem_cert_chain = slurp_file(dir + "/" + node + ".crt");
    o.pem_private_key = slurp_file(dir + "/" + node + ".key");
    return grpc::SslCredentials(o);
  }

  std::string dir_, other_;
  uint16_t port_ = 0;
  std::map<std::string, std::unique_ptr<Agent>> agents_;
  std::vector<int> idle_;
};

TEST_F(PeerTls, WatermarkCrossesMutualTls) {
  start(0, "node-a");
  start(1, "node-b");
  start(2, "node-c");
  apply(1, 10);
  EXPECT_TRUE(wait_cluster(10, 10s)) << agents_["node-a"]->coordinator->cluster_json();
  apply(2, 11);
  EXPECT_TRUE(wait_cluster(11, 5s)) << agents_["node-a"]->coordinator->cluster_json();
  for (const char* n : {"node-a", "node-b", "node-c"}) {
    EXPECT_EQ(counter(n, "refused_identity"), 0u) << n;
    EXPECT_EQ(counter(n, "refused_not_member"), 0u) << n;
  }
}

TEST_F(PeerTls, RefusesPlaintextOtherCaWrongNameAndNonMember) {
  start(0, "node-a");
  start(1, "node-b");
  start(2, "node-c");
  apply(1, 10);
  ASSERT_TRUE(wait_cluster(10, 10s));
  const uint64_t accepted = settled_counter("node-a", "streams_accepted");

  // Plaintext: the TLS handshake fails; no stream reaches the agent.
  auto st = speak_as(grpc::InsecureChannelCredentials(), "node-b");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  // A certificate for node-b signed by another CA: refused in the handshake.
  st = speak_as(tls_as(other_, "node-b"), "node-b");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_EQ(counter("node-a", "streams_accepted"), accepted);

  // node-c's valid certificate speaking as node-b: refused, counted as an identity refusal.
  st = speak_as(tls_as(dir_, "node-c"), "node-b");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_NE(st.error_message().find("certificate names \"node-c\""), std::string::npos)
      << st.error_message();
  EXPECT_EQ(counter_reaching("node-a", "refused_identity", 1), 1u);
  // A valid certificate for a node that is not in the Node list: refused.
  st = speak_as(tls_as(dir_, "node-x"), "node-x");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_EQ(counter_reaching("node-a", "refused_not_member", 1), 1u);

  // A valid peer that sends a message with no report in it (garbage that parses): refused,
  // counted, named.
  st = send_as(tls_as(dir_, "node-b"), pb::PeerMessage());
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("neither an up nor a down report"), std::string::npos)
      << st.error_message();
  EXPECT_EQ(counter_reaching("node-a", "refused_malformed", 1), 1u);

  // None of it moved the watermark or the membership.
  apply(2, 11);
  EXPECT_TRUE(wait_cluster(11, 5s)) << agents_["node-a"]->coordinator->cluster_json();
}

TEST_F(PeerTls, ThousandIdleConnectionsDoNotStopAJoiningPeer) {
  start(0, "node-a");
  start(1, "node-b");
  apply(1, 10);
  // node-c is in the Node list but not running: excluded once silent past the deadline.
  ASSERT_TRUE(wait_cluster(10, 10s)) << agents_["node-a"]->coordinator->cluster_json();
  // 1,000 connections to each running agent's peer port that never start a TLS handshake.
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 1000; ++k) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      ASSERT_GE(fd, 0) << "socket: " << strerror(errno);
      idle_.push_back(fd);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port_);
      inet_pton(AF_INET, address_of(i).c_str(), &a.sin_addr);
      ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0)
          << "connection " << k << " to " << address_of(i) << ": " << strerror(errno);
    }
  }
  // node-c starts after them and must join the tree. It was excluded while silent; once it
  // speaks every agent readmits it (the exclusion travels down the tree, so node-c itself may
  // hear of it after it started), and the next revision then waits for it at all three.
  start(2, "node-c");
  apply(2, 11);
  EXPECT_TRUE(wait_all("\"excluded\":[]", 10s)) << agents_["node-c"]->coordinator->cluster_json();
  apply(3, 12);
  EXPECT_TRUE(wait_cluster(12, 10s)) << agents_["node-a"]->coordinator->cluster_json();
  // And the agents close them once the handshake deadline (5 s) passed without a ClientHello.
  std::vector<pollfd> fds;
  for (int fd : idle_) fds.push_back({fd, POLLIN, 0});
  size_t closed = 0;
  auto until = std::chrono::steady_clock::now() + 12s;
  while (closed < fds.size() && std::chrono::steady_clock::now() < until) {
    poll(fds.data(), fds.size(), 500);
    closed = 0;
    for (auto& p : fds) {
      if (p.fd < 0) {
        ++closed;
        continue;
      }
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char c;
      ssize_t n = recv(p.fd, &c, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        p.fd = -1;  // closed by the agent (EOF or reset)
        ++closed;
      }
    }
  }
  EXPECT_EQ(closed, fds.size()) << "idle connections still open after the handshake deadline";
}

TEST(PeerTlsConfig, NoCertificatesNoPeerServerUnlessInsecureByName) {
  pipeline::AckBoard board;
  CoordinatorOptions o;
  o.machine.node_name = "node-a";
  o.peer_listen = "127.1.9.1:0";
  {
    Coordinator c(&board, nullptr, o);
    auto st = c.start();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().find("mutual TLS"), std::string::npos) << st.error();
    EXPECT_NE(st.error().find("--drain-peer-insecure"), std::string::npos) << st.error();
    c.stop();
  }
  {
    o.peer_tls.ca = "/nonexistent/ca.crt";
    o.peer_tls.cert = "/nonexistent/node-a.crt";
    o.peer_tls.key = "/nonexistent/node-a.key";
    Coordinator c(&board, nullptr, o);
    auto st = c.start();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().find("--drain-peer-ca /nonexistent/ca.crt"), std::string::npos)
        << st.error();
    c.stop();
  }
  {
    o.peer_tls = {};
    o.peer_insecure = true;
    Coordinator c(&board, nullptr, o);
    auto st = c.start();
    EXPECT_TRUE(st.ok()) << st.error();
    EXPECT_NE(c.peer_port(), 0);
    c.stop();
  }
}

}  // namespace
}  // namespace endpointd::drain
