// Token verification with cjose (JWS, JWK) and jansson (the claims): no hand-written JWS
// parsing. Keys are fetched through the injected function, at most once per refetch_min.
#include "drain/peer_identity.h"

#include <cjose/cjose.h>
#include <jansson.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "io/small_file.h"

namespace endpointd::drain {

namespace {

constexpr size_t kMaxToken = 16 * 1024;  // a projected token is about 1 KiB
constexpr size_t kMaxJwks = 1 << 20;

struct JsonDeleter {
  void operator()(json_t* j) const { json_decref(j); }
};
using JsonPtr = std::unique_ptr<json_t, JsonDeleter>;
struct JwsDeleter {
  void operator()(cjose_jws_t* j) const { cjose_jws_release(j); }
};
using JwsPtr = std::unique_ptr<cjose_jws_t, JwsDeleter>;
struct JwkRelease {
  void operator()(cjose_jwk_t* k) const { cjose_jwk_release(k); }
};

std::string str(const json_t* obj, const char* key) {
  const json_t* v = obj ? json_object_get(obj, key) : nullptr;
  return json_is_string(v) ? std::string(json_string_value(v), json_string_length(v))
                           : std::string();
}

int64_t number(const json_t* obj, const char* key) {
  const json_t* v = json_object_get(obj, key);
  if (json_is_integer(v)) return json_integer_value(v);
  if (json_is_real(v)) return static_cast<int64_t>(json_real_value(v));
  return 0;
}

Result<TokenClaims> parse_claims(std::string_view payload) {
  json_error_t err;
  JsonPtr root(json_loadb(payload.data(), payload.size(), 0, &err));
  if (!root || !json_is_object(root.get()))
    return Error{"the token's claims are not a JSON object"};
  const json_t* r = root.get();
  TokenClaims c;
  c.issuer = str(r, "iss");
  c.subject = str(r, "sub");
  c.jti = str(r, "jti");
  const json_t* aud = json_object_get(r, "aud");
  if (json_is_string(aud)) {
    c.audiences.emplace_back(json_string_value(aud));
  } else if (json_is_array(aud)) {
    size_t i;
    const json_t* a;
    json_array_foreach(aud, i, a) {
      if (json_is_string(a) && c.audiences.size() < 64)
        c.audiences.emplace_back(json_string_value(a));
    }
  }
  c.exp = number(r, "exp");
  c.nbf = number(r, "nbf");
  c.iat = number(r, "iat");
  const json_t* k = json_object_get(r, "kubernetes.io");
  if (json_is_object(k)) {
    c.sa_namespace = str(k, "namespace");
    c.sa_name = str(json_object_get(k, "serviceaccount"), "name");
    const json_t* pod = json_object_get(k, "pod");
    c.pod_name = str(pod, "name");
    c.pod_uid = str(pod, "uid");
    const json_t* node = json_object_get(k, "node");
    c.node_name = str(node, "name");
    c.node_uid = str(node, "uid");
  }
  return c;
}

std::string cjose_message(const cjose_err& e) {
  return e.message ? e.message : "unknown cjose error";
}

bool power_of_two(uint64_t n) {
  return n != 0 && (n & (n - 1)) == 0;
}

}  // namespace

Result<TokenClaims> read_unverified_claims(std::string_view token) {
  if (token.empty() || token.size() > kMaxToken) return Error{"not a token (size)"};
  cjose_err err{};
  JwsPtr jws(cjose_jws_import(token.data(), token.size(), &err));
  if (!jws) return Error{"not a compact JWS: " + cjose_message(err)};
  uint8_t* plain = nullptr;
  size_t len = 0;
  if (!cjose_jws_get_plaintext(jws.get(), &plain, &len, &err))
    return Error{"no payload: " + cjose_message(err)};
  return parse_claims(std::string_view(reinterpret_cast<const char*>(plain), len));
}

struct TokenVerifier::Keys {
  std::map<std::string, std::shared_ptr<cjose_jwk_t>> by_kid;
};

struct TokenVerifier::Metrics {
  std::shared_ptr<prometheus::Registry> own;
  prometheus::Family<prometheus::Counter>* refused;
  prometheus::Family<prometheus::Counter>* fetches;
  prometheus::Gauge* keys;
  explicit Metrics(prometheus::Registry* r) {
    if (!r) {
      own = std::make_shared<prometheus::Registry>();
      r = own.get();
    }
    // The same family as drain/cluster.cc's stream refusals (same name and help: merged).
    refused = &prometheus::BuildCounter()
                   .Name("endpointd_drain_peer_refused_total")
                   .Help("Peer streams closed by this agent, by reason")
                   .Register(*r);
    fetches = &prometheus::BuildCounter()
                   .Name("endpointd_drain_peer_jwks_fetches_total")
                   .Help("Fetches of the service-account issuer's keys, by result")
                   .Register(*r);
    keys = &prometheus::BuildGauge()
                .Name("endpointd_drain_peer_jwks_keys")
                .Help("Service-account issuer keys held to verify peer tokens")
                .Register(*r)
                .Add({});
  }
};

TokenVerifier::TokenVerifier(VerifierOptions opts, Fetch fetch, PodNodeLookup pods, Now now,
                             prometheus::Registry* registry)
    : opts_(std::move(opts)),
      fetch_(std::move(fetch)),
      pods_(std::move(pods)),
      now_(std::move(now)),
      metrics_(std::make_unique<Metrics>(registry)) {}

TokenVerifier::~TokenVerifier() = default;

std::chrono::system_clock::time_point TokenVerifier::now() const {
  return now_ ? now_() : std::chrono::system_clock::now();
}

size_t TokenVerifier::fetches() const {
  std::lock_guard lock(mu_);
  return fetches_;
}

size_t TokenVerifier::key_count() const {
  std::lock_guard lock(mu_);
  return keys_ ? keys_->by_kid.size() : 0;
}

uint64_t TokenVerifier::refusals(const std::string& reason) const {
  std::lock_guard lock(mu_);
  auto it = refusals_.find(reason);
  return it == refusals_.end() ? 0 : it->second;
}

void TokenVerifier::refused(const Refusal& r) {
  uint64_t n;
  {
    std::lock_guard lock(mu_);
    n = ++refusals_[r.reason];
  }
  metrics_->refused->Add({{"reason", r.reason}}).Increment();
  if (power_of_two(n))
    spdlog::warn("drain: peer refused ({}, {} so far): {}", r.reason, n, r.message);
}

Status TokenVerifier::refresh_keys() {
  std::unique_lock lock(mu_);
  last_attempt_ = {};
  maybe_fetch(lock, true);
  if (!keys_) return Error{"no service-account issuer keys could be fetched"};
  return {};
}

bool TokenVerifier::maybe_fetch(std::unique_lock<std::mutex>& lock, bool unknown_kid) {
  auto t = now();
  bool due = !keys_ || unknown_kid || t - last_success_ >= opts_.refresh;
  if (!due || fetching_) return false;
  if (last_attempt_ != std::chrono::system_clock::time_point{} &&
      t - last_attempt_ < opts_.refetch_min)
    return false;
  last_attempt_ = t;
  fetching_ = true;
  ++fetches_;
  lock.unlock();
  auto got = fetch_ ? fetch_() : Result<IssuerKeys>(Error{"no key source"});
  std::shared_ptr<Keys> keys;
  std::string error;
  if (got.ok()) {
    if (got->jwks.size() > kMaxJwks) {
      error = "the JWKS document is larger than 1 MiB";
    } else {
      json_error_t jerr;
      JsonPtr root(json_loadb(got->jwks.data(), got->jwks.size(), 0, &jerr));
      const json_t* arr = root ? json_object_get(root.get(), "keys") : nullptr;
      if (!json_is_array(arr)) {
        error = "the JWKS document has no keys array";
      } else {
        keys = std::make_shared<Keys>();
        size_t i;
        json_t* k;
        json_array_foreach(arr, i, k) {
          // Only public signature keys: a symmetric key in a JWKS is never trusted.
          std::string kty = str(k, "kty");
          if (kty != "RSA" && kty != "EC") continue;
          cjose_err err{};
          cjose_jwk_t* jwk = cjose_jwk_import_json(k, &err);
          if (!jwk) continue;
          keys->by_kid[str(k, "kid")] = std::shared_ptr<cjose_jwk_t>(jwk, JwkRelease{});
        }
        if (keys->by_kid.empty()) error = "the JWKS document holds no RSA or EC key";
      }
    }
  } else {
    error = got.error();
  }
  lock.lock();
  fetching_ = false;
  if (error.empty()) {
    keys_ = std::move(keys);
    issuer_ = opts_.issuer.empty() ? got->issuer : opts_.issuer;
    last_success_ = now();
    metrics_->fetches->Add({{"result", "ok"}}).Increment();
    metrics_->keys->Set(static_cast<double>(keys_->by_kid.size()));
    return true;
  }
  metrics_->fetches->Add({{"result", "error"}}).Increment();
  spdlog::warn("drain: fetching the service-account issuer's keys failed: {}{}", error,
               keys_ ? " (keeping the last good keys for now)" : "");
  return false;
}

std::variant<VerifiedPeer, Refusal> TokenVerifier::verify(std::string_view token) {
  auto refuse = [&](std::string reason,
                    std::string message) -> std::variant<VerifiedPeer, Refusal> {
    Refusal r{std::move(reason), std::move(message)};
    refused(r);
    return r;
  };
  if (token.empty()) return refuse("no_token", "no token presented");
  if (token.size() > kMaxToken) return refuse("malformed", "token larger than 16 KiB");
  cjose_err err{};
  JwsPtr jws(cjose_jws_import(token.data(), token.size(), &err));
  if (!jws) return refuse("malformed", "not a compact JWS: " + cjose_message(err));
  cjose_header_t* hdr = cjose_jws_get_protected(jws.get());
  const char* alg = hdr ? cjose_header_get(hdr, CJOSE_HDR_ALG, &err) : nullptr;
  const char* kid_c = hdr ? cjose_header_get(hdr, CJOSE_HDR_KID, &err) : nullptr;
  std::string kid = kid_c ? kid_c : "";
  bool rsa = alg && std::strcmp(alg, CJOSE_HDR_ALG_RS256) == 0;
  bool ec = alg && std::strcmp(alg, CJOSE_HDR_ALG_ES256) == 0;
  if (!rsa && !ec)
    return refuse("algorithm", std::string("signed with ") + (alg ? alg : "no algorithm") +
                                   ", not RS256 or ES256");

  std::shared_ptr<cjose_jwk_t> key;
  std::string issuer;
  {
    std::unique_lock lock(mu_);
    maybe_fetch(lock, false);
    auto find = [&] {
      if (!keys_) return std::shared_ptr<cjose_jwk_t>();
      auto it = keys_->by_kid.find(kid);
      return it == keys_->by_kid.end() ? std::shared_ptr<cjose_jwk_t>() : it->second;
    };
    key = find();
    if (!key && keys_ && maybe_fetch(lock, true)) key = find();
    if (!keys_ || now() - last_success_ > opts_.keep_last_good) {
      lock.unlock();
      return refuse("jwks_unavailable",
                    keys_ ? "the issuer's keys could not be fetched again within " +
                                std::to_string(opts_.keep_last_good.count()) + " s"
                          : "the issuer's keys could not be fetched");
    }
    issuer = issuer_;
    if (!key) {
      lock.unlock();
      return refuse("unknown_kid", "signed by key \"" + kid.substr(0, 64) +
                                       "\", which the issuer's keys do not hold");
    }
  }
  cjose_jwk_kty_t kty = cjose_jwk_get_kty(key.get(), &err);
  if ((rsa && kty != CJOSE_JWK_KTY_RSA) || (ec && kty != CJOSE_JWK_KTY_EC))
    return refuse("algorithm", std::string(alg) + " with a key of another type");
  if (!cjose_jws_verify(jws.get(), key.get(), &err))
    return refuse("signature", "the signature does not verify: " + cjose_message(err));
  uint8_t* plain = nullptr;
  size_t len = 0;
  if (!cjose_jws_get_plaintext(jws.get(), &plain, &len, &err))
    return refuse("malformed", "no payload");
  auto claims = parse_claims(std::string_view(reinterpret_cast<const char*>(plain), len));
  if (!claims) return refuse("malformed", claims.error());
  TokenClaims& c = *claims;
  if (c.issuer != issuer)
    return refuse("issuer",
                  "issued by \"" + c.issuer.substr(0, 128) + "\", not \"" + issuer + "\"");
  if (std::find(c.audiences.begin(), c.audiences.end(), opts_.audience) == c.audiences.end())
    return refuse("audience", "not for audience \"" + opts_.audience + "\"");
  int64_t t = std::chrono::duration_cast<std::chrono::seconds>(now().time_since_epoch()).count();
  int64_t skew = opts_.skew.count();
  if (c.exp == 0) return refuse("expired", "the token has no expiry");
  if (t > c.exp + skew) return refuse("expired", "expired " + std::to_string(t - c.exp) + " s ago");
  if (c.nbf != 0 && t + skew < c.nbf)
    return refuse("not_yet_valid", "not valid for another " + std::to_string(c.nbf - t) + " s");
  if (c.iat != 0 && t + skew < c.iat)
    return refuse("not_yet_valid", "issued " + std::to_string(c.iat - t) + " s in the future");
  if (c.sa_namespace != opts_.sa_namespace || c.sa_name != opts_.sa_name)
    return refuse("service_account", "ServiceAccount " + c.sa_namespace.substr(0, 64) + "/" +
                                         c.sa_name.substr(0, 64) + ", not the agents' " +
                                         opts_.sa_namespace + "/" + opts_.sa_name);
  if (c.pod_name.empty() || c.pod_uid.empty())
    return refuse("not_pod_bound", "the token is not bound to a pod");
  if (c.node_name.empty()) {
    // Kubernetes before 1.30: the pod it is bound to says where it runs.
    if (!pods_) return refuse("no_node", "the token names no node and no pod lookup is configured");
    auto node = pods_(c.sa_namespace, c.pod_name, c.pod_uid);
    if (!node || node->empty())
      return refuse("no_node", "the token names no node, and its pod " + c.pod_name.substr(0, 64) +
                                   ": " + (node ? "has no node" : node.error()));
    c.node_name = *node;
  }
  VerifiedPeer out;
  out.node = c.node_name;
  if (!c.jti.empty()) {
    out.credential = "jti:" + c.jti;
  } else {
    auto dot = token.rfind('.');
    out.credential = "sig:" + std::string(token.substr(dot + 1, 86));
  }
  out.claims = std::move(c);
  return out;
}

TokenFile::TokenFile(std::string path, std::chrono::seconds reread)
    : path_(std::move(path)), reread_(reread) {}

Result<std::string> TokenFile::token() {
  std::lock_guard lock(mu_);
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) {
    if (!token_.empty()) return token_;  // a rotation's moment: the last one read
    return Error{"--drain-peer-token-file " + path_ + ": " + std::strerror(errno)};
  }
  // The kubelet swaps in a new file: another inode, or another time or size.
  int64_t mtime = (int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec) ^
                  (static_cast<int64_t>(st.st_ino) << 20) ^ static_cast<int64_t>(st.st_size);
  auto t = std::chrono::steady_clock::now();
  if (token_.empty() || mtime != mtime_ns_ || t - read_at_ >= reread_) {
    auto text = io::read_small_file(path_);
    if (!text) {
      if (!token_.empty()) return token_;
      return Error{"--drain-peer-token-file " + path_ + ": " + text.error()};
    }
    std::string s = std::move(*text);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    if (s.empty()) return Error{"--drain-peer-token-file " + path_ + ": empty"};
    token_ = std::move(s);
    mtime_ns_ = mtime;
    read_at_ = t;
  }
  return token_;
}

}  // namespace endpointd::drain
