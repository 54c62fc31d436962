#include "drain/peer_tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <spdlog/spdlog.h>

#include "drain/peer_identity.h"
#include "io/small_file.h"

namespace endpointd::drain {

namespace {

// Puts this agent's current token on every call (re-read when the kubelet rotated it).
class TokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenPlugin(std::shared_ptr<TokenFile> file) : file_(std::move(file)) {}
  bool IsBlocking() const override { return true; }  // it may read the file
  const char* GetType() const override { return "endpointd-peer-token"; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* md) override {
    auto t = file_->token();
    if (!t) return grpc::Status(grpc::StatusCode::UNAVAILABLE, t.error());
    md->emplace(kPeerTokenMetadata, *t);
    return grpc::Status::OK;
  }

 private:
  std::shared_ptr<TokenFile> file_;
};

// Verifies the token of every call before any of it reaches a handler, and binds the
// connection to the node of the first token it verified: a later call on the same connection
// with a token of another node is refused (a connection speaks for one node, ever).
class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(std::shared_ptr<TokenVerifier> v) : v_(std::move(v)) {}
  bool IsBlocking() const override { return true; }  // a key fetch may be due
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext* ctx, OutputMetadata*,
                       OutputMetadata*) override {
    auto it = md.find(kPeerTokenMetadata);
    std::string_view token;
    if (it != md.end()) token = std::string_view(it->second.data(), it->second.size());
    auto r = v_->verify(token);
    if (const auto* no = std::get_if<Refusal>(&r))
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          "endpointd drain: peer token refused (" + no->reason + "): " + no->message);
    const auto& peer = std::get<VerifiedPeer>(r);
    std::lock_guard lock(mu_);  // two calls on one connection at once: one binds it
    auto have = ctx->FindPropertyValues(kPeerNodeProperty);
    if (!have.empty()) {
      std::string bound(have.front().data(), have.front().size());
      if (bound == peer.node) return grpc::Status::OK;
      Refusal no{"rebound", "a connection of node " + bound.substr(0, 64) +
                                " presented a token of node " + peer.node.substr(0, 64)};
      v_->refused(no);
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "endpointd drain: peer refused (rebound): " + no.message);
    }
    ctx->AddProperty(kPeerNodeProperty, peer.node);
    ctx->SetPeerIdentityPropertyName(kPeerNodeProperty);
    return grpc::Status::OK;
  }

 private:
  std::shared_ptr<TokenVerifier> v_;
  std::mutex mu_;
};

struct Pem {
  const char* flag;
  const std::string& path;
  std::string text;
};

Status read_pems(Pem* pems, size_t n, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    auto& w = pems[i];
    if (w.path.empty()) return Error{std::string(w.flag) + " is missing: " + what};
    auto text = io::read_small_file(w.path);
    if (!text) return Error{std::string(w.flag) + " " + w.path + ": " + text.error()};
    if (text->find("-----BEGIN ") == std::string::npos)
      return Error{std::string(w.flag) + " " + w.path + ": not a PEM file"};
    w.text = std::move(*text);
  }
  return {};
}

}  // namespace

Result<PeerCredentials> load_peer_credentials(const PeerTlsFiles& files, bool insecure) {
  PeerCredentials out;
  bool identity = files.token || files.verifier;
  if (identity) {
    if (!files.token || !files.verifier)
      return Error{"peer identity needs both this agent's token and a verifier"};
    if (insecure)
      return Error{
          "--drain-peer-insecure and the peer token exclude each other: a token travels only "
          "inside TLS"};
    Pem want[] = {{"--drain-peer-ca", files.ca, {}},
                  {"--drain-peer-cert", files.cert, {}},
                  {"--drain-peer-key", files.key, {}}};
    if (auto st = read_pems(want, 3,
                            "the peer token travels inside TLS (any server certificate: "
                            "the chart makes one)");
        !st)
      return Error{st.error()};
    grpc::SslServerCredentialsOptions server(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    server.pem_root_certs = want[0].text;
    server.pem_key_cert_pairs.push_back({want[2].text, want[1].text});
    out.server = grpc::SslServerCredentials(server);
    out.server->SetAuthMetadataProcessor(std::make_shared<TokenProcessor>(files.verifier));
    // The server certificate is the same on every agent: it is checked against the CA and
    // names no node (the token does), so no host name check.
    grpc::experimental::TlsChannelCredentialsOptions client;
    client.set_certificate_provider(
        std::make_shared<grpc::experimental::StaticDataCertificateProvider>(want[0].text));
    client.watch_root_certs();
    client.set_verify_server_certs(true);
    client.set_check_call_host(false);
    client.set_certificate_verifier(
        std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
    out.client = grpc::CompositeChannelCredentials(
        grpc::experimental::TlsCredentials(client),
        grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenPlugin>(files.token)));
    out.tls = true;
    out.verifier = files.verifier;
    return out;
  }
  if (files.empty()) {
    if (!insecure) {
      return Error{
          "peer traffic is authenticated: give --drain-peer-token-file with the TLS files (the "
          "chart's default), or --drain-peer-ca, --drain-peer-cert and --drain-peer-key for "
          "mutual TLS, or --drain-peer-insecure to run the peer port in plaintext, "
          "unauthenticated"};
    }
    spdlog::warn(
        "drain: the peer port runs in PLAINTEXT without authentication (--drain-peer-insecure): "
        "anyone who reaches it can read this node's drain state and speak for any node");
    out.server = grpc::InsecureServerCredentials();
    out.client = grpc::InsecureChannelCredentials();
    return out;
  }
  if (insecure)
    return Error{"--drain-peer-insecure and the peer TLS files exclude each other; choose one"};
  Pem want[] = {{"--drain-peer-ca", files.ca, {}},
                {"--drain-peer-cert", files.cert, {}},
                {"--drain-peer-key", files.key, {}}};
  if (auto st = read_pems(want, 3, "mutual TLS needs the CA, the certificate and the key"); !st)
    return Error{st.error()};
  grpc::SslServerCredentialsOptions server(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  server.pem_root_certs = want[0].text;
  server.pem_key_cert_pairs.push_back({want[2].text, want[1].text});
  out.server = grpc::SslServerCredentials(server);
  grpc::SslCredentialsOptions client;
  client.pem_root_certs = want[0].text;
  client.pem_cert_chain = want[1].text;
  client.pem_private_key = want[2].text;
  out.client = grpc::SslCredentials(client);
  out.tls = true;
  return out;
}

std::vector<std::string> peer_certificate_names(const grpc::AuthContext& ctx) {
  std::vector<std::string> names;
  if (!ctx.IsPeerAuthenticated()) return names;
  auto token_nodes = ctx.FindPropertyValues(kPeerNodeProperty);
  if (!token_nodes.empty()) {
    // One node per connection (TokenProcessor); more would be a race lost: none.
    if (token_nodes.size() == 1) names.emplace_back(token_nodes[0].data(), token_nodes[0].size());
    return names;
  }
  for (const char* prop : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME})
    for (const auto& v : ctx.FindPropertyValues(prop)) names.emplace_back(v.data(), v.size());
  return names;
}

}  // namespace endpointd::drain
