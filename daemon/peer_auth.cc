#include "daemon/peer_auth.h"

#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <simdjson.h>
#include <spdlog/spdlog.h>

#include <map>
#include <mutex>

#include "daemon/kube_request.h"
#include "drain/peer_identity.h"

namespace endpointd::daemon {

namespace {

Result<std::string> get(KubeRequester& api, const std::string& path) {
  auto r = api.request("GET", path, {}, std::chrono::seconds(5));
  if (!r) return Error{"GET " + path + ": " + r.error()};
  if (r->status != 200)
    return Error{"GET " + path + ": HTTP " + std::to_string(r->status) + " " +
                 r->body.substr(0, 200)};
  return std::move(r->body);
}

// The bound pod's node, for tokens without the node claim; cached by pod uid (a pod never
// moves), at most 4096 entries.
class PodNodes {
 public:
  explicit PodNodes(std::shared_ptr<KubeRequester> api) : api_(std::move(api)) {}
  Result<std::string> operator()(const std::string& ns, const std::string& name,
                                 const std::string& uid) {
    {
      std::lock_guard lock(mu_);
      auto it = cache_.find(uid);
      if (it != cache_.end()) return it->second;
    }
    auto body = get(*api_, "/api/v1/namespaces/" + ns + "/pods/" + name);
    if (!body) return Error{body.error()};
    simdjson::dom::parser p;
    simdjson::dom::element root;
    std::string_view node, got_uid;
    if (p.parse(*body).get(root) != simdjson::SUCCESS ||
        root["metadata"]["uid"].get(got_uid) != simdjson::SUCCESS)
      return Error{"the pod " + ns + "/" + name + " does not parse"};
    if (got_uid != uid)
      return Error{"the pod " + ns + "/" + name + " is another one now (uid " +
                   std::string(got_uid) + ")"};
    if (root["spec"]["nodeName"].get(node) != simdjson::SUCCESS || node.empty())
      return Error{"the pod " + ns + "/" + name + " is on no node"};
    std::lock_guard lock(mu_);
    if (cache_.size() >= 4096) cache_.clear();
    cache_[uid] = std::string(node);
    return std::string(node);
  }

 private:
  std::shared_ptr<KubeRequester> api_;
  std::mutex mu_;
  std::map<std::string, std::string> cache_;
};

}  // namespace

std::string peer_insecure_warning(const Config& cfg) {
  if (!cfg.drain_peer_insecure || !cfg.drain_peer_listen) return {};
  return "WARNING: the drain peer port is PLAINTEXT and UNAUTHENTICATED (--drain-peer-insecure): "
         "anyone who reaches it can speak for any node; agents with peer identity refuse it";
}

Status add_peer_identity(const Config& cfg, prometheus::Registry* registry,
                         drain::PeerTlsFiles* files) {
  if (registry) {
    prometheus::BuildGauge()
        .Name("endpointd_drain_peer_insecure")
        .Help(
            "1 while the peer port runs in plaintext without authentication "
            "(--drain-peer-insecure): any host that reaches it can speak for any node")
        .Register(*registry)
        .Add({})
        .Set(peer_insecure_warning(cfg).empty() ? 0 : 1);
  }
  if (cfg.drain_peer_token_file.empty() || !cfg.drain_peer_listen) return {};
  auto token = std::make_shared<drain::TokenFile>(cfg.drain_peer_token_file);
  auto own = token->token();
  if (!own) return Error{own.error()};
  auto claims = drain::read_unverified_claims(*own);
  if (!claims) return Error{"--drain-peer-token-file: " + claims.error()};
  if (claims->sa_namespace.empty() || claims->sa_name.empty())
    return Error{"--drain-peer-token-file: not a ServiceAccount token (no kubernetes.io claims)"};
  if (!claims->node_name.empty() && claims->node_name != cfg.node_name)
    return Error{"--drain-peer-token-file: the token names node " + claims->node_name +
                 ", this agent runs as " + cfg.node_name};
  auto cluster = cluster_config(cfg.kubeconfig);
  if (!cluster)
    return Error{"--drain-peer-token-file: the issuer's keys come from the API server: " +
                 cluster.error()};
  auto api = std::make_shared<KubeRequester>(std::move(*cluster));
  drain::VerifierOptions vo;
  // Peers run as this agent's ServiceAccount: the DaemonSet's.
  vo.sa_namespace = claims->sa_namespace;
  vo.sa_name = claims->sa_name;
  auto fetch = [api]() -> Result<drain::IssuerKeys> {
    auto disco = get(*api, "/.well-known/openid-configuration");
    if (!disco) return Error{disco.error()};
    simdjson::dom::parser p;
    simdjson::dom::element root;
    std::string_view issuer;
    if (p.parse(*disco).get(root) != simdjson::SUCCESS ||
        root["issuer"].get(issuer) != simdjson::SUCCESS || issuer.empty())
      return Error{"the OpenID discovery document names no issuer"};
    drain::IssuerKeys keys;
    keys.issuer = std::string(issuer);
    // The API server serves the keys itself, whatever jwks_uri says (an external issuer URL).
    auto jwks = get(*api, "/openid/v1/jwks");
    if (!jwks) return Error{jwks.error()};
    keys.jwks = std::move(*jwks);
    return keys;
  };
  auto pods = std::make_shared<PodNodes>(api);
  auto verifier = std::make_shared<drain::TokenVerifier>(
      vo, fetch,
      [pods](const std::string& ns, const std::string& name, const std::string& uid) {
        return (*pods)(ns, name, uid);
      },
      drain::TokenVerifier::Now{}, registry);
  if (auto st = verifier->refresh_keys(); !st)
    spdlog::warn("drain: peer identity: {} yet; peers are refused until they can be", st.error());
  else
    spdlog::info("drain: peer identity by ServiceAccount token ({} {}/{}), {} issuer keys",
                 cfg.drain_peer_token_file, vo.sa_namespace, vo.sa_name, verifier->key_count());
  files->token = std::move(token);
  files->verifier = std::move(verifier);
  return {};
}

}  // namespace endpointd::daemon
