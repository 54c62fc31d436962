// Whether an agent on a manifest directory needs its drain peer port. Peers confirm removals
// for their own nodes, over mutual TLS; a directory whose Nodes name no node but this one has
// no peer to talk to, so the agent starts without the port (and without certificates), and one
// that names others gets an error that says exactly what to pass.
#pragma once

#include <string>
#include <vector>

#include "daemon/config.h"
#include "model/result.h"

namespace endpointd::daemon {

struct PeerPlan {
  bool listen = true;  // false: start without the peer port
  std::string note;    // with listen false: the one log line that says so
};

// `nodes`: the Node names the manifests hold. Applies only to a manifest directory with the peer
// port on and neither peer TLS files nor --drain-peer-insecure given; otherwise listen stays as
// configured.
Result<PeerPlan> plan_peers(const Config& cfg, const std::vector<std::string>& nodes);

// Whether plan_peers needs the directory's Node names (so they are read only then).
bool peer_plan_needs_nodes(const Config& cfg);

// The Node names in a manifest directory, read once (sorted).
std::vector<std::string> manifest_node_names(const std::string& dir);

}  // namespace endpointd::daemon
