// kube-proxy's /healthz and /livez, decided from what the daemon knows: this node's Node
// object, whether the dataplane keeps up, how long the oldest update has waited. Pure.
#pragma once

#include <chrono>
#include <string>

#include "daemon/admin.h"
#include "model/objects.h"

namespace endpointd::daemon {

struct HealthInputs {
  std::chrono::system_clock::time_point now;
  // When the dataplane last applied an update (zero: never), for the body.
  std::chrono::system_clock::time_point last_updated;
  const model::Node* node = nullptr;  // this node's Node object, when the snapshot has it
  bool dataplane_behind = false;      // an update queued for the kernel past its bound
  // The oldest update still waiting (update loop or a sink) and where; /livez only.
  std::string waiting_in;
  std::chrono::steady_clock::duration waited{};
  std::chrono::seconds livez_timeout{60};
};

// 200 while the dataplane keeps up and the node is eligible (not being deleted, not tainted
// ToBeDeletedByClusterAutoscaler: load balancers then drain it, KEP-3836); else 503. Body:
// {"lastUpdated": "...","currentTime": "...", "nodeEligible": true}, plus "reason" on 503.
Probe healthz_probe(const HealthInputs& in);
// 200 unless the dataplane is behind or an update has waited longer than livez_timeout (the
// agent is stuck and should be restarted). Node eligibility does not matter here.
Probe livez_probe(const HealthInputs& in);

}  // namespace endpointd::daemon
