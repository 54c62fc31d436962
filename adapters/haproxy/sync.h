// One pass of endpointd-haproxy over HAProxy: per mapped backend, read `show servers state`,
// send what differs, and read it back to confirm. Its answer decides whether a version is
// acknowledged.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "adapters/haproxy/adapter.h"
#include "adapters/haproxy/runtime.h"

namespace endpointd::haproxy {

struct SyncReport {
  // HAProxy showed every backend in its desired state (collisions aside) when read back.
  bool applied = false;
  size_t commands = 0;        // commands sent
  size_t errors = 0;          // calls without an answer and answers reporting a failure
  std::string first_error;    // the first of them, naming the socket and the command
  size_t collisions = 0;      // desired server names held by servers from haproxy.cfg
  size_t new_collisions = 0;  // of those, the ones the previous pass did not see
  size_t pending_deletions = 0;
};

class Syncer {
 public:
  Syncer(RuntimeApi& api, uint32_t id_base) : api_(api), id_base_(id_base) {}

  // Stops at the first call without an answer (HAProxy slow, stopped or gone): the rest would
  // wait out their timeouts too. Logs every error and each new collision.
  SyncReport sync(const Desired& desired);

 private:
  RuntimeApi& api_;
  uint32_t id_base_;
  std::map<std::string, std::set<std::string>> collisions_;  // by backend, as last seen
};

}  // namespace endpointd::haproxy
