// Peer credentials. Two ways for an agent to prove its node, both inside TLS:
// - identity (the chart's default): every agent presents its projected ServiceAccount token
//   (drain/peer_identity.h) on every call; the receiver verifies it locally and takes a report
//   only from the node the token names. TLS (one server certificate the chart makes, the same
//   on every agent) only keeps the token and the reports private: no per-node key anywhere.
// - mutual TLS with the user's PKI: every agent holds the peer CA and a certificate naming its
//   own node, and a report is taken only from the node its sender's certificate names.
// Plaintext only when asked for by name (--drain-peer-insecure): a manifest directory on a
// laptop, the namespace tests. An agent with identity never takes a report from one without.
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

class TokenVerifier;
class TokenFile;

struct PeerTlsFiles {
  std::string ca;    // PEM: the CA every agent's certificate is signed by
  std::string cert;  // PEM: this agent's certificate (names its node; server and client auth);
                     // with identity: the server certificate every agent shares
  std::string key;   // PEM: its private key
  // Identity: this agent's token (sent on every call) and the verifier of its peers' tokens.
  // Both or neither; with them the files above are the server certificate only.
  std::shared_ptr<TokenFile> token = nullptr;
  std::shared_ptr<TokenVerifier> verifier = nullptr;
  bool empty() const { return ca.empty() && cert.empty() && key.empty(); }
};

struct PeerCredentials {
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> client;
  bool tls = false;  // a peer's node is known (certificate or token): reports only from it
  // Identity: set when the node comes from a verified token (null for mutual TLS).
  std::shared_ptr<TokenVerifier> verifier;
};

// Identity when `files` has a token and a verifier (the TLS files then are the shared server
// certificate); mutual TLS from the three files (all three, readable, or an error naming the
// one that is not); plaintext when `files` is empty and `insecure`; otherwise an error that
// says how to choose.
Result<PeerCredentials> load_peer_credentials(const PeerTlsFiles& files, bool insecure);

// The node names a peer speaks for: with identity, the node its verified token names (one);
// otherwise its verified certificate's DNS subject alternative names and common name. Empty
// for a plaintext or unverified peer.
std::vector<std::string> peer_certificate_names(const grpc::AuthContext& ctx);

}  // namespace endpointd::drain
