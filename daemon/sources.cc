// Source adapters over the watcher's manifest directory and Kubernetes API client.
#include "daemon/sources.h"

#include <cstdlib>

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

}  // namespace

std::set<model::ObjectKind> expected_kinds(const Config& cfg) {
  std::set<model::ObjectKind> k = {model::ObjectKind::kService, model::ObjectKind::kEndpointSlice,
                                   model::ObjectKind::kNode};
  if (cfg.watch_pods || !cfg.source_dir.empty()) k.insert(model::ObjectKind::kPod);
  return k;
}

std::unique_ptr<Source> make_source(const Config& cfg, std::function<void(model::Event)> post,
                                    prometheus::Registry* registry, std::string* error) {
  if (!cfg.source_dir.empty())
    return std::make_unique<ManifestDirSource>(cfg.source_dir, std::move(post), registry);
  if (error)
    *error = "no source of cluster state: give --source-dir, or --kubeconfig, or run in a cluster";
  return nullptr;
}

}  // namespace endpointd::daemon
