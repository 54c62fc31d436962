// Helpers the drain machine's files share (machine.cc, machine_waiters.cc): internal to drain/.
#pragma once

#include <chrono>
#include <string>

#include "drain/machine.h"
#include "model/snapshot.h"

namespace endpointd::drain::internal {

inline bool in_any_service(const model::Snapshot& s, const model::IpAddr& ip) {
  for (const auto& st : s.services)
    if (st->find(ip)) return true;
  return false;
}

inline std::string ms_since(TimePoint from, TimePoint t) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(t - from).count());
}

}  // namespace endpointd::drain::internal
