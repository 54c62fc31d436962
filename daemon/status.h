// `endpointd status`: one screen for a person on a node, read from the agent's admin API
// (/debug/state on --admin-listen): the source and its sync, each sink's generation and lag,
// feed subscribers, peers, drains in flight and the last releases.
//
// Reading and drawing are apart: parse_status() turns the JSON into a StatusView (and refuses
// what is not endpointd, or a state schema this client does not know), render_status() draws
// it; both are pure, so a captured state is drawn the same way in a test.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "model/result.h"

namespace CLI {
class App;
}

namespace endpointd::daemon {

struct StatusView {
  std::string version;
  int schema = 0;
  std::string node;
  std::string source;
  uint64_t generation = 0;
  bool synced = false;
  uint64_t services = 0, endpoints = 0, nodes = 0;

  struct Sink {
    std::string name;
    uint64_t applied = 0;
    std::optional<double> seconds_ago;
  };
  std::vector<Sink> sinks;

  struct Subscriber {
    std::string client, api, peer;
    uint64_t sent = 0, acked = 0, acked_generation = 0, nacks = 0;
    std::string last_nack, lapsed;
    bool connected = true, holding = true;
  };
  std::optional<std::vector<Subscriber>> feed;  // nullopt: the feed is off

  struct Cluster {
    uint64_t local = 0, cluster = 0, dns = 0;
    bool coverage_current = false;
    uint64_t members = 0, holdouts = 0;
    bool member = false;
    std::string root;
    std::optional<std::string> parent;
    std::vector<std::string> children, excluded, suspects, incoming, outgoing, departed;
  };
  std::optional<Cluster> cluster;  // nullopt: no cluster watermark (per-endpoint protocol)

  struct Peer {
    std::string node, state, error;
  };
  struct Unconfirmed {
    std::string node, consumer, reason;
  };
  struct Drain {
    std::string pod, address, stage, release_after;
    int64_t start_unix_ms = 0;
    std::map<std::string, int64_t> timeline_ms;       // stage → ms after the start
    std::map<std::string, int64_t> timeline_unix_ms;  // stage → wall clock
    uint64_t revision = 0;
    std::vector<Peer> peers;
    std::optional<uint64_t> live_flows;
    std::string outcome;  // empty until released
    std::vector<Unconfirmed> unconfirmed;
    // New connections that reached it after its release, within the watch's window
    // (drains[].late.after_release): who the application's errors came from.
    uint64_t late_after_release = 0;
    std::string late_after_release_from;  // "pod ingress/nginx-1 on node-c (10.244.2.7): 12, …"
  };
  std::vector<Drain> drains;

  struct SourceError {
    std::string where, reason;
  };
  std::vector<SourceError> source_errors;
};

// The schema versions this client reads.
inline constexpr int kStatusMinSchema = 1, kStatusMaxSchema = 1;

// Decodes /debug/state. An error says what answered instead of endpointd, or that the agent's
// state schema is one this client does not read (and what to do).
Result<StatusView> parse_status(std::string_view json);

struct RenderOptions {
  bool colour = false;
  int64_t now_unix_ms = 0;  // for "time left" and "ago"
  std::string admin;        // where the state was read, for the heading
  size_t releases = 10;     // how many of the last releases to list
};
std::string render_status(const StatusView& v, const RenderOptions& o);

struct StatusFlags {
  std::string admin = "127.0.0.1:10249";
  std::string token_file;
  std::string output = "text";
  bool watch = false;
  double interval = 2.0;
  double timeout = 5.0;
};
void add_status_flags(CLI::App& cmd, StatusFlags& flags);
// Exit status: 0 shown; 2 nothing endpointd answered (refused, not endpointd, other schema,
// bad token), with the reason on `err`.
int run_status(const StatusFlags& flags, std::ostream& out, std::ostream& err);

}  // namespace endpointd::daemon
