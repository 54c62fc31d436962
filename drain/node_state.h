// What a node keeps for drains across its agent's restarts (--drain-state-file): the nodes it
// has seen run an agent, so that a restart cannot shrink the set of nodes a drain waits for,
// and the DNS TTLs its answers may still be cached under, so that a TTL lowered across a
// restart still waits out the answers the last process gave (DESIGN.md, "Membership outlives
// any one process").
//
// The file, rewritten whole and atomically (a temporary file renamed over it):
//   endpointd-drain-state 1
//   agent <node name>                      one line per node seen running an agent
//   member <node name> <address|->         the members the last process waited for
//   dns-ttl <seconds> <until, unix ms>     answers with this TTL may be cached until then
//   dns-ttl <seconds> running              the TTL of the process that wrote the file
// A file that is missing is an empty state; one that is unreadable, over 4 MiB or malformed is
// an error naming the line, and the caller starts empty, saying so.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "model/result.h"

namespace endpointd::drain {

using WallClock = std::chrono::system_clock;

struct TtlHold {
  uint32_t ttl_s = 0;
  // Until when answers given with this TTL may still be cached; max(): while the process that
  // wrote it runs (on load: that process's last moment is at most now).
  WallClock::time_point until = WallClock::time_point::max();
  friend bool operator==(const TtlHold&, const TtlHold&) = default;
};

struct NodeState {
  std::set<std::string> agents;
  // The members the process waited for (name → its agent's address, empty: none known): a
  // restarted agent holds one whose Node is gone as deleted (drain/members.h DeletedNodes).
  std::map<std::string, std::string> members;
  std::vector<TtlHold> dns_ttls;
  friend bool operator==(const NodeState&, const NodeState&) = default;
};

inline constexpr size_t kNodeStateMaxBytes = 4 << 20;
inline constexpr size_t kNodeStateMaxAgents = 20000;
inline constexpr size_t kNodeStateMaxTtls = 16;

std::string encode_node_state(const NodeState& s);
Result<NodeState> decode_node_state(const std::string& text);

// The TTL holds a new process inherits at `now` from what the last one left: a running
// process's TTL held one TTL from now, expired ones dropped.
std::vector<TtlHold> inherited_ttls(const NodeState& loaded, WallClock::time_point now);

// The file, shared by the drain coordinator (agents) and the daemon (DNS TTLs); thread-safe.
// Without a path it keeps the state in memory only.
class NodeStateFile {
 public:
  // Loads the file; `load_error()` says why it started empty when it could not.
  explicit NodeStateFile(std::string path, WallClock::time_point now = WallClock::now());

  const std::string& path() const { return path_; }
  const std::string& load_error() const { return load_error_; }
  // What the last process left (agents, and the DNS TTLs inherited at load).
  NodeState loaded() const;
  uint64_t write_errors() const;

  // Adds nodes seen running an agent; writes the file when the set grew. At most
  // kNodeStateMaxAgents are kept (members are Nodes that exist and are in this set, so a name
  // of a Node deleted for good costs a line, nothing else); past that, new names are not
  // written and the error says so.
  Status add_agents(const std::set<std::string>& seen);
  // The members now waited for; writes the file when they changed.
  Status set_members(const std::map<std::string, std::string>& members);
  // The DNS TTL now in force: the previous one is held until now + its TTL.
  Status set_dns_ttl(uint32_t ttl_s, WallClock::time_point now = WallClock::now());

 private:
  Status write_locked();
  const std::string path_;
  mutable std::mutex mu_;
  NodeState state_;
  NodeState loaded_;
  std::string load_error_;
  uint64_t write_errors_ = 0;
  bool have_running_ = false;
};

}  // namespace endpointd::drain
