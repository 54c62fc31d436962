// What planner.cc and planner_layout.cc share (internal to the planner): a protocol's number
// as the rules and elements carry it.
#pragma once

#include <cstdint>

#include "model/objects.h"

namespace endpointd::proxy {

inline uint8_t l4proto(model::Protocol p) {
  using model::Protocol;
  switch (p) {
    case Protocol::kTCP:
      return 6;
    case Protocol::kUDP:
      return 17;
    case Protocol::kSCTP:
      return 132;
  }
  return 0;
}

}  // namespace endpointd::proxy
