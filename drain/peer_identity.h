// Per-node peer identity without a shared secret: every agent presents the projected
// ServiceAccount token the kubelet issues its pod (audience `endpointd-peer`, pod-bound, short
// expiry, rotated), and a receiver verifies it locally against the cluster's service-account
// issuer keys (the JWKS the API server serves at /openid/v1/jwks), with cjose (Debian's
// libcjose: JWS import and RS256/ES256 verification against a JWK). The keys come through an
// injected fetch (the daemon's: discovery, then the JWKS over the agent's API credentials), so
// drain/ never talks to the API server itself. See README "Peer identity" for what it defends.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/result.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
}  // namespace prometheus

namespace endpointd::drain {

// The gRPC metadata key a peer's token travels under (inside TLS).
inline constexpr const char* kPeerTokenMetadata = "x-endpointd-peer-token";
// The auth-context property the server sets to the node a verified token speaks for.
inline constexpr const char* kPeerNodeProperty = "endpointd-peer-node";

// What a token says, once verified.
struct TokenClaims {
  std::string issuer;
  std::string subject;
  std::vector<std::string> audiences;
  int64_t exp = 0, nbf = 0, iat = 0;  // seconds since the epoch (0: absent)
  std::string jti;
  std::string sa_namespace, sa_name;  // kubernetes.io.namespace, .serviceaccount.name
  std::string pod_name, pod_uid;      // kubernetes.io.pod (pod-bound tokens)
  std::string node_name, node_uid;    // kubernetes.io.node (Kubernetes >= 1.30)
};

// Reads a token's claims WITHOUT verifying its signature: for the agent's own token (which
// ServiceAccount it runs as). An error names what is malformed.
Result<TokenClaims> read_unverified_claims(std::string_view token);

// What the issuer publishes: its name (discovery's `issuer`) and its keys (a JWKS document).
struct IssuerKeys {
  std::string issuer;
  std::string jwks;  // JSON: {"keys": [...]}
};

struct VerifierOptions {
  std::string audience = "endpointd-peer";
  // The issuer a token must name; empty: the one the key fetch reports (discovery's).
  std::string issuer;
  // The DaemonSet's ServiceAccount: a token of any other is refused.
  std::string sa_namespace, sa_name;
  std::chrono::seconds skew{30};  // exp, nbf and iat tolerance
  // Between two key fetches at least this (an unknown kid asks again no sooner).
  std::chrono::seconds refetch_min{10};
  // Keys older than this are fetched again at the next verification (rotation of the issuer).
  std::chrono::seconds refresh{300};
  // After the last successful fetch, keys are used this long while fetches fail; then every
  // token is refused until a fetch succeeds.
  std::chrono::seconds keep_last_good{600};
};

// The node a pod runs on, for tokens without the node claim (clusters before 1.30): the daemon
// asks the API server (GET pod, cached); "" with an error when unknown.
using PodNodeLookup = std::function<Result<std::string>(
    const std::string& ns, const std::string& name, const std::string& uid)>;

// Why a token was refused: a short reason (the metric's label) and a message naming it.
struct Refusal {
  std::string reason;
  std::string message;
};

struct VerifiedPeer {
  std::string node;
  std::string credential;  // what identifies this token (jti, else its signature)
  TokenClaims claims;
};

class TokenVerifier {
 public:
  using Fetch = std::function<Result<IssuerKeys>()>;
  using Now = std::function<std::chrono::system_clock::time_point()>;
  TokenVerifier(VerifierOptions opts, Fetch fetch, PodNodeLookup pods = {}, Now now = {},
                prometheus::Registry* registry = nullptr);
  ~TokenVerifier();
  TokenVerifier(const TokenVerifier&) = delete;
  TokenVerifier& operator=(const TokenVerifier&) = delete;

  // Verifies `token` (signature, issuer, audience, time, ServiceAccount, pod binding, node).
  // May fetch keys (an unknown kid, keys due for refresh), bounded by refetch_min. Thread-safe.
  // Every refusal is counted (endpointd_drain_peer_refused_total{reason}) and logged at powers
  // of two per reason.
  std::variant<VerifiedPeer, Refusal> verify(std::string_view token);
  // Counts and logs a refusal decided elsewhere (the stream's checks: node, replay).
  void refused(const Refusal& r);

  // Fetches the keys now (the daemon's start: fail early on a cluster without discovery).
  Status refresh_keys();
  size_t fetches() const;
  size_t key_count() const;
  uint64_t refusals(const std::string& reason) const;
  const VerifierOptions& options() const { return opts_; }

 private:
  struct Keys;
  struct Metrics;
  // Under mu_: fetches when allowed; true when it fetched new keys.
  bool maybe_fetch(std::unique_lock<std::mutex>& lock, bool unknown_kid);
  std::chrono::system_clock::time_point now() const;

  VerifierOptions opts_;
  Fetch fetch_;
  PodNodeLookup pods_;
  Now now_;
  std::unique_ptr<Metrics> metrics_;
  mutable std::mutex mu_;
  std::shared_ptr<const Keys> keys_;
  std::string issuer_;  // the one tokens must name
  std::chrono::system_clock::time_point last_attempt_{}, last_success_{};
  bool fetching_ = false;
  size_t fetches_ = 0;
  std::map<std::string, uint64_t> refusals_;
};

// The agent's own token, read from the projected volume's file; re-read when the file changed
// (the kubelet rewrites it at 80% of its life) and at least every `reread`.
class TokenFile {
 public:
  explicit TokenFile(std::string path, std::chrono::seconds reread = std::chrono::seconds(30));
  // The current token, or an error naming the file.
  Result<std::string> token();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::chrono::seconds reread_;
  std::mutex mu_;
  std::string token_;
  int64_t mtime_ns_ = -1;
  std::chrono::steady_clock::time_point read_at_{};
};

}  // namespace endpointd::drain
