#include "daemon/health.h"

#include "model/json.h"
#include "model/time.h"

namespace endpointd::daemon {

namespace {

Probe answer(const HealthInputs& in, const std::string& reason, const bool* eligible) {
  Probe p;
  p.ok = reason.empty();
  p.detail = p.ok ? "ok" : reason;
  // kube-proxy's bytes exactly (Go's time.String(), its spacing), so that what reads them
  // keeps working; "reason" is endpointd's.
  p.json = "{\"lastUpdated\": " +
           model::json_string(in.last_updated == std::chrono::system_clock::time_point{}
                                  ? "0001-01-01 00:00:00 +0000 UTC"
                                  : model::go_time_string(in.last_updated)) +
           ",\"currentTime\": " + model::json_string(model::go_time_string(in.now));
  if (eligible) p.json += std::string(", \"nodeEligible\": ") + (*eligible ? "true" : "false");
  if (!p.ok) p.json += ", \"reason\": " + model::json_string(reason);
  p.json += "}\n";
  return p;
}

constexpr const char* kBehind =
    "the nftables dataplane has an update queued that was not applied in time";

}  // namespace

Probe healthz_probe(const HealthInputs& in) {
  std::string reason;
  bool eligible = !in.node || in.node->eligible();
  if (!eligible)
    reason =
        "node " + in.node->name +
        (in.node->deleting ? " is being deleted" : " is tainted ToBeDeletedByClusterAutoscaler");
  if (in.dataplane_behind) reason = kBehind;
  return answer(in, reason, &eligible);
}

Probe livez_probe(const HealthInputs& in) {
  std::string reason;
  if (in.dataplane_behind) reason = kBehind;
  if (in.waited > in.livez_timeout)
    reason = "an update has waited " +
             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(in.waited).count()) +
             " s in " + in.waiting_in + " (bound " + std::to_string(in.livez_timeout.count()) +
             " s): the agent is stuck";
  return answer(in, reason, nullptr);
}

}  // namespace endpointd::daemon
