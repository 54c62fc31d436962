// What drain/ needs from the kernel's connection tracking: the live connections to the
// endpoints it drains. An interface drain/ owns; the daemon injects an implementation backed
// by the proxy's conntrack code, and tests inject a fake.
#pragma once

#include <set>
#include <vector>

#include "drain/late.h"
#include "model/flow_count.h"
#include "model/ip.h"
#include "model/result.h"

namespace endpointd::drain {

using model::FlowCount;

class Flows {
 public:
  virtual ~Flows() = default;
  // The live connections to each of `endpoints`, in their order, in one walk of the table (a
  // rolling update drains many at once).
  virtual Result<std::vector<FlowCount>> count_to_each(
      const std::vector<model::IpAddr>& endpoints) = 0;
};

// New connections to chosen addresses as they open (observed removal, drain/late.h): the
// daemon injects one backed by connection-tracking events (proxy/new_flows.h).
class NewFlows {
 public:
  virtual ~NewFlows() = default;
  // The addresses to watch from now on (replaces the last set).
  virtual Status watch(const std::set<model::IpAddr>& addresses) = 0;
  // The connections seen since the last call, oldest first.
  virtual std::vector<SeenFlow> take() = 0;
};

}  // namespace endpointd::drain
