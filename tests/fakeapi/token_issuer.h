// A service-account token issuer for tests, as kube-apiserver's: an ES256 (or RS256) signing
// key, the OIDC discovery document and the JWKS it publishes, and projected-token minting for
// a pod on a node (the `kubernetes.io` claims of a pod-bound token). Every field a test may
// want wrong (issuer, audience, times, node, key id) can be set per token.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace endpointd::fakeapi {

struct TokenSpec {
  std::string node;  // the node the pod runs on (kubernetes.io.node.name)
  std::string pod;   // default: endpointd-<node>
  std::string pod_uid;
  std::string sa_namespace = "kube-system";
  std::string sa_name = "endpointd";
  std::string audience = "endpointd-peer";
  std::optional<std::string> issuer;  // default: the issuer's own
  std::chrono::seconds lifetime{600};
  std::chrono::seconds issued_ago{0};  // iat (and nbf) this long before now
  bool node_claim = true;              // false: a cluster before 1.30 (no kubernetes.io.node)
  bool pod_bound = true;
  std::string jti;                 // default: a fresh one
  std::optional<std::string> kid;  // default: the current key's
  std::optional<int64_t> now;      // seconds since the epoch (default: the clock)
};

class TokenIssuer {
 public:
  // `issuer`: the iss every token and the discovery document name. `rsa`: RS256 keys (2048
  // bits) instead of ES256 (P-256).
  explicit TokenIssuer(std::string issuer, bool rsa = false);
  ~TokenIssuer();
  TokenIssuer(const TokenIssuer&) = delete;
  TokenIssuer& operator=(const TokenIssuer&) = delete;

  const std::string& issuer() const { return issuer_; }
  void set_issuer(std::string issuer);
  std::string mint(const TokenSpec& spec);
  // {"issuer": ..., "jwks_uri": <issuer>/openid/v1/jwks, ...}
  std::string discovery() const;
  std::string jwks() const;
  // A new signing key (kid "key-<n>"); the old one stays in the JWKS unless `drop_old`.
  void rotate(bool drop_old);
  std::string current_kid() const;

 private:
  struct Key;
  mutable std::mutex mu_;
  std::string issuer_;
  bool rsa_;
  std::vector<std::shared_ptr<Key>> keys_;  // the last one signs
  uint64_t next_kid_ = 1;
  uint64_t next_jti_ = 1;
  void add_key_locked();
};

}  // namespace endpointd::fakeapi
