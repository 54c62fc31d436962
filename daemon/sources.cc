// The source of cluster state the configuration asks for.
#include "daemon/sources.h"

#include <cstdlib>

#include <spdlog/spdlog.h>

#include "watcher/kube_auth.h"

namespace endpointd::daemon {

std::set<model::ObjectKind> expected_kinds(const Config& cfg) {
  std::set<model::ObjectKind> k = {model::ObjectKind::kService, model::ObjectKind::kEndpointSlice,
                                   model::ObjectKind::kNode};
  // The API source watches this node's pods only when asked; a manifest directory lists
  // all of its kinds at once.
  if (!cfg.source_dir.empty() || (cfg.watch_pods && !cfg.node_name.empty()))
    k.insert(model::ObjectKind::kPod);
  return k;
}

Result<std::unique_ptr<watcher::Source>> make_source(const Config& cfg, watcher::Post post,
                                                     prometheus::Registry* registry) {
  if (!cfg.source_dir.empty())
    return watcher::make_manifest_source(cfg.source_dir, std::move(post), registry);
  Result<watcher::ClusterConfig> cluster = Error{""};
  if (!cfg.kubeconfig.empty()) {
    cluster = watcher::from_kubeconfig(cfg.kubeconfig);
  } else if (const char* host = std::getenv("KUBERNETES_SERVICE_HOST"); host && *host) {
    cluster = watcher::in_cluster();
  } else {
    return Error{"no source of cluster state: give --source-dir or --kubeconfig, or run in a pod"};
  }
  if (!cluster) return Error{cluster.error()};
  if (!registry) return Error{"internal: no metrics registry"};
  watcher::KubeClientConfig kc;
  kc.node_name = cfg.node_name;
  kc.watch_pods = cfg.watch_pods && !cfg.node_name.empty();
  // `pods verified` (CoreDNS's) answers a pod name only for a pod that exists, on any node.
  kc.pods_cluster_wide =
      kc.watch_pods && cfg.dns_listen && cfg.dns_pod_records == dns::PodMode::kVerified;
  // Every Node is watched: the drain's members are every node whose kernel may hold rules
  // (drain/members.h), whether or not its agent is in the agents' Service.
  kc.own_node_only = false;
  kc.page_size = cfg.list_page_size;
  kc.list_mode = cfg.api_list_mode;
  kc.protobuf_lists = cfg.kube_api_protobuf;
  kc.watch_timeout = cfg.watch_timeout;
  kc.watch_stall_timeout = cfg.watch_stall_timeout;
  return watcher::make_kube_source(std::move(*cluster), kc, std::move(post), *registry);
}

}  // namespace endpointd::daemon
