// What the proxy_support tests of ProxySink share: a backend that accepts batches (or rejects
// the ones it is told to), and snapshots of UDP services built in a line.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/snapshot.h"
#include "proxy/backend.h"

namespace endpointd::proxy::support {

class AcceptingBackend : public Backend {
 public:
  Result<BatchStats> full_sync(const std::vector<const Table*>&) override {
    std::lock_guard l(mu_);
    ++full_syncs_;
    return BatchStats{1, 1};
  }
  Result<BatchStats> apply(const std::vector<TableChanges>& changes) override {
    std::lock_guard l(mu_);
    ++batches_;
    if (fail_batches_ > 0) {
      --fail_batches_;
      return Error{"EINVAL (fake)"};
    }
    return BatchStats{changes.size(), 1};
  }
  // The next `n` incremental batches are rejected (full syncs still succeed).
  void fail_batches(int n) {
    std::lock_guard l(mu_);
    fail_batches_ = n;
  }
  int full_syncs() const {
    std::lock_guard l(mu_);
    return full_syncs_;
  }
  int batches() const {
    std::lock_guard l(mu_);
    return batches_;
  }

 private:
  mutable std::mutex mu_;
  int full_syncs_ = 0;
  int batches_ = 0;
  int fail_batches_ = 0;
};

inline model::IpAddr ip(const char* s) {
  return *model::IpAddr::parse(s);
}

// An endpoint with one port named "p".
inline model::MergedEndpoint udp_endpoint(const char* addr, uint16_t port, bool ready = true,
                                          bool terminating = false, bool serving = true) {
  model::MergedEndpoint e;
  e.address = ip(addr);
  e.conditions = {ready, serving, terminating};
  e.node_name = "node-1";
  e.ports.push_back(model::EndpointPort{"p", model::Protocol::kUDP, port, ""});
  return e;
}

// A service with one UDP port named "p".
inline model::Service udp_service(const std::string& name, const char* cluster_ip, uint16_t port) {
  model::Service s;
  s.key = {"default", name};
  s.cluster_ips = {ip(cluster_ip)};
  model::ServicePort sp;
  sp.name = "p";
  sp.protocol = model::Protocol::kUDP;
  sp.port = port;
  s.ports.push_back(sp);
  return s;
}

inline model::ServiceStatePtr state(model::Service svc, std::vector<model::MergedEndpoint> eps) {
  auto st = std::make_shared<model::ServiceState>();
  st->service = std::move(svc);
  std::sort(eps.begin(), eps.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  st->endpoints = std::move(eps);
  return st;
}

inline model::SnapshotPtr snapshot(uint64_t g, std::vector<model::ServiceStatePtr> services,
                                   bool synced = true) {
  auto s = std::make_shared<model::Snapshot>();
  s->generation = g;
  s->synced = synced;
  std::sort(services.begin(), services.end(),
            [](const auto& a, const auto& b) { return a->key() < b->key(); });
  s->services = std::move(services);
  return s;
}

}  // namespace endpointd::proxy::support
