// /debug/state: the newest snapshot, each sink's applied generation, drains and source
// errors, as JSON for people and tests.
#pragma once

#include <string>
#include <vector>

#include "model/snapshot.h"
#include "pipeline/ack_board.h"
#include "watcher/source.h"

namespace endpointd::daemon {

struct DebugState {
  model::SnapshotPtr snapshot;
  std::string node_name;
  std::vector<pipeline::AckBoard::Entry> sinks;
  std::vector<watcher::SourceError> source_errors;
  std::string drains_json = "[]";           // filled by drain/ once it runs
  std::string drain_cluster_json = "null";  // the cluster watermark as this agent sees it
};

std::string to_json(const DebugState& st);

}  // namespace endpointd::daemon
