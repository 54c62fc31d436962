// What planner.cc and planner_layout.cc share (internal to the planner): a protocol's number
// as the rules and elements carry it, and the names of the class chains for ClientIP affinity.
#pragma once

#include <cstdint>

#include "model/objects.h"

namespace endpointd::proxy {

// service-ips' targets for a service with ClientIP affinity (the others: names::kSvcInternal,
// names::kSvcExternal): the same tests, then lb-affinity instead of lb.
namespace names {
inline constexpr const char* kSvcInternalAffinity = "svc-internal-affinity";
inline constexpr const char* kSvcExternalAffinity = "svc-external-affinity";
inline constexpr const char* kNatPostrouting = "nat-postrouting";
inline constexpr const char* kNatInput = "nat-input";
inline constexpr const char* kMasquerading = "masquerading";
}  // namespace names

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
