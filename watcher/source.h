// A source of cluster state: something that lists and watches Services, EndpointSlices, Nodes
// and Pods and posts them as events to the update loop. Two exist: a manifest directory and the
// Kubernetes API; the daemon picks one from its configuration.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "watcher/kube_client.h"

namespace prometheus {
class Registry;
}

namespace endpointd::watcher {

// An object the source could not take, and where it came from (a file, for a directory).
struct SourceError {
  std::string where;
  std::string reason;
};

class Source {
 public:
  virtual ~Source() = default;
  virtual Status start() = 0;
  virtual void stop() = 0;
  virtual std::string describe() const = 0;
  virtual std::vector<SourceError> errors() const = 0;
};

using Post = std::function<void(model::Event)>;

// A directory of manifests, re-read when it changes.
std::unique_ptr<Source> make_manifest_source(const std::string& dir, Post post,
                                             prometheus::Registry* registry);
// The Kubernetes API (list and watch).
std::unique_ptr<Source> make_kube_source(ClusterConfig cluster, KubeClientConfig config, Post post,
                                         prometheus::Registry& registry);

}  // namespace endpointd::watcher
