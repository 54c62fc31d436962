// Whether a consumer's applied state still selects an endpoint for new connections: the
// question stage 2 (remove-endpoint) asks of every consumer on the acknowledgement board.
#pragma once

#include <string_view>

#include "model/snapshot.h"

namespace endpointd::drain {

// True when `snap`, as consumer `consumer` turns it into routing state, can choose `ip` for a
// new connection:
//  - "proxy" (and any consumer not named below): the nftables planner's rule. A ready,
//    non-terminating endpoint is chosen; a serving+terminating one is chosen as a last resort
//    when the service port has no ready endpoint of its family (kube-proxy's terminating
//    fallback); publishNotReadyAddresses chooses the rest. Headless and ExternalName services
//    have no rules.
//  - "feed": the same rule over every service (a proxy in panic mode routes to DRAINING hosts
//    when no healthy one is left, so the fallback counts as routable).
//  - "dns": the endpoint is an answer of a headless service (terminating ones leave at
//    once). The TTL of answers already given is the caller's business (last_answer_expiry).
// An unsynced snapshot is treated as selecting everything: it may be missing what it shows.
bool selectable(std::string_view consumer, const model::Snapshot& snap, const model::IpAddr& ip);

// The same for one service (exposed for tests).
bool selectable_in(std::string_view consumer, const model::ServiceState& st,
                   const model::IpAddr& ip);

}  // namespace endpointd::drain
