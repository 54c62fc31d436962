// Peer identity by projected ServiceAccount token (drain/peer_identity.h): the verifier against
// a test issuer's keys (tests/fakeapi/token_issuer.h) on an injected clock, each bad token
// refused with its reason named (expired, wrong audience, other issuer, other ServiceAccount,
// not pod-bound, unknown key, keys that cannot be fetched: the last good ones for a bounded
// time, then refusal); then real coordinators on loopback addresses speaking identity over
// TLS, where an attacker holding node-c's valid token cannot speak as node-b, nor reuse
// node-b's token on a stream of its own, nor speak without a token, and the watermark moves on.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjose/cjose.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <prometheus/registry.h>

#include "drain/coordinator.h"
#include "drain/peer_identity.h"
#include "drain/watermark.h"
#include "endpointd/v1/drain.grpc.pb.h"
#include "model/snapshot.h"
#include "pipeline/ack_board.h"
#include "tests/fakeapi/token_issuer.h"
#include "tests/support/test_certs.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using fakeapi::TokenIssuer;
using fakeapi::TokenSpec;
namespace pb = endpointd::v1;

const std::string kIssuer = "https://kubernetes.default.svc.cluster.local";

std::string reason_of(const std::variant<VerifiedPeer, Refusal>& r) {
  if (const auto* no = std::get_if<Refusal>(&r)) return no->reason;
  return "accepted:" + std::get<VerifiedPeer>(r).node;
}

class Verifier : public ::testing::Test {
 protected:
  Verifier() : issuer_(kIssuer) {}

  std::unique_ptr<TokenVerifier> make(PodNodeLookup pods = {}) {
    VerifierOptions o;
    o.sa_namespace = "kube-system";
    o.sa_name = "endpointd";
    return std::make_unique<TokenVerifier>(
        o,
        [this]() -> Result<IssuerKeys> {
          ++fetches_;
          if (fail_) return Error{"connection refused"};
          return IssuerKeys{issuer_.issuer(), issuer_.jwks()};
        },
        std::move(pods), [this] { return now_; });
  }
  // A token minted at the verifier's clock.
  std::string token(TokenSpec s) {
    s.now = std::chrono::duration_cast<std::chrono::seconds>(now_.time_since_epoch()).count();
    return issuer_.mint(s);
  }
  TokenSpec node(const std::string& n) {
    TokenSpec s;
    s.node = n;
    return s;
  }

  TokenIssuer issuer_;
  std::chrono::system_clock::time_point now_ = std::chrono::system_clock::from_time_t(1800000000);
  bool fail_ = false;
  int fetches_ = 0;
};

TEST_F(Verifier, AcceptsAPodBoundTokenOfTheAgentsServiceAccountAndNamesItsNode) {
  auto v = make();
  auto r = v->verify(token(node("node-b")));
  ASSERT_EQ(reason_of(r), "accepted:node-b");
  const auto& p = std::get<VerifiedPeer>(r);
  EXPECT_EQ(p.claims.pod_name, "endpointd-node-b");
  EXPECT_EQ(p.claims.sa_name, "endpointd");
  EXPECT_FALSE(p.credential.empty());
  EXPECT_EQ(fetches_, 1);
  // Keys are cached: a second token costs no fetch.
  EXPECT_EQ(reason_of(v->verify(token(node("node-c")))), "accepted:node-c");
  EXPECT_EQ(fetches_, 1);
}

TEST_F(Verifier, RsaKeysToo) {
  TokenIssuer rsa(kIssuer, true);
  VerifierOptions o;
  o.sa_namespace = "kube-system";
  o.sa_name = "endpointd";
  TokenVerifier v(o, [&]() -> Result<IssuerKeys> { return IssuerKeys{rsa.issuer(), rsa.jwks()}; });
  TokenSpec s;
  s.node = "node-a";
  EXPECT_EQ(reason_of(v.verify(rsa.mint(s))), "accepted:node-a");
}

TEST_F(Verifier, ExpiredRefusedBeyondTheSkewOnly) {
  auto v = make();
  TokenSpec s = node("node-b");
  s.lifetime = 600s;
  s.issued_ago = 620s;  // expired 20 s ago: within the 30 s skew
  EXPECT_EQ(reason_of(v->verify(token(s))), "accepted:node-b");
  s.issued_ago = 700s;
  EXPECT_EQ(reason_of(v->verify(token(s))), "expired");
  EXPECT_EQ(v->refusals("expired"), 1u);
  s.issued_ago = -120s;  // issued two minutes in the future
  EXPECT_EQ(reason_of(v->verify(token(s))), "not_yet_valid");
}

TEST_F(Verifier, WrongAudienceRefused) {
  auto v = make();
  TokenSpec s = node("node-b");
  s.audience = "https://kubernetes.default.svc";  // the pod's API token, not the peer one
  EXPECT_EQ(reason_of(v->verify(token(s))), "audience");
}

TEST_F(Verifier, OtherIssuerRefused) {
  auto v = make();
  TokenSpec s = node("node-b");
  s.issuer = "https://other-cluster.example";
  EXPECT_EQ(reason_of(v->verify(token(s))), "issuer");
  // Another issuer's key with the same key id: the signature does not verify.
  TokenIssuer other(kIssuer);
  s = node("node-b");
  EXPECT_EQ(reason_of(v->verify(other.mint(s))), "signature");
}

TEST_F(Verifier, OtherServiceAccountAndUnboundTokensRefused) {
  auto v = make();
  TokenSpec s = node("node-b");
  s.sa_name = "default";
  EXPECT_EQ(reason_of(v->verify(token(s))), "service_account");
  s = node("node-b");
  s.sa_namespace = "tenant";
  EXPECT_EQ(reason_of(v->verify(token(s))), "service_account");
  s = node("node-b");
  s.pod_bound = false;
  EXPECT_EQ(reason_of(v->verify(token(s))), "not_pod_bound");
}

TEST_F(Verifier, BeforeKubernetes130TheBoundPodSaysTheNode) {
  TokenSpec s = node("node-b");
  s.node_claim = false;
  EXPECT_EQ(reason_of(make()->verify(token(s))), "no_node");
  std::string asked;
  auto v = make([&](const std::string& ns, const std::string& name,
                    const std::string& uid) -> Result<std::string> {
    asked = ns + "/" + name + "/" + uid;
    if (name == "endpointd-node-b") return std::string("node-b");
    return Error{"not found"};
  });
  EXPECT_EQ(reason_of(v->verify(token(s))), "accepted:node-b");
  EXPECT_EQ(asked, "kube-system/endpointd-node-b/uid-endpointd-node-b");
  s.pod = "endpointd-gone";
  EXPECT_EQ(reason_of(v->verify(token(s))), "no_node");
}

TEST_F(Verifier, UnknownKidRefetchesAtABoundedRate) {
  auto v = make();
  ASSERT_EQ(reason_of(v->verify(token(node("node-b")))), "accepted:node-b");
  ASSERT_EQ(fetches_, 1);
  // The issuer rotated its key: the first token of the new key fetches the keys again.
  now_ += 11s;
  issuer_.rotate(false);
  EXPECT_EQ(reason_of(v->verify(token(node("node-b")))), "accepted:node-b");
  EXPECT_EQ(fetches_, 2);
  // A key id nobody published: refused; asking again within 10 s fetches nothing.
  TokenSpec s = node("node-b");
  s.kid = "forged";
  now_ += 11s;
  EXPECT_EQ(reason_of(v->verify(token(s))), "unknown_kid");
  EXPECT_EQ(fetches_, 3);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(reason_of(v->verify(token(s))), "unknown_kid");
  EXPECT_EQ(fetches_, 3);
  EXPECT_EQ(v->refusals("unknown_kid"), 101u);
}

TEST_F(Verifier, FetchFailureKeepsTheLastGoodKeysForABoundedTimeThenRefuses) {
  auto v = make();
  ASSERT_EQ(reason_of(v->verify(token(node("node-b")))), "accepted:node-b");
  fail_ = true;
  // Due for a refresh after 300 s: the fetch fails, the last good keys stay.
  now_ += 301s;
  EXPECT_EQ(reason_of(v->verify(token(node("node-b")))), "accepted:node-b");
  EXPECT_EQ(fetches_, 2);
  now_ += 290s;  // 591 s after the last good fetch
  EXPECT_EQ(reason_of(v->verify(token(node("node-b")))), "accepted:node-b");
  now_ += 10s;  // 601 s: past keep_last_good
  EXPECT_EQ(reason_of(v->verify(token(node("node-b")))), "jwks_unavailable");
  // The API server is back: the next fetch (10 s after the last attempt) restores them.
  fail_ = false;
  now_ += 10s;
  EXPECT_EQ(reason_of(v->verify(token(node("node-b")))), "accepted:node-b");
  // No keys at all (the first fetch fails): refused, named.
  fail_ = true;
  auto cold = make();
  EXPECT_EQ(reason_of(cold->verify(token(node("node-b")))), "jwks_unavailable");
}

TEST_F(Verifier, SymmetricAndUnsignedTokensRefused) {
  auto v = make();
  // HS256 with a secret under the issuer's key id: not an algorithm a service-account issuer
  // uses; never verified with a public key taken as a secret.
  cjose_err err{};
  cjose_jwk_t* oct = cjose_jwk_create_oct_random(32, &err);
  cjose_header_t* hdr = cjose_header_new(&err);
  cjose_header_set(hdr, CJOSE_HDR_ALG, CJOSE_HDR_ALG_HS256, &err);
  cjose_header_set(hdr, CJOSE_HDR_KID, issuer_.current_kid().c_str(), &err);
  std::string payload = "{\"iss\":\"" + kIssuer + "\"}";
  cjose_jws_t* jws = cjose_jws_sign(oct, hdr, reinterpret_cast<const uint8_t*>(payload.data()),
                                    payload.size(), &err);
  ASSERT_NE(jws, nullptr);
  const char* ser = nullptr;
  cjose_jws_export(jws, &ser, &err);
  std::string hs = ser;
  cjose_jws_release(jws);
  cjose_header_release(hdr);
  cjose_jwk_release(oct);
  EXPECT_EQ(reason_of(v->verify(hs)), "algorithm");
  // alg none: header {"alg":"none"}, no signature.
  std::string none = "eyJhbGciOiJub25lIn0." + hs.substr(hs.find('.') + 1);
  none = none.substr(0, none.rfind('.') + 1);
  auto r = reason_of(v->verify(none));
  EXPECT_TRUE(r == "algorithm" || r == "malformed") << r;
  EXPECT_EQ(reason_of(v->verify("")), "no_token");
  EXPECT_EQ(reason_of(v->verify("not.a.token")), "malformed");
}

TEST(TokenFileTest, RereadWhenTheKubeletRotatesIt) {
  std::string dir = std::filesystem::temp_directory_path() / "endpointd-token-file-XXXXXX";
  ASSERT_TRUE(mkdtemp(dir.data()));
  std::string path = dir + "/token";
  { std::ofstream(path) << "first\n"; }
  TokenFile f(path);
  ASSERT_TRUE(f.token().ok());
  EXPECT_EQ(*f.token(), "first");
  // The kubelet writes a new file and swaps the link: the path names another inode.
  { std::ofstream(dir + "/token.new") << "second"; }
  std::filesystem::rename(dir + "/token.new", path);
  EXPECT_EQ(*f.token(), "second");
  std::filesystem::remove_all(dir);
  // Gone for a moment: the last one read.
  EXPECT_EQ(*f.token(), "second");
  TokenFile missing(dir + "/none");
  EXPECT_FALSE(missing.token().ok());
}

// --- real coordinators ------------------------------------------------------------------

std::string address_of(int i) {
  return "127.1.10." + std::to_string(i + 1);
}

uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.1.10.1", &a.sin_addr);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct Agent {
  pipeline::AckBoard board;
  prometheus::Registry registry;
  std::shared_ptr<TokenVerifier> verifier;
  std::unique_ptr<Coordinator> coordinator;
};

class PeerIdentity : public ::testing::Test {
 protected:
  PeerIdentity() : issuer_(kIssuer) {}
  void SetUp() override {
    std::string tmpl = std::filesystem::temp_directory_path() / "endpointd-peer-identity-XXXXXX";
    ASSERT_TRUE(mkdtemp(tmpl.data()));
    dir_ = tmpl;
    // One server certificate for every agent: it names no node (the token does).
    ASSERT_EQ(endpointd::testing::make_test_certs(dir_), "");
    port_ = free_port();
    ASSERT_NE(port_, 0);
  }
  void TearDown() override {
    for (auto& [n, a] : agents_) a->coordinator->stop();
    agents_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string token_file(const std::string& node) {
    std::string path = dir_ + "/" + node + ".token";
    TokenSpec s;
    s.node = node;
    tokens_[node] = issuer_.mint(s);
    std::ofstream(path) << tokens_[node];
    return path;
  }

  // insecure: the agent runs with --drain-peer-insecure (plaintext, no identity).
  void start(int i, const std::string& node, bool insecure = false) {
    auto a = std::make_unique<Agent>();
    a->board.add("dataplane");
    VerifierOptions vo;
    vo.sa_namespace = "kube-system";
    vo.sa_name = "endpointd";
    a->verifier = std::make_shared<TokenVerifier>(
        vo,
        [this]() -> Result<IssuerKeys> {
          return IssuerKeys{issuer_.issuer(), issuer_.jwks()};
        },
        PodNodeLookup{}, TokenVerifier::Now{}, &a->registry);
    CoordinatorOptions o;
    o.machine.node_name = node;
    o.peer_listen = address_of(i) + ":" + std::to_string(port_);
    o.peer_port = port_;
    if (insecure) {
      o.peer_insecure = true;
    } else {
      o.peer_tls.ca = dir_ + "/ca.crt";
      o.peer_tls.cert = dir_ + "/server.crt";
      o.peer_tls.key = dir_ + "/server.key";
      o.peer_tls.token = std::make_shared<TokenFile>(token_file(node));
      o.peer_tls.verifier = a->verifier;
    }
    o.aggregator.heartbeat = 100ms;
    o.aggregator.silence = 1500ms;
    o.aggregator.probe = 300ms;
    o.registry = &a->registry;
    a->coordinator = std::make_unique<Coordinator>(&a->board, nullptr, o);
    auto st = a->coordinator->start();
    ASSERT_TRUE(st.ok()) << st.error();
    agents_[node] = std::move(a);
  }

  // `except`: an agent whose consumers do not apply this one (it stays where it was).
  void apply(uint64_t gen, uint64_t rev, const std::string& except = "") {
    auto s = std::make_shared<model::Snapshot>();
    s->generation = gen;
    s->synced = true;
    s->slice_revision = rev;
    const char* names[] = {"node-a", "node-b", "node-c", "node-d"};
    for (int i = 0; i < 4; ++i) {
      if (i == 3 && !agents_.count(names[i])) continue;  // node-d only where a test starts it
      auto n = std::make_shared<model::Node>();
      n->name = names[i];
      n->addresses.push_back({"InternalIP", address_of(i)});
      s->nodes.push_back(n);
    }
    for (auto& [n, a] : agents_) {
      a->coordinator->on_snapshot(s);
      if (n != except) a->board.applied("dataplane", s);
    }
  }

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
  bool wait_cluster(uint64_t rev, std::chrono::milliseconds d) {
    return wait_all("\"cluster_watermark\":" + std::to_string(rev) + ",", d);
  }
  // endpointd_drain_peer_refused_total{reason} of an agent's registry (the verifier's refusals
  // and the streams' share the family).
  double refused_metric(const std::string& node, const std::string& reason) {
    for (const auto& f : agents_.at(node)->registry.Collect()) {
      if (f.name != "endpointd_drain_peer_refused_total") continue;
      for (const auto& m : f.metric)
        for (const auto& l : m.label)
          if (l.name == "reason" && l.value == reason) return m.counter.value;
    }
    return 0;
  }
  uint64_t counter(const std::string& node, const std::string& name) {
    std::string j = agents_.at(node)->coordinator->cluster_json();
    auto at = j.find("\"" + name + "\":");
    if (at == std::string::npos) return ~0ull;
    return std::stoull(j.substr(at + name.size() + 3));
  }
  uint64_t counter_reaching(const std::string& node, const std::string& name, uint64_t want) {
    auto until = std::chrono::steady_clock::now() + 5s;
    uint64_t v = counter(node, name);
    while (v < want && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(10ms);
      v = counter(node, name);
    }
    return v;
  }

  // TLS to the shared server certificate (checked against the CA, no host name), as an agent.
  std::shared_ptr<grpc::ChannelCredentials> tls() {
    grpc::experimental::TlsChannelCredentialsOptions o;
    o.set_certificate_provider(std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
        endpointd::testing::slurp_file(dir_ + "/ca.crt")));
    o.watch_root_certs();
    o.set_verify_server_certs(true);
    o.set_check_call_host(false);
    o.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
    return grpc::experimental::TlsCredentials(o);
  }

  // Opens an Exchange stream to node-a presenting `token` (none when empty) and sends an up
  // report as `from`; returns the stream's status when node-a ends it (or after 3 s: the
  // stream was taken, and the status is the deadline's).
  grpc::Status speak_as(const std::shared_ptr<grpc::ChannelCredentials>& creds,
                        const std::string& token, const std::string& from) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto ch = grpc::CreateCustomChannel(address_of(0) + ":" + std::to_string(port_), creds, args);
    auto stub = pb::Peer::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 3s);
    if (!token.empty()) ctx.AddMetadata(kPeerTokenMetadata, token);
    auto stream = stub->Exchange(&ctx);
    pb::PeerMessage m;
    m.mutable_up()->set_from(from);
    m.mutable_up()->set_watermark(1);
    m.mutable_up()->set_epoch(~0ull);  // what a forger would send
    stream->Write(m);
    pb::PeerMessage in;
    while (stream->Read(&in)) {
    }
    return stream->Finish();
  }

  // Opens an Exchange stream to node-a presenting `token`, writes `messages` and holds the
  // stream open for `hold` (node-a takes what it is sent meanwhile); the stream's status.
  // `creds` null: TLS as an agent. `every`: the messages again at that interval while held.
  grpc::Status send_as(const std::string& token, const std::vector<pb::PeerMessage>& messages,
                       std::chrono::milliseconds hold,
                       std::shared_ptr<grpc::ChannelCredentials> creds = nullptr,
                       std::chrono::milliseconds every = std::chrono::milliseconds::zero()) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto ch = grpc::CreateCustomChannel(address_of(0) + ":" + std::to_string(port_),
                                        creds ? creds : tls(), args);
    auto stub = pb::Peer::NewStub(ch);
    grpc::ClientContext ctx;
    const auto until = std::chrono::system_clock::now() + hold;
    ctx.set_deadline(until);
    if (!token.empty()) ctx.AddMetadata(kPeerTokenMetadata, token);
    auto stream = stub->Exchange(&ctx);
    for (const auto& m : messages) stream->Write(m);
    if (every.count() > 0) {
      while (std::chrono::system_clock::now() + every < until) {
        std::this_thread::sleep_for(every);
        for (const auto& m : messages) stream->Write(m);
      }
    }
    pb::PeerMessage in;
    while (stream->Read(&in)) {
    }
    return stream->Finish();
  }
  // endpointd_drain_peer_watermark_anomalies_total{kind} of an agent.
  double anomalies(const std::string& node, const std::string& kind) {
    for (const auto& f : agents_.at(node)->registry.Collect()) {
      if (f.name != "endpointd_drain_peer_watermark_anomalies_total") continue;
      for (const auto& m : f.metric)
        for (const auto& l : m.label)
          if (l.name == "kind" && l.value == kind) return m.counter.value;
    }
    return 0;
  }

  TokenIssuer issuer_;
  std::string dir_;
  uint16_t port_ = 0;
  std::map<std::string, std::string> tokens_;
  std::map<std::string, std::unique_ptr<Agent>> agents_;
};

TEST_F(PeerIdentity, WatermarkCrossesWithTokens) {
  start(0, "node-a");
  start(1, "node-b");
  start(2, "node-c");
  apply(1, 10);
  EXPECT_TRUE(wait_cluster(10, 10s)) << agents_["node-a"]->coordinator->cluster_json();
  apply(2, 11);
  EXPECT_TRUE(wait_cluster(11, 5s)) << agents_["node-a"]->coordinator->cluster_json();
  for (const char* n : {"node-a", "node-b", "node-c"}) {
    EXPECT_EQ(counter(n, "refused_identity"), 0u) << n;
    EXPECT_EQ(agents_[n]->verifier->refusals("signature"), 0u) << n;
  }
}

// The Done-when case: an attacker holding node-c's valid credentials (its token; there is no
// key to steal) tries to speak as node-b to node-a: refused and counted, and the watermark —
// what node-a's drains wait for — goes on.
TEST_F(PeerIdentity, NodeCsCredentialsCannotSpeakAsNodeB) {
  start(0, "node-a");
  start(1, "node-b");
  start(2, "node-c");
  apply(1, 10);
  ASSERT_TRUE(wait_cluster(10, 10s)) << agents_["node-a"]->coordinator->cluster_json();

  // node-c's token, speaking as node-b: the token names node-c.
  auto st = speak_as(tls(), tokens_["node-c"], "node-b");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_NE(st.error_message().find("token names \"node-c\""), std::string::npos)
      << st.error_message();
  EXPECT_GE(counter_reaching("node-a", "refused_identity", 1), 1u);
  EXPECT_EQ(refused_metric("node-a", "other_node"), 1);

  // A token minted for node-b by another issuer (a forged one): refused before any stream.
  TokenIssuer forger(kIssuer);
  TokenSpec s;
  s.node = "node-b";
  st = speak_as(tls(), forger.mint(s), "node-b");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find("(signature)"), std::string::npos) << st.error_message();
  EXPECT_EQ(agents_["node-a"]->verifier->refusals("signature"), 1u);
  EXPECT_EQ(refused_metric("node-a", "signature"), 1);

  // No token at all (a downgraded peer, or a plain TLS client): refused.
  st = speak_as(tls(), "", "node-b");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_EQ(agents_["node-a"]->verifier->refusals("no_token"), 1u);
  // Plaintext (--drain-peer-insecure on the other side): no handshake, nothing reaches it.
  st = speak_as(grpc::InsecureChannelCredentials(), tokens_["node-c"], "node-c");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();

  // Drains on node-a are unaffected: the watermark moves on.
  apply(2, 11);
  EXPECT_TRUE(wait_cluster(11, 5s)) << agents_["node-a"]->coordinator->cluster_json();
}

// The Done-when's other two attempts. Holding a member's valid credentials and speaking as
// that member (which they may), an attacker tells node-a (b) that every other node is
// excluded under the next decision, with a cluster watermark far past anything applied — a
// down report, although it is not node-a's parent — and (c) a decision numbered UINT64_MAX,
// which would wrap the root's next number to one every agent ignores. Both refused and
// counted (endpointd_drain_peer_watermark_anomalies_total{kind="not-parent"|"epoch"}); node-a
// keeps the cluster's exclusions, decision and watermark, and its drains go on. (With
// --drain-peer-insecure there are no credentials to hold: anyone who reaches the port may
// speak as any member, and these same rules are all that is left — bench/results/drain-truth.md.)
TEST_F(PeerIdentity, AMembersCredentialsCannotForgeTheClustersWord) {
  start(0, "node-a");
  start(1, "node-b");
  start(2, "node-c");
  start(3, "node-d");
  apply(1, 10);
  ASSERT_TRUE(wait_cluster(10, 10s)) << agents_["node-a"]->coordinator->cluster_json();
  // The attacker: a member that is not node-a's parent in the layout and not the one node-a
  // watches on the ring (whose answers to node-a's probes carry decisions: what a member
  // node-a asks can still do is in bench/results/drain-truth.md).
  std::vector<std::string> all = {"node-a", "node-b", "node-c", "node-d"};
  Tree tree(all, AggregatorOptions{}.fan_in);
  const std::string* parent = tree.parent("node-a");
  const auto& order = tree.members();
  auto self = std::find(order.begin(), order.end(), "node-a");
  const std::string ring = std::next(self) == order.end() ? order.front() : *std::next(self);
  std::string attacker, other;
  for (const auto& n : all) {
    if (n == "node-a" || (parent && *parent == n) || n == ring) continue;
    attacker = n;
  }
  ASSERT_FALSE(attacker.empty());
  for (const auto& n : all)
    if (n != "node-a" && n != attacker) other = n;
  const std::string before = agents_["node-a"]->coordinator->cluster_json();
  ASSERT_NE(before.find("\"excluded\":[]"), std::string::npos) << before;

  pb::PeerMessage down;
  auto* d = down.mutable_down();
  d->set_from(attacker);
  d->set_watermark(1'000'000);
  d->set_dns_watermark(1'000'000);
  d->add_excluded(other);
  d->set_epoch(uint64_t{1} << 17);  // a near decision, not a jump: refused for its sender
  d->set_covered_count(3);
  pb::PeerMessage wrap;
  auto* u = wrap.mutable_up();
  u->set_from(attacker);
  u->set_watermark(10);
  u->set_dns_watermark(10);
  u->set_epoch(~0ull);
  u->set_decision(true);
  u->add_excluded(other);
  auto st = send_as(tokens_[attacker], {down, wrap}, 1500ms);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << "the stream itself is the attacker's own: " << st.error_message();

  EXPECT_GE(anomalies("node-a", "not-parent"), 1) << agents_["node-a"]->coordinator->cluster_json();
  EXPECT_GE(anomalies("node-a", "epoch"), 1) << agents_["node-a"]->coordinator->cluster_json();
  const std::string after = agents_["node-a"]->coordinator->cluster_json();
  EXPECT_NE(after.find("\"excluded\":[]"), std::string::npos) << after;
  EXPECT_EQ(after.find("1000000"), std::string::npos) << after;
  // Drains on node-a are unaffected: the watermark moves on, every node counted.
  apply(2, 11);
  EXPECT_TRUE(wait_cluster(11, 5s)) << agents_["node-a"]->coordinator->cluster_json();
  EXPECT_NE(agents_["node-a"]->coordinator->cluster_json().find("\"excluded\":[]"),
            std::string::npos);
}

// The same attempts against agents started with --drain-peer-insecure, to say what is lost: no
// credentials are needed, so anyone who reaches the port speaks as any member. The tree's rules
// still refuse (b) a down report from a member that is not node-a's parent and (c) a wrapping
// decision. What they cannot refuse is a message that is right on its face from the member it
// names: speaking as node-a's parent (or, node-a being the root, as its child), the attacker
// makes node-a believe a node applied what it never did — node-a's drains are confirmed for a
// node that may still route to the endpoint. With identity on, that same sentence needs that
// member's token (NodeCsCredentialsCannotSpeakAsNodeB).
TEST_F(PeerIdentity, WithPeerInsecureAnyoneSpeaksAsAnyMemberAndIsBelieved) {
  const std::vector<std::string> all = {"node-a", "node-b", "node-c", "node-d"};
  for (int i = 0; i < 4; ++i) start(i, all[i], /*insecure=*/true);
  apply(1, 10);
  ASSERT_TRUE(wait_cluster(10, 10s)) << agents_["node-a"]->coordinator->cluster_json();
  Tree tree(all, AggregatorOptions{}.fan_in);
  const std::string* parent = tree.parent("node-a");
  const std::string victim = parent ? *parent : tree.children("node-a").front();
  // Every agent applies 11 but the impersonated one: the honest minimum stays 10.
  apply(2, 11, victim);
  std::this_thread::sleep_for(500ms);
  ASSERT_NE(agents_["node-a"]->coordinator->cluster_json().find("\"cluster_watermark\":10,"),
            std::string::npos);
  const std::string j = agents_["node-a"]->coordinator->cluster_json();
  const auto at = j.find("\"epoch\":");
  ASSERT_NE(at, std::string::npos) << j;
  const uint64_t epoch = std::stoull(j.substr(at + 8));

  // (a) Speaking as `victim` with no credentials at all: taken (no refusal, no identity).
  pb::PeerMessage lie;
  if (parent) {
    auto* d = lie.mutable_down();
    d->set_from(victim);
    d->set_watermark(11);
    d->set_dns_watermark(11);
    d->set_epoch(epoch);
    Coverage c;
    for (const auto& n : all) c.add(n);
    d->set_covered_count(c.count);
    d->set_covered_digest(c.digest);
  } else {
    auto* u = lie.mutable_up();
    u->set_from(victim);
    u->set_watermark(11);
    u->set_dns_watermark(11);
    u->set_epoch(epoch);
    u->set_covered_count(1);
    u->set_covered_digest(member_hash(victim));
  }
  std::atomic<bool> believed{false};
  std::thread watch([&] {
    auto until = std::chrono::steady_clock::now() + 2500ms;
    while (!believed && std::chrono::steady_clock::now() < until) {
      if (agents_["node-a"]->coordinator->cluster_json().find("\"cluster_watermark\":11,") !=
          std::string::npos)
        believed = true;
      std::this_thread::sleep_for(2ms);
    }
  });
  send_as("", {lie}, 2000ms, grpc::InsecureChannelCredentials(), 20ms);
  watch.join();
  EXPECT_TRUE(believed) << "node-a never took the forged word of " << victim;
  EXPECT_EQ(counter("node-a", "refused_identity"), 0u);

  // (b) and (c) are still refused by the tree's rules, as with identity.
  std::string other;
  for (const auto& n : all)
    if (n != "node-a" && n != victim && n != tree.root()) other = n;
  ASSERT_FALSE(other.empty());
  pb::PeerMessage down;
  down.mutable_down()->set_from(other);
  down.mutable_down()->set_watermark(1'000'000);
  down.mutable_down()->set_epoch(epoch + (uint64_t{1} << 16));
  down.mutable_down()->add_excluded(victim);
  pb::PeerMessage wrap;
  wrap.mutable_up()->set_from(other);
  wrap.mutable_up()->set_epoch(~0ull);
  wrap.mutable_up()->set_decision(true);
  wrap.mutable_up()->add_excluded(victim);
  send_as("", {down, wrap}, 1000ms, grpc::InsecureChannelCredentials());
  EXPECT_GE(anomalies("node-a", "epoch"), 1);
  const std::string after = agents_["node-a"]->coordinator->cluster_json();
  EXPECT_EQ(after.find("1000000"), std::string::npos) << after;
  EXPECT_NE(after.find("\"excluded\":[]"), std::string::npos) << after;
}

// node-b's token, copied (by a peer it was sent to), on a second stream while node-b's own is
// open: refused as replayed.
TEST_F(PeerIdentity, ATokenIsTakenOnOneLiveStreamAtATime) {
  start(0, "node-a");
  start(1, "node-b");
  start(2, "node-c");
  apply(1, 10);
  ASSERT_TRUE(wait_cluster(10, 10s));
  // Whichever of node-b and node-c holds a stream to node-a (its child, or its ring watcher).
  std::string j = agents_["node-a"]->coordinator->cluster_json();
  auto in = j.substr(j.find("\"incoming\":"));
  in = in.substr(0, in.find(']'));
  std::string victim = in.find("node-b") != std::string::npos ? "node-b" : "node-c";
  ASSERT_NE(in.find(victim), std::string::npos) << j;
  auto st = speak_as(tls(), tokens_[victim], victim);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_NE(st.error_message().find("already in use"), std::string::npos) << st.error_message();
  EXPECT_GE(counter_reaching("node-a", "refused_replayed", 1), 1u);
  EXPECT_GE(refused_metric("node-a", "replayed"), 1);
  apply(2, 11);
  EXPECT_TRUE(wait_cluster(11, 5s)) << agents_["node-a"]->coordinator->cluster_json();
}

// The per-endpoint protocol (AwaitRemoval, for manifest directories and rolling upgrades)
// under the same rule: a call is answered only for the node its token names.
TEST_F(PeerIdentity, AwaitRemovalAnswersOnlyTheTokensNode) {
  start(0, "node-a");
  start(1, "node-b");
  apply(1, 10);
  auto ask = [&](const std::string& token, const std::string& from) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto ch = grpc::CreateCustomChannel(address_of(0) + ":" + std::to_string(port_), tls(), args);
    auto stub = pb::Peer::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 3s);
    if (!token.empty()) ctx.AddMetadata(kPeerTokenMetadata, token);
    pb::AwaitRemovalRequest req;
    req.set_address("10.244.9.9");
    req.set_from_node(from);
    pb::AwaitRemovalResponse resp;
    return stub->AwaitRemoval(&ctx, req, &resp);
  };
  auto st = ask(tokens_["node-b"], "node-b");
  EXPECT_TRUE(st.ok()) << st.error_message();
  st = ask(tokens_["node-b"], "node-c");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  st = ask("", "node-b");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
}

TEST(PeerIdentityConfig, TokenNeedsTlsAndExcludesInsecure) {
  PeerTlsFiles f;
  f.token = std::make_shared<TokenFile>("/nonexistent");
  VerifierOptions vo;
  f.verifier = std::make_shared<TokenVerifier>(vo, nullptr);
  auto c = load_peer_credentials(f, true);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().find("exclude each other"), std::string::npos) << c.error();
  c = load_peer_credentials(f, false);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().find("--drain-peer-ca is missing"), std::string::npos) << c.error();
}

}  // namespace
}  // namespace endpointd::drain
