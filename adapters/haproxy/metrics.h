// endpointd-haproxy's metrics and the optional HTTP listener that serves them (/metrics in
// Prometheus text format, /healthz).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <memory>
#include <thread>

#include "model/hostport.h"
#include "model/result.h"

namespace httplib {
class Server;
}

namespace endpointd::haproxy {

struct Metrics {
  Metrics();
  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Gauge& received_version;      // the newest version the feed sent
  prometheus::Gauge& acked_version;         // the newest version acknowledged
  prometheus::Counter& syncs_applied;       // passes that HAProxy confirmed
  prometheus::Counter& syncs_failed;        // passes that did not converge (no ack)
  prometheus::Counter& commands;            // runtime-API commands that change servers
  prometheus::Counter& runtime_errors;      // calls without an answer, answers reporting failure
  prometheus::Gauge& collisions;            // desired server names taken by haproxy.cfg servers
  prometheus::Counter& collisions_seen;     // each collision when first seen
  prometheus::Gauge& pending_deletions;     // removed endpoints whose `del server` waits
  prometheus::Counter& skipped_endpoints;   // endpoints that cannot be servers (bad address)
  prometheus::Counter& feed_streams;        // feed streams opened (1 + reconnects)
  prometheus::Counter& feed_stream_errors;  // feed streams that ended or failed to open
};

class MetricsServer {
 public:
  explicit MetricsServer(std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  Status start(const model::HostPort& listen);
  void stop();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace endpointd::haproxy
