// Peer credentials. Peer traffic is mutual TLS: every agent holds the cluster's peer CA and a
// certificate naming its own node (the chart's per-node Secret), verifies the certificate of
// every agent it talks to against that CA, and takes a report only from the node its sender's
// certificate names. Plaintext only when asked for by name (--drain-peer-insecure): a manifest
// directory on a laptop, the namespace tests, the scale harness.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/result.h"

namespace grpc {
class AuthContext;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace endpointd::drain {

struct PeerTlsFiles {
  std::string ca;    // PEM: the CA every agent's certificate is signed by
  std::string cert;  // PEM: this agent's certificate (names its node; server and client auth)
  std::string key;   // PEM: its private key
  bool empty() const { return ca.empty() && cert.empty() && key.empty(); }
};

struct PeerCredentials {
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> client;
  bool tls = false;
};

// Mutual TLS from the three files (all three, readable, or an error naming the one that is
// not); plaintext when `files` is empty and `insecure`; otherwise an error that says how to
// choose.
Result<PeerCredentials> load_peer_credentials(const PeerTlsFiles& files, bool insecure);

// The names a verified peer certificate speaks for: its DNS subject alternative names, and its
// common name. Empty for a plaintext or unverified peer.
std::vector<std::string> peer_certificate_names(const grpc::AuthContext& ctx);

}  // namespace endpointd::drain
