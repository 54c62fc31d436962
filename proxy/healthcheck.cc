// healthCheckNodePort listeners: one cpp-httplib server per port, each on its own thread with
// a one-thread pool (load balancer probes are few; a pool per port would waste threads).
#include "proxy/healthcheck.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <thread>

#include "model/json.h"
#include "model/routing.h"

namespace endpointd::proxy {

std::vector<HealthCheckTarget> health_check_targets(const model::Snapshot& snap,
                                                    const std::string& node_name) {
  std::vector<HealthCheckTarget> out;
  std::set<uint16_t> taken;
  for (const auto& st : snap.services) {
    const model::Service& svc = st->service;
    if (svc.external_traffic_policy != model::TrafficPolicy::kLocal) continue;
    if (svc.health_check_node_port == 0) continue;
    if (!taken.insert(svc.health_check_node_port).second) {
      spdlog::warn("healthcheck: port {} of service {} is already used by another service; skipped",
                   svc.health_check_node_port, svc.key.str());
      continue;
    }
    // Endpoints are one per address already; count the ready ones on this node (a node with
    // only terminating endpoints fails the check, so load balancers move away from it).
    int local = 0;
    for (const auto& ep : st->endpoints) {
      if (ep.node_name == node_name &&
          model::routing_of(svc, ep.conditions) == model::Routing::kReady)
        ++local;
    }
    out.push_back({svc.key, svc.health_check_node_port, local});
  }
  std::sort(out.begin(), out.end(),
            [](const HealthCheckTarget& a, const HealthCheckTarget& b) { return a.port < b.port; });
  return out;
}

std::string health_check_body(const model::ServiceKey& service, int local_endpoints, bool healthy) {
  return "{\"service\":{\"namespace\":" + model::json_string(service.ns) +
         ",\"name\":" + model::json_string(service.name) +
         "},\"localEndpoints\":" + std::to_string(local_endpoints) +
         ",\"serviceProxyHealthy\":" + (healthy ? "true" : "false") + "}";
}

struct HealthCheckServer::Listener {
  std::mutex mu;  // guards service and local_endpoints against the handler thread
  model::ServiceKey service;
  int local_endpoints = 0;
  httplib::Server http;
  std::thread thread;
  std::atomic<bool> listen_returned{false};

  ~Listener() {
    http.stop();
    if (thread.joinable()) thread.join();
  }
};

HealthCheckServer::HealthCheckServer(HealthCheckOptions options) : options_(std::move(options)) {}

HealthCheckServer::~HealthCheckServer() {
  std::lock_guard lock(mu_);
  listeners_.clear();
}

void HealthCheckServer::update(const model::Snapshot& snap, const std::string& node_name) {
  std::vector<HealthCheckTarget> targets = health_check_targets(snap, node_name);
  std::lock_guard lock(mu_);

  // Close listeners whose port no longer has a target.
  for (auto it = listeners_.begin(); it != listeners_.end();) {
    bool wanted = std::any_of(targets.begin(), targets.end(),
                              [&](const HealthCheckTarget& t) { return t.port == it->first; });
    if (wanted) {
      ++it;
    } else {
      spdlog::info("healthcheck: closing port {}", it->first);
      it = listeners_.erase(it);
    }
  }

  for (const HealthCheckTarget& t : targets) {
    auto it = listeners_.find(t.port);
    if (it != listeners_.end()) {
      std::lock_guard l(it->second->mu);
      it->second->service = t.service;
      it->second->local_endpoints = t.local_endpoints;
      continue;
    }
    auto listener = std::make_unique<Listener>();
    listener->service = t.service;
    listener->local_endpoints = t.local_endpoints;
    Listener* raw = listener.get();
    raw->http.new_task_queue = [] { return new httplib::ThreadPool(1); };
    auto healthy = options_.proxy_healthy;
    raw->http.Get(".*", [raw, healthy](const httplib::Request&, httplib::Response& res) {
      model::ServiceKey key;
      int count = 0;
      {
        std::lock_guard l(raw->mu);
        key = raw->service;
        count = raw->local_endpoints;
      }
      bool proxy_ok = !healthy || healthy();
      res.status = count > 0 && proxy_ok ? 200 : 503;
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_header("X-Load-Balancing-Endpoint-Weight", std::to_string(count));
      res.set_content(health_check_body(key, count, proxy_ok), "application/json");
    });
    if (!raw->http.bind_to_port(options_.bind_address, t.port)) {
      ++bind_failures_;
      spdlog::warn("healthcheck: cannot listen on {}:{} for service {}; will retry",
                   options_.bind_address, t.port, t.service.str());
      continue;
    }
    raw->thread = std::thread([raw] {
      raw->http.listen_after_bind();
      raw->listen_returned = true;
    });
    // httplib's stop() is a no-op until the accept loop runs; wait for it so that closing
    // this listener later cannot miss it. It starts at once (the socket is already bound).
    while (!raw->http.is_running() && !raw->listen_returned.load()) std::this_thread::yield();
    spdlog::info("healthcheck: listening on {}:{} for service {}", options_.bind_address, t.port,
                 t.service.str());
    listeners_.emplace(t.port, std::move(listener));
  }
}

std::vector<uint16_t> HealthCheckServer::ports() const {
  std::lock_guard lock(mu_);
  std::vector<uint16_t> out;
  for (const auto& [port, _] : listeners_) out.push_back(port);
  return out;
}

}  // namespace endpointd::proxy
