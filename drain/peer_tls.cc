#include "drain/peer_tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>
#include <spdlog/spdlog.h>

#include "model/file.h"

namespace endpointd::drain {

Result<PeerCredentials> load_peer_credentials(const PeerTlsFiles& files, bool insecure) {
  PeerCredentials out;
  if (files.empty()) {
    if (!insecure) {
      return Error{
          "peer traffic is mutual TLS: give --drain-peer-ca, --drain-peer-cert and "
          "--drain-peer-key (the chart mounts them), or --drain-peer-insecure to run the peer "
          "port in plaintext, unauthenticated"};
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
  struct Want {
    const char* flag;
    const std::string& path;
    std::string text;
  };
  Want want[] = {{"--drain-peer-ca", files.ca, {}},
                 {"--drain-peer-cert", files.cert, {}},
                 {"--drain-peer-key", files.key, {}}};
  for (auto& w : want) {
    if (w.path.empty())
      return Error{std::string(w.flag) +
                   " is missing: mutual TLS needs the CA, the certificate and the key"};
    auto text = model::read_small_file(w.path);
    if (!text) return Error{std::string(w.flag) + " " + w.path + ": " + text.error()};
    if (text->find("-----BEGIN ") == std::string::npos)
      return Error{std::string(w.flag) + " " + w.path + ": not a PEM file"};
    w.text = std::move(*text);
  }
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
  for (const char* prop : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME})
    for (const auto& v : ctx.FindPropertyValues(prop)) names.emplace_back(v.data(), v.size());
  return names;
}

}  // namespace endpointd::drain
