#include "tests/fakeapi/token_issuer.h"

#include <cjose/cjose.h>
#include <jansson.h>

#include <stdexcept>

namespace endpointd::fakeapi {

namespace {

struct JsonDeleter {
  void operator()(json_t* j) const { json_decref(j); }
};
using JsonPtr = std::unique_ptr<json_t, JsonDeleter>;

std::string dump(json_t* j) {
  char* s = json_dumps(j, JSON_COMPACT);
  std::string out = s ? s : "";
  free(s);
  return out;
}

}  // namespace

struct TokenIssuer::Key {
  std::string kid;
  std::shared_ptr<cjose_jwk_t> jwk;
};

TokenIssuer::TokenIssuer(std::string issuer, bool rsa) : issuer_(std::move(issuer)), rsa_(rsa) {
  std::lock_guard lock(mu_);
  add_key_locked();
}

TokenIssuer::~TokenIssuer() = default;

void TokenIssuer::add_key_locked() {
  cjose_err err{};
  cjose_jwk_t* k = nullptr;
  if (rsa_) {
    static const uint8_t e[] = {0x01, 0x00, 0x01};
    k = cjose_jwk_create_RSA_random(2048, e, sizeof e, &err);
  } else {
    k = cjose_jwk_create_EC_random(CJOSE_JWK_EC_P_256, &err);
  }
  if (!k) throw std::runtime_error("cjose: cannot make a key");
  auto key = std::make_shared<Key>();
  key->kid = "key-" + std::to_string(next_kid_++);
  cjose_jwk_set_kid(k, key->kid.data(), key->kid.size(), &err);
  key->jwk = std::shared_ptr<cjose_jwk_t>(k, [](cjose_jwk_t* p) { cjose_jwk_release(p); });
  keys_.push_back(std::move(key));
}

void TokenIssuer::set_issuer(std::string issuer) {
  std::lock_guard lock(mu_);
  issuer_ = std::move(issuer);
}

void TokenIssuer::rotate(bool drop_old) {
  std::lock_guard lock(mu_);
  if (drop_old) keys_.clear();
  add_key_locked();
}

std::string TokenIssuer::current_kid() const {
  std::lock_guard lock(mu_);
  return keys_.back()->kid;
}

std::string TokenIssuer::discovery() const {
  std::lock_guard lock(mu_);
  return "{\"issuer\":\"" + issuer_ + "\",\"jwks_uri\":\"" + issuer_ +
         "/openid/v1/jwks\",\"response_types_supported\":[\"id_token\"],"
         "\"subject_types_supported\":[\"public\"],"
         "\"id_token_signing_alg_values_supported\":[\"" +
         (rsa_ ? "RS256" : "ES256") + "\"]}";
}

std::string TokenIssuer::jwks() const {
  std::lock_guard lock(mu_);
  std::string out = "{\"keys\":[";
  for (size_t i = 0; i < keys_.size(); ++i) {
    cjose_err err{};
    char* pub = cjose_jwk_to_json(keys_[i]->jwk.get(), false, &err);
    if (i) out += ",";
    // kube-apiserver adds use and alg
    json_error_t jerr;
    JsonPtr j(json_loads(pub ? pub : "{}", 0, &jerr));
    free(pub);
    json_object_set_new(j.get(), "use", json_string("sig"));
    json_object_set_new(j.get(), "alg", json_string(rsa_ ? "RS256" : "ES256"));
    out += dump(j.get());
  }
  return out + "]}";
}

std::string TokenIssuer::mint(const TokenSpec& spec) {
  std::lock_guard lock(mu_);
  int64_t now = spec.now ? *spec.now
                         : std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  int64_t iat = now - spec.issued_ago.count();
  std::string pod = spec.pod.empty() ? "endpointd-" + spec.node : spec.pod;
  std::string pod_uid = spec.pod_uid.empty() ? "uid-" + pod : spec.pod_uid;
  std::string jti = spec.jti.empty() ? "jti-" + std::to_string(next_jti_++) : spec.jti;
  JsonPtr c(json_object());
  json_object_set_new(c.get(), "iss",
                      json_string(spec.issuer ? spec.issuer->c_str() : issuer_.c_str()));
  json_object_set_new(
      c.get(), "sub",
      json_string(("system:serviceaccount:" + spec.sa_namespace + ":" + spec.sa_name).c_str()));
  json_t* aud = json_array();
  json_array_append_new(aud, json_string(spec.audience.c_str()));
  json_object_set_new(c.get(), "aud", aud);
  json_object_set_new(c.get(), "iat", json_integer(iat));
  json_object_set_new(c.get(), "nbf", json_integer(iat));
  json_object_set_new(c.get(), "exp", json_integer(iat + spec.lifetime.count()));
  json_object_set_new(c.get(), "jti", json_string(jti.c_str()));
  json_t* k = json_object();
  json_object_set_new(k, "namespace", json_string(spec.sa_namespace.c_str()));
  json_t* sa = json_object();
  json_object_set_new(sa, "name", json_string(spec.sa_name.c_str()));
  json_object_set_new(sa, "uid", json_string(("uid-sa-" + spec.sa_name).c_str()));
  json_object_set_new(k, "serviceaccount", sa);
  if (spec.pod_bound) {
    json_t* p = json_object();
    json_object_set_new(p, "name", json_string(pod.c_str()));
    json_object_set_new(p, "uid", json_string(pod_uid.c_str()));
    json_object_set_new(k, "pod", p);
    if (spec.node_claim && !spec.node.empty()) {
      json_t* n = json_object();
      json_object_set_new(n, "name", json_string(spec.node.c_str()));
      json_object_set_new(n, "uid", json_string(("uid-node-" + spec.node).c_str()));
      json_object_set_new(k, "node", n);
    }
  }
  json_object_set_new(c.get(), "kubernetes.io", k);
  std::string payload = dump(c.get());

  const Key& key = *keys_.back();
  cjose_err err{};
  cjose_header_t* hdr = cjose_header_new(&err);
  cjose_header_set(hdr, CJOSE_HDR_ALG, rsa_ ? CJOSE_HDR_ALG_RS256 : CJOSE_HDR_ALG_ES256, &err);
  std::string kid = spec.kid ? *spec.kid : key.kid;
  cjose_header_set(hdr, CJOSE_HDR_KID, kid.c_str(), &err);
  cjose_jws_t* jws = cjose_jws_sign(
      key.jwk.get(), hdr, reinterpret_cast<const uint8_t*>(payload.data()), payload.size(), &err);
  cjose_header_release(hdr);
  if (!jws) throw std::runtime_error("cjose: cannot sign");
  const char* ser = nullptr;
  cjose_jws_export(jws, &ser, &err);
  std::string out = ser ? ser : "";
  cjose_jws_release(jws);
  return out;
}

}  // namespace endpointd::fakeapi
