// A conntrack table in memory for tests of the proxy and drain/: flows are added by the test,
// matched and counted by the same rules as the netlink implementation.
#pragma once

#include <algorithm>
#include <functional>
#include <mutex>
#include <vector>

#include "proxy/conntrack.h"

namespace endpointd::proxy {

class FakeConntrack : public Conntrack {
 public:
  void add(const Flow& f) {
    std::lock_guard lock(mu_);
    flows_.push_back(f);
  }
  void clear() {
    std::lock_guard lock(mu_);
    flows_.clear();
  }
  // Makes every call fail with `message` (empty: succeed again).
  void fail_with(std::string message) {
    std::lock_guard lock(mu_);
    error_ = std::move(message);
  }
  std::vector<std::vector<FlowMatch>> delete_calls() const {
    std::lock_guard lock(mu_);
    return delete_calls_;
  }

  Result<std::vector<Flow>> list() override {
    std::lock_guard lock(mu_);
    if (!error_.empty()) return Error{error_};
    return flows_;
  }
  Result<DeletedFlows> delete_flows(const std::vector<FlowMatch>& matches) override {
    std::lock_guard lock(mu_);
    delete_calls_.push_back(matches);
    if (!error_.empty()) return Error{error_};
    return erase_counted([&](const Flow& f) {
      return std::any_of(matches.begin(), matches.end(),
                         [&](const FlowMatch& m) { return m.matches(f); });
    });
  }
  Result<DeletedFlows> delete_flows_if(const std::function<bool(const Flow&)>& stale) override {
    std::lock_guard lock(mu_);
    ++sweeps_;
    if (!error_.empty()) return Error{error_};
    return erase_counted(stale);
  }
  // How many delete_flows_if walks were made (delete_calls() lists delete_flows calls only).
  size_t sweeps() const {
    std::lock_guard lock(mu_);
    return sweeps_;
  }
  Result<FlowCount> count_flows_to(const model::IpAddr& endpoint) override {
    std::lock_guard lock(mu_);
    if (!error_.empty()) return Error{error_};
    FlowCount c;
    for (const auto& f : flows_) count_flow(f, endpoint, c);
    return c;
  }
  Result<std::vector<FlowCount>> count_flows_to_each(
      const std::vector<model::IpAddr>& endpoints) override {
    std::lock_guard lock(mu_);
    if (!error_.empty()) return Error{error_};
    std::vector<FlowCount> out(endpoints.size());
    for (size_t i = 0; i < endpoints.size(); ++i) {
      for (const auto& f : flows_) count_flow(f, endpoints[i], out[i]);
    }
    return out;
  }

 private:
  // Erases what `stale` selects, counted per family (the netlink table's family is the
  // addresses').
  DeletedFlows erase_counted(const std::function<bool(const Flow&)>& stale) {
    DeletedFlows d;
    std::erase_if(flows_, [&](const Flow& f) {
      if (!stale(f)) return false;
      d.count(f.orig_src.is_v6());
      return true;
    });
    return d;
  }

  mutable std::mutex mu_;
  std::vector<Flow> flows_;
  std::vector<std::vector<FlowMatch>> delete_calls_;
  std::string error_;
  size_t sweeps_ = 0;
};

}  // namespace endpointd::proxy
