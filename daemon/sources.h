// Choosing the source of cluster state from the configuration: a manifest directory, or the
// Kubernetes API (kubeconfig or in-cluster).
#pragma once

#include <memory>
#include <set>

#include "daemon/config.h"
#include "model/event.h"
#include "model/result.h"
#include "watcher/source.h"

namespace prometheus {
class Registry;
}

namespace endpointd::daemon {

std::set<model::ObjectKind> expected_kinds(const Config& cfg);
Result<std::unique_ptr<watcher::Source>> make_source(const Config& cfg, watcher::Post post,
                                                     prometheus::Registry* registry);

}  // namespace endpointd::daemon
