// Between the late watch (late.h) and the drain machine (machine.h), which late.h cannot
// include (machine.h reaches it through flows.h): what the coordinator's pass — and the
// simulation's model of it — hands from one to the other.
#pragma once

#include <map>
#include <vector>

#include "drain/late.h"
#include "drain/machine.h"

namespace endpointd::drain {

// The drains a LateWatch follows, as Pods: every one with a pod UID but a shared (hostNetwork)
// address's — its address is its node's, every connection to the node would count.
std::vector<LateWatch::Pod> late_watch_pods(const std::map<DrainKey, Drain>& drains);
// Each drain's late senders before its release, for Machine::Inputs::late.
std::map<DrainKey, Machine::Inputs::Late> late_inputs(const LateWatch& watch,
                                                      const std::map<DrainKey, Drain>& drains);

}  // namespace endpointd::drain
