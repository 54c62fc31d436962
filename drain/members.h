// Who confirms a removal: every node whose kernel may hold endpointd's rules — every Node in
// the Node list, whether its agent runs or not (an agent that stops leaves its rules in place;
// a node whose agent is absent, restarting or silent is unknown, never confirmed). Its agent is
// reached at the Node's first InternalIP, or (--drain-members-service) at its endpoint in the
// agents' own headless Service (hostNetwork pods: the node's address, but the Service says
// which nodes run an agent now and at which address it listens).
//
// Every agent therefore watches every Node. The API server sends each of them every Node
// write: at 5,000 nodes about 17 writes a second (the kubelet's status every 5 minutes; its
// heartbeats go to Leases, which are not watched) fanned out to 5,000 watchers
// (bench/results/drain-scale.md). Membership from the agents' Service alone was cheaper but
// not true: a node whose agent left the Service still routes by the rules it left.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

#include "model/ip.h"
#include "model/objects.h"
#include "model/snapshot.h"

namespace endpointd::drain {

// Node name → where its agent is reached (nullopt: a Node without an InternalIP, which can
// take no part).
using Members = std::map<std::string, std::optional<model::IpAddr>>;

// Every Node at its first InternalIP; with `service`, a node with an endpoint of that Service
// is reached at that endpoint's address (its lowest IPv4, else lowest IPv6), and a node named
// only by the Service (its Node not listed yet) is a member too. With `service` and `agents`
// (the nodes ever seen in that Service by this agent), a Node that never ran an agent is left
// out (a node the DaemonSet does not schedule to holds no endpointd rules); one that did stays
// a member while its Node exists, whether its agent is in the Service now or not.
Members members_of(const model::Snapshot& snap, const std::optional<model::ServiceKey>& service,
                   const std::set<std::string>* agents = nullptr);

}  // namespace endpointd::drain
