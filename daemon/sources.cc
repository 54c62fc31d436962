// Source adapters over the watcher's manifest directory and Kubernetes API client.
#include "daemon/sources.h"

#include <cstdlib>

#include <spdlog/spdlog.h>

#include "watcher/kube_client.h"
#include "watcher/manifest_source.h"

namespace endpointd::daemon {

namespace {

class ManifestDirSource : public Source {
 public:
  ManifestDirSource(const std::string& dir, std::function<void(model::Event)> post,
                    prometheus::Registry* registry)
      : dir_(dir), src_(dir, std::move(post), registry) {}
  bool start(std::string* error) override { return src_.start(error); }
  void stop() override { src_.stop(); }
  std::string describe() const override { return "manifest directory " + dir_; }
  std::vector<SourceError> errors() const override {
    std::vector<SourceError> out;
    for (const auto& e : src_.errors()) out.push_back({e.file, e.reason});
    return out;
  }

 private:
  std::string dir_;
  watcher::ManifestSource src_;
};

class KubeApiSource : public Source {
 public:
  KubeApiSource(watcher::ClusterConfig cluster, watcher::KubeClientConfig kc,
                std::function<void(model::Event)> post, prometheus::Registry& registry)
      : server_(cluster.server),
        client_(std::move(cluster), std::move(kc), std::move(post), registry) {}
  bool start(std::string*) override {
    client_.start();
    return true;
  }
  void stop() override { client_.stop(); }
  std::string describe() const override { return "Kubernetes API at " + server_; }
  // Malformed API objects are logged and counted (endpointd_decode_errors_total) as they
  // arrive; the API has no file to point at.
  std::vector<SourceError> errors() const override { return {}; }

 private:
  std::string server_;
  watcher::KubeClient client_;
};

}  // namespace

std::set<model::ObjectKind> expected_kinds(const Config& cfg) {
  std::set<model::ObjectKind> k = {model::ObjectKind::kService, model::ObjectKind::kEndpointSlice,
                                   model::ObjectKind::kNode};
  // The API source watches this node's pods only when asked; a manifest directory lists
  // all of its kinds at once.
  if (!cfg.source_dir.empty() || (cfg.watch_pods && !cfg.node_name.empty()))
    k.insert(model::ObjectKind::kPod);
  return k;
}

std::unique_ptr<Source> make_source(const Config& cfg, std::function<void(model::Event)> post,
                                    prometheus::Registry* registry, std::string* error) {
  if (!cfg.source_dir.empty())
    return std::make_unique<ManifestDirSource>(cfg.source_dir, std::move(post), registry);
  Result<watcher::ClusterConfig> cluster = Error{""};
  if (!cfg.kubeconfig.empty()) {
    cluster = watcher::from_kubeconfig(cfg.kubeconfig);
  } else if (const char* host = std::getenv("KUBERNETES_SERVICE_HOST"); host && *host) {
    cluster = watcher::in_cluster();
  } else {
    if (error)
      *error = "no source of cluster state: give --source-dir or --kubeconfig, or run in a pod";
    return nullptr;
  }
  if (!cluster) {
    if (error) *error = cluster.error();
    return nullptr;
  }
  if (!registry) {
    if (error) *error = "internal: no metrics registry";
    return nullptr;
  }
  watcher::KubeClientConfig kc;
  kc.node_name = cfg.node_name;
  kc.watch_pods = cfg.watch_pods && !cfg.node_name.empty();
  kc.page_size = static_cast<size_t>(cfg.list_page_size);
  kc.watch_timeout = std::chrono::seconds(cfg.watch_timeout_seconds);
  return std::make_unique<KubeApiSource>(std::move(*cluster), kc, std::move(post), *registry);
}

}  // namespace endpointd::daemon
