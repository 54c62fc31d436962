// The two sources of cluster state behind watcher::Source.
#include "watcher/source.h"

#include "watcher/manifest_source.h"

namespace endpointd::watcher {

namespace {

class ManifestDirSource : public Source {
 public:
  ManifestDirSource(const std::string& dir, Post post, prometheus::Registry* registry)
      : dir_(dir), src_(dir, std::move(post), registry) {}
  Status start() override { return src_.start(); }
  void stop() override { src_.stop(); }
  std::string describe() const override { return "manifest directory " + dir_; }
  std::vector<SourceError> errors() const override {
    std::vector<SourceError> out;
    for (const auto& e : src_.errors()) out.push_back({e.file, e.reason});
    return out;
  }

 private:
  std::string dir_;
  ManifestSource src_;
};

class KubeApiSource : public Source {
 public:
  KubeApiSource(ClusterConfig cluster, KubeClientConfig kc, Post post,
                prometheus::Registry& registry)
      : server_(cluster.server),
        client_(std::move(cluster), std::move(kc), std::move(post), registry) {}
  Status start() override {
    client_.start();
    return {};
  }
  void stop() override { client_.stop(); }
  std::string describe() const override { return "Kubernetes API at " + server_; }
  // Malformed API objects are logged and counted (endpointd_decode_errors_total) as they
  // arrive; the API has no file to point at.
  std::vector<SourceError> errors() const override { return {}; }

 private:
  std::string server_;
  KubeClient client_;
};

}  // namespace

std::unique_ptr<Source> make_manifest_source(const std::string& dir, Post post,
                                             prometheus::Registry* registry) {
  return std::make_unique<ManifestDirSource>(dir, std::move(post), registry);
}

std::unique_ptr<Source> make_kube_source(ClusterConfig cluster, KubeClientConfig config, Post post,
                                         prometheus::Registry& registry) {
  return std::make_unique<KubeApiSource>(std::move(cluster), std::move(config), std::move(post),
                                         registry);
}

}  // namespace endpointd::watcher
