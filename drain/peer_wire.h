// A peer's wire messages (Peer.Exchange, proto/endpointd/v1/drain.proto) and the Aggregator's
// reports (drain/aggregate.h), both ways. Internal to drain/: the cluster's streams use it.
#pragma once

#include <string>

#include "drain/aggregate.h"
#include "endpointd/v1/drain.pb.h"
#include "model/result.h"

namespace endpointd::drain {

// A received message as the Aggregator takes it: names checked, lists bounded; an error names
// what was wrong.
Result<Message> from_wire(const v1::PeerMessage& m);
// A report as it goes on the wire.
v1::PeerMessage to_wire(const Message& m);
// The node a message names as its sender (an up or a down report's `from`).
const std::string& sender(const v1::PeerMessage& m);

}  // namespace endpointd::drain
