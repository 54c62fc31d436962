// How the proxy tells pod traffic ("local", kept unmasqueraded) from the rest: kube-proxy's
// --detect-local-mode. Its own header so that the daemon's config takes it without the planner.
#pragma once

#include <cstdint>

namespace endpointd::proxy {

enum class DetectLocal : uint8_t {
  kClusterCidr,          // source in the cluster CIDRs (--cluster-cidr)
  kNodeCidr,             // source in this Node's spec.podCIDRs
  kBridgeInterface,      // arrived on the pods' bridge (--pod-bridge-interface)
  kInterfaceNamePrefix,  // arrived on an interface named <prefix>* (--pod-interface-name-prefix)
};

}  // namespace endpointd::proxy
