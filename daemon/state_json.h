// /debug/state: the newest snapshot, each sink's applied generation, drains and source
// errors, as JSON for people and tests.
#pragma once

#include <string>
#include <vector>

#include "model/snapshot.h"
#include "pipeline/ack_board.h"

namespace endpointd::daemon {

struct SourceError {
  std::string where;
  std::string reason;
};

struct DebugState {
  model::SnapshotPtr snapshot;
  std::string node_name;
  std::vector<pipeline::AckBoard::Entry> sinks;
  std::vector<SourceError> source_errors;
  std::string drains_json = "[]";  // filled by drain/ once it runs
};

std::string to_json(const DebugState& st);

}  // namespace endpointd::daemon
