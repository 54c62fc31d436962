// The peer port's plan for a manifest directory (daemon/peer_plan.h).
#include "daemon/peer_plan.h"

#include <algorithm>

#include "pipeline/store.h"
#include "watcher/manifest_source.h"

namespace endpointd::daemon {

bool peer_plan_needs_nodes(const Config& cfg) {
  return !cfg.source_dir.empty() && cfg.drain_peer_listen.has_value() && !cfg.drain_peer_insecure &&
         cfg.drain_peer_ca.empty() && cfg.drain_peer_cert.empty() && cfg.drain_peer_key.empty();
}

Result<PeerPlan> plan_peers(const Config& cfg, const std::vector<std::string>& nodes) {
  PeerPlan plan;
  if (!peer_plan_needs_nodes(cfg)) return plan;
  std::vector<std::string> others;
  for (const auto& n : nodes)
    if (n != cfg.node_name) others.push_back(n);
  if (others.empty()) {
    plan.listen = false;
    plan.note = "drain: the manifests in " + cfg.source_dir + " name no node but " + cfg.node_name +
                ": no peer to confirm removals with, so no peer port (a node added to them "
                "later is not confirmed by this agent until it is restarted with peer TLS)";
    return plan;
  }
  std::string named, all = cfg.node_name;
  for (size_t i = 0; i < others.size(); ++i) {
    if (i < 5) named += (i ? ", " : "") + others[i];
    if (i < 5) all += " " + others[i];
  }
  if (others.size() > 5) {
    named += " and " + std::to_string(others.size() - 5) + " more";
    all += " ...";
  }
  const std::string& me = cfg.node_name;
  return Error{"drain: the manifests in " + cfg.source_dir + " name other nodes (" + named +
               "), whose agents confirm removals to this one over the peer port, and peer "
               "traffic is mutual TLS. Make a CA and a certificate per node with "
               "`scripts/peer-certs --dir PKI " +
               all + "` and pass --drain-peer-ca PKI/ca.crt --drain-peer-cert PKI/" + me +
               ".crt --drain-peer-key PKI/" + me +
               ".key (or --drain-peer-insecure for a plaintext peer port without authentication: "
               "tests only)"};
}

std::vector<std::string> manifest_node_names(const std::string& dir) {
  pipeline::Store store({model::ObjectKind::kNode});
  watcher::ManifestSource src(
      dir, [&](model::Event ev) { store.apply(std::move(ev)); }, nullptr);
  src.rescan();
  auto snap = store.build(nullptr);
  std::vector<std::string> names;
  for (const auto& n : snap->nodes) names.push_back(n->name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace endpointd::daemon
