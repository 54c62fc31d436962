// Wiring of `endpointd run`: a source of cluster state, the update loop, the sinks, the
// admin server. Start, run until asked to stop, stop without touching the dataplane.
#pragma once

#include <chrono>
#include <memory>

#include "daemon/config.h"
#include "model/result.h"

namespace endpointd::daemon {

class Daemon {
 public:
  explicit Daemon(Config cfg);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  Status start();
  void stop();
  int admin_port() const;   // -1 when off
  int health_port() const;  // -1 when off
  int dns_port() const;     // -1 when off
  // Shutdown begins (SIGTERM): readiness fails from now on, while everything keeps running.
  // Returns how long DNS should go on answering before stop() (--dns-lameduck; zero without
  // DNS), so that resolvers still sending here get answers until they have moved on.
  std::chrono::milliseconds begin_lameduck();
  // A configuration read again (SIGHUP, or the config file changed): the DNS zone's options
  // (TTLs, pod records, loadbalance, noendpoints, ignore-empty-service, namespaces, endpoint pod
  // names) take effect at once, the zone built again; every other setting at the next start.
  // An error (e.g. a changed zone name) changes nothing.
  Status reload(const Config& next);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Logs to stderr as text or JSON lines, at `level` and above.
void setup_logging(LogFormat format, LogLevel level);

}  // namespace endpointd::daemon
