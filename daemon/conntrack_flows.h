// drain/'s view of conntrack (drain::Flows), implemented by the proxy's conntrack code: the
// daemon's wiring is the only place that knows both.
#pragma once

#include <vector>

#include "drain/flows.h"
#include "proxy/conntrack.h"

namespace endpointd::daemon {

class ConntrackFlows final : public drain::Flows {
 public:
  explicit ConntrackFlows(proxy::Conntrack* conntrack) : conntrack_(conntrack) {}
  Result<std::vector<drain::FlowCount>> count_to_each(
      const std::vector<model::IpAddr>& endpoints) override {
    return conntrack_->count_flows_to_each(endpoints);
  }

 private:
  proxy::Conntrack* conntrack_;
};

}  // namespace endpointd::daemon
