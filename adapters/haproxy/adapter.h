// endpointd-haproxy's logic, pure: the --backend mappings, the feed's state folded from
// WatchResponses, the servers each HAProxy backend should have, and the diff between those and
// what `show servers state` shows, as runtime-API commands.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "adapters/haproxy/runtime.h"
#include "endpointd/v1/feed.pb.h"
#include "model/result.h"

namespace endpointd::haproxy {

// One --backend flag, "NAMESPACE/SERVICE:PORT=BACKEND": the endpoints of the service port
// PORT (the Service's port number) become the servers of the HAProxy backend BACKEND.
struct Mapping {
  std::string ns;
  std::string service;
  uint32_t port = 0;
  std::string backend;
  friend bool operator==(const Mapping&, const Mapping&) = default;
};

Result<Mapping> parse_mapping(std::string_view flag);
// A backend named twice is an error (its servers would be fought over).
Status check_mappings(const std::vector<Mapping>& mappings);
// One selector per mapping.
v1::Subscribe subscription(const std::vector<Mapping>& mappings, const std::string& client_name);

// What one feed stream said so far: its first response is full, later ones change or remove
// whole services.
struct FeedState {
  uint64_t version = 0;
  bool complete = false;  // a full response arrived
  std::map<std::pair<std::string, std::string>, v1::ServiceEndpoints> services;
};
void fold(FeedState& state, const v1::WatchResponse& response);

enum class ServerState { kReady, kDrain, kMaint };
std::string_view to_string(ServerState s);

struct DesiredServer {
  std::string addr;  // canonical IP text
  uint32_t port = 0;
  ServerState state = ServerState::kMaint;
  friend bool operator==(const DesiredServer&, const DesiredServer&) = default;
};
using DesiredBackend = std::map<std::string, DesiredServer>;  // by server name

struct Desired {
  std::map<std::string, DesiredBackend> backends;  // every mapped backend, even when empty
  std::vector<std::string> skipped;                // endpoints the feed sent that cannot be servers
};

// The server state of an endpoint's routing verdict (endpointd.v1.Routing, the agent's routing
// rule): ROUTED and ROUTED_FALLBACK → ready, DRAINING → drain, NOT_ROUTED → maint; none for
// ROUTING_UNSPECIFIED (an agent older than the field). The adapter derives nothing from the
// raw conditions.
std::optional<ServerState> server_state(v1::Routing routing);

// The servers of every mapped backend: per endpoint of the mapped port, server_state of its
// verdict. An address that is not an IP, a port out of range or a missing verdict is skipped
// and reported.
Desired desired(const FeedState& state, const std::vector<Mapping>& mappings);

// The server name of an endpoint: "<address>_<port>", with the colons of an IPv6 address
// turned into dashes ("10.244.1.7_8080", "fd00--7_8080"). Deterministic, so a restarted
// adapter finds its servers again.
std::string server_name(std::string_view canonical_addr, uint32_t port);

// The state of a server as `show servers state` shows it: any maintenance bit → maint, else a
// drain bit → drain, else ready.
ServerState observed_state(uint32_t admin_state);

// The adapter owns a server when it has a forced id at or above the id base: every server it
// adds gets one (`add server … id N`). A server declared in haproxy.cfg (no id, or a small
// one) is never changed or deleted.
bool owned(const ServerRow& row, uint32_t id_base);

struct Action {
  enum class Kind { kAdd, kSetAddr, kSetState, kDelete };
  Kind kind = Kind::kAdd;
  std::string server;
  std::string addr;  // kAdd, kSetAddr
  uint32_t port = 0;
  uint32_t id = 0;                          // kAdd
  ServerState state = ServerState::kMaint;  // kSetState
  friend bool operator==(const Action&, const Action&) = default;
};
// The runtime-API command for an action on `backend`.
std::string command(const std::string& backend, const Action& action);

struct Assessment {
  // What brings HAProxy to the desired state, in order. A new server is added (HAProxy 2.6
  // puts it in maintenance) and then set to its state; a server no longer desired is set to
  // maint first and deleted once it is in maint (HAProxy refuses while it has connections).
  std::vector<Action> actions;
  // Desired names held by a server the adapter does not own: left alone, reported.
  std::vector<std::string> collisions;
  // Owned servers in maint that are no longer desired: a `del server` is outstanding.
  size_t pending_deletions = 0;
  // HAProxy routes as desired: every desired server (but collisions) exists with its address
  // and state, and every other owned server is in maint (no new connections) or gone.
  bool converged = false;
};
Assessment assess(const DesiredBackend& want, const std::vector<ServerRow>& have, uint32_t id_base);

}  // namespace endpointd::haproxy
