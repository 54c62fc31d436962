// What peer identity costs (bench/results/drain-scale.md): the CPU of verifying one peer's
// token (once per Peer.Exchange stream: a connection's first call), ES256 and RS256, keys
// cached; and the API server's side of N agents restarting: each agent's verifier set up as the
// daemon sets it up (daemon/peer_auth.cc: discovery, then the JWKS, over HTTP to the fake API
// server), then every agent verifying its tree neighbours' tokens, then the issuer rotating its
// key, then the API failing while tokens of an unknown key keep coming: the requests the fake
// counted at each step.
//
//   peer_identity_bench [--agents=5000] [benchmark flags]
#include <benchmark/benchmark.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "daemon/peer_auth.h"
#include "drain/peer_identity.h"
#include "tests/fakeapi/fake_api.h"
#include "tests/fakeapi/token_issuer.h"

namespace {

using endpointd::drain::IssuerKeys;
using endpointd::drain::TokenVerifier;
using endpointd::drain::VerifiedPeer;
using endpointd::drain::VerifierOptions;
using endpointd::fakeapi::TokenIssuer;
using endpointd::fakeapi::TokenSpec;

void verify_bench(benchmark::State& state, bool rsa) {
  TokenIssuer issuer("https://kubernetes.default.svc.cluster.local", rsa);
  VerifierOptions o;
  o.sa_namespace = "kube-system";
  o.sa_name = "endpointd";
  TokenVerifier v(o, [&]() -> endpointd::Result<IssuerKeys> {
    return IssuerKeys{issuer.issuer(), issuer.jwks()};
  });
  std::vector<std::string> tokens;
  for (int i = 0; i < 256; ++i) {
    TokenSpec s;
    s.node = "node-" + std::to_string(i);
    tokens.push_back(issuer.mint(s));
  }
  size_t i = 0, bad = 0;
  for (auto _ : state) {
    auto r = v.verify(tokens[i++ % tokens.size()]);
    bad += !std::holds_alternative<VerifiedPeer>(r);
  }
  if (bad) state.SkipWithError("a token was refused");
  state.SetItemsProcessed(state.iterations());
}

void BM_VerifyES256(benchmark::State& state) {
  verify_bench(state, false);
}
void BM_VerifyRS256(benchmark::State& state) {
  verify_bench(state, true);
}
BENCHMARK(BM_VerifyES256);
BENCHMARK(BM_VerifyRS256);

size_t key_requests(const endpointd::fakeapi::FakeApiServer& api) {
  size_t n = 0;
  for (const auto& r : api.requests())
    n += r.path == "/.well-known/openid-configuration" || r.path == "/openid/v1/jwks";
  return n;
}

// N agents restarting against one API server.
void restart_storm(int agents) {
  endpointd::fakeapi::FakeApiServer api;
  if (!api.ok()) {
    std::fprintf(stderr, "fake API: %s\n", api.error().c_str());
    return;
  }
  std::string kubeconfig = api.write_kubeconfig();
  std::string token_path = kubeconfig + ".token";
  TokenSpec own;
  own.node = "node-0";
  std::ofstream(token_path) << api.token_issuer().mint(own);
  std::vector<std::string> tokens;
  for (int i = 0; i < agents; ++i) {
    TokenSpec s;
    s.node = "node-" + std::to_string(i);
    tokens.push_back(api.token_issuer().mint(s));
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<TokenVerifier>> verifiers;
  for (int i = 0; i < agents; ++i) {
    endpointd::daemon::Config cfg;
    cfg.node_name = "node-0";
    cfg.kubeconfig = kubeconfig;
    cfg.drain_peer_token_file = token_path;
    endpointd::drain::PeerTlsFiles files;
    auto st = endpointd::daemon::add_peer_identity(cfg, nullptr, &files);
    if (!st) {
      std::fprintf(stderr, "agent %d: %s\n", i, st.error().c_str());
      return;
    }
    verifiers.push_back(files.verifier);
  }
  double start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t at_start = key_requests(api);
  // Every agent verifies its tree neighbours (fan-in 8: a parent, up to 8 children, the ring).
  size_t refused = 0;
  for (int i = 0; i < agents; ++i)
    for (int k = 1; k <= 10; ++k)
      refused +=
          !std::holds_alternative<VerifiedPeer>(verifiers[i]->verify(tokens[(i + k) % agents]));
  size_t after_verify = key_requests(api);
  // The issuer rotates its key: the first token of the new key at each agent fetches again.
  api.token_issuer().rotate(false);
  TokenSpec s;
  s.node = "node-1";
  std::string fresh = api.token_issuer().mint(s);
  for (auto& v : verifiers) refused += !std::holds_alternative<VerifiedPeer>(v->verify(fresh));
  size_t after_rotation = key_requests(api);
  // A key id nobody publishes, 100 times per agent: at most one fetch per agent per 10 s.
  s.kid = "forged";
  std::string forged = api.token_issuer().mint(s);
  for (auto& v : verifiers)
    for (int k = 0; k < 100; ++k) v->verify(forged);
  size_t after_forged = key_requests(api);
  std::printf(
      "restart of %d agents: %zu key requests at start (%.2f per agent; %.1f s for all, one "
      "after another), %zu more for %d verifications, %zu more after a key rotation, %zu more "
      "for 100 tokens of an unknown key per agent; %zu refused (want 0)\n",
      agents, at_start, static_cast<double>(at_start) / agents, start_s, after_verify - at_start,
      agents * 10, after_rotation - after_verify, after_forged - after_rotation, refused);
  unlink(token_path.c_str());
  unlink(kubeconfig.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int agents = 5000;
  spdlog::set_level(spdlog::level::err);  // one line per agent's start otherwise
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--agents=", 9) == 0)
      agents = std::atoi(argv[i] + 9);
    else
      rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  if (agents > 0) restart_storm(agents);
  return 0;
}
