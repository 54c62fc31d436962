// /debug/state: the newest snapshot, each sink's applied generation, drains and source
// errors, as JSON for people and tests.
//
// Like Envoy's config_dump, it answers a summary unless asked for more: at 10k services the
// full state is tens of MB, and whoever polls it should not make the agent build that.
//   /debug/state                          generation, counts, sinks, feed subscribers,
//                                         drains, drain cluster, errors
//   /debug/state?section=services,nodes   those sections in full (any of kSections, or "all")
//   /debug/state?service=ns/name          that service only (with its endpoints)
// The output is written in pieces of about 64 KiB as it is made, never whole in memory.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "model/result.h"

#include "feed/hub.h"
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
  std::string source;                       // Source::describe(): what cluster state is read from
  // The feed's subscribers and ghosts (nullopt: the feed is off).
  std::optional<std::vector<feed::SubscriberInfo>> feed_subscribers;
};

// The top-level "stateSchema": raised when a field that `endpointd status` reads changes its
// meaning or goes away (adding one does not), so an older or newer client can say so.
inline constexpr int kStateSchema = 1;

inline constexpr const char* kSections[] = {"services",     "nodes",        "sinks", "drains",
                                            "drainCluster", "sourceErrors", "feed"};

struct StateQuery {
  std::set<std::string> sections;  // those of kSections to write
  std::string service;             // "ns/name": only this service (section services implied)
};
// The summary's sections: everything but the per-service and per-node lists.
StateQuery summary_query();
// From the query parameters `section` (comma-separated; "all") and `service`; an unknown
// section or a service that is not ns/name is an error naming it.
Result<StateQuery> parse_state_query(std::string_view section, std::string_view service);

// Writes the JSON object in pieces; stops early once `out` returns false (the reader left).
void write_json(const DebugState& st, const StateQuery& q,
                const std::function<bool(std::string_view)>& out);
// Every section, as one string (tests and small states).
std::string to_json(const DebugState& st);

}  // namespace endpointd::daemon
