// The healthCheckNodePort servers, as kube-proxy runs them: for every service with
// externalTrafficPolicy Local and a healthCheckNodePort, an HTTP listener on that port that
// answers 200 while this node has ready local endpoints for it and 503 otherwise, so an
// external load balancer only sends traffic to nodes that can serve it locally.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/snapshot.h"

namespace endpointd::proxy {

struct HealthCheckOptions {
  // Where the listeners bind ("0.0.0.0", "127.0.0.1", "::"). Sockets are made in the network
  // namespace of the thread that calls update().
  std::string bind_address = "0.0.0.0";
  // The proxy's own health (kube-proxy's "serviceProxyHealthy"); false turns every answer into
  // 503. Unset: always healthy.
  std::function<bool()> proxy_healthy = nullptr;
};

// The services that need a health-check listener and their local ready endpoint counts.
struct HealthCheckTarget {
  model::ServiceKey service;
  uint16_t port = 0;
  int local_endpoints = 0;
  friend bool operator==(const HealthCheckTarget&, const HealthCheckTarget&) = default;
};
// Pure: services with externalTrafficPolicy Local and a healthCheckNodePort, with the number of
// distinct ready endpoint addresses on `node_name`. Sorted by port; a port claimed twice goes
// to the first service by key.
std::vector<HealthCheckTarget> health_check_targets(const model::Snapshot& snap,
                                                    const std::string& node_name);

// The JSON body kube-proxy answers with.
std::string health_check_body(const model::ServiceKey& service, int local_endpoints, bool healthy);

class HealthCheckServer {
 public:
  explicit HealthCheckServer(HealthCheckOptions options);
  ~HealthCheckServer();  // closes every listener
  HealthCheckServer(const HealthCheckServer&) = delete;
  HealthCheckServer& operator=(const HealthCheckServer&) = delete;

  // Opens listeners for new targets, closes those whose service left or no longer qualifies,
  // and updates the counts the others answer with. A port that cannot be bound is logged,
  // counted, and tried again on the next update. Call from one thread at a time.
  void update(const model::Snapshot& snap, const std::string& node_name);

  // Ports with an open listener, sorted.
  std::vector<uint16_t> ports() const;
  // Times a listener could not be opened (degraded mode counter).
  uint64_t bind_failures() const { return bind_failures_.load(); }

 private:
  struct Listener;
  HealthCheckOptions options_;
  mutable std::mutex mu_;
  std::map<uint16_t, std::unique_ptr<Listener>> listeners_;
  std::atomic<uint64_t> bind_failures_{0};
};

}  // namespace endpointd::proxy
