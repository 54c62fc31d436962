// drain/'s view of conntrack (drain::Flows, drain::NewFlows), implemented by the proxy's
// conntrack code: the daemon's wiring is the only place that knows both.
#pragma once

#include <memory>
#include <set>
#include <vector>

#include "drain/flows.h"
#include "proxy/conntrack.h"
#include "proxy/new_flows.h"

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

// New connections to this node's terminating pods, from connection-tracking events.
class ConntrackNewFlows final : public drain::NewFlows {
 public:
  explicit ConntrackNewFlows(std::unique_ptr<proxy::NewFlowWatch> watch)
      : watch_(std::move(watch)) {}
  Status watch(const std::set<model::IpAddr>& addresses) override {
    return watch_->watch(addresses);
  }
  std::vector<drain::SeenFlow> take() override {
    std::vector<drain::SeenFlow> out;
    for (const auto& f : watch_->take()) out.push_back({f.src, f.dst, f.at});
    return out;
  }

 private:
  std::unique_ptr<proxy::NewFlowWatch> watch_;
};

}  // namespace endpointd::daemon
