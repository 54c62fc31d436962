// Choosing the source of cluster state from the configuration: a manifest directory, or the
// Kubernetes API (kubeconfig or in-cluster).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "daemon/state_json.h"
#include "model/event.h"

namespace prometheus {
class Registry;
}

namespace endpointd::daemon {

class Source {
 public:
  virtual ~Source() = default;
  virtual bool start(std::string* error) = 0;
  virtual void stop() = 0;
  virtual std::string describe() const = 0;
  virtual std::vector<SourceError> errors() const = 0;
};

std::set<model::ObjectKind> expected_kinds(const Config& cfg);
std::unique_ptr<Source> make_source(const Config& cfg, std::function<void(model::Event)> post,
                                    prometheus::Registry* registry, std::string* error);

}  // namespace endpointd::daemon
