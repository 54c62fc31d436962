// Who confirms a removal: one agent per node, and the address it listens at.
//
// From the Node list (the default): every Node, at its first InternalIP. Every agent then
// watches every Node, and the API server sends each of them every Node status write: at 5,000
// nodes ~17 writes a second fanned out to 5,000 watchers (bench/results/drain-scale.md).
//
// From the agents' own Service (--drain-members-service): a Service selecting the endpointd
// DaemonSet's pods, which run in the host network, so each endpoint's address is its node's.
// The agent already watches every EndpointSlice for the dataplane, so this costs no watch of
// its own; its slices change only when an agent pod comes, goes or changes readiness, and the
// agent then watches only its own Node. Every endpoint counts, ready or not, terminating or
// not: an agent starting up or shutting down is still a node whose kernel holds rules.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "model/ip.h"
#include "model/objects.h"
#include "model/snapshot.h"

namespace endpointd::drain {

// Node name → where its agent is reached (nullopt: a Node without an InternalIP, which can
// take no part).
using Members = std::map<std::string, std::optional<model::IpAddr>>;

// `service` empty: the Node list. Otherwise the nodes of that Service's endpoints, each at
// its lowest IPv4 address, else its lowest IPv6 one; endpoints without a node are not members.
Members members_of(const model::Snapshot& snap, const std::optional<model::ServiceKey>& service);

}  // namespace endpointd::drain
