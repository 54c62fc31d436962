// A sink applies snapshots to one kind of consumer (the kernel's rules, the DNS zone, the
// feed's subscribers) on its own thread, and reports to the AckBoard when a generation is
// what its consumers see.
#pragma once

#include <string>

#include "model/snapshot.h"

namespace endpointd::pipeline {

class Sink {
 public:
  virtual ~Sink() = default;
  virtual std::string name() const = 0;
  // Called on the sink's own thread, one call at a time. `delta` is what changed between the
  // snapshot this sink was last given and `snap`: when the sink falls behind, several deltas
  // are coalesced into one and it gets the newest snapshot.
  virtual void apply(const model::SnapshotPtr& snap, const model::Delta& delta) = 0;
};

}  // namespace endpointd::pipeline
