// The daemon's HTTP listeners, both on httpd/'s bounded server, split as kube-proxy splits
// them:
//   health  /healthz /readyz /livez — for the kubelet's probes and load balancers; nothing in
//           them is sensitive, so it may listen on the node's addresses (default 0.0.0.0:10256).
//   admin   the probes, /metrics and /debug/state — pod names, UIDs, addresses; loopback by
//           default (127.0.0.1:10249), and behind a bearer token when one is configured.
// The probes answer from the server's event loop however many idle or slow clients there
// are; /debug/state is streamed from its one worker thread, one request at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/state_json.h"
#include "httpd/server.h"
#include "model/hostport.h"
#include "model/result.h"

namespace prometheus {
class Registry;
}

namespace endpointd::daemon {

struct Probe {
  bool ok = true;
  std::string detail;  // the body: why it is not ok, or "ok"
  // When set, the body instead, as application/json (kube-proxy's /healthz and /livez).
  std::string json;
};

class AdminServer {
 public:
  enum class Role { kHealth, kAdmin };
  struct Handlers {
    std::function<Probe()> healthz;
    std::function<Probe()> readyz;
    std::function<Probe()> livez;
    // Writes /debug/state for the query; stops when the writer returns false.
    std::function<void(const StateQuery&, const std::function<bool(std::string_view)>&)>
        debug_state;
    // Called before /metrics is serialized (to bring counters up to date).
    std::function<void()> before_scrape;
  };

  // `registry` (admin role): served on /metrics. `token` (admin role): when not empty,
  // /metrics and /debug/state need "Authorization: Bearer <token>".
  AdminServer(Role role, Handlers h, prometheus::Registry* registry, std::string token = "",
              httpd::Limits limits = {});
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Binds the address (empty host: every IPv4 address; port 0 picks one) and serves on
  // threads of its own.
  Status start(const model::HostPort& listen);
  void stop();
  int port() const { return port_; }
  httpd::Stats stats() const { return server_.stats(); }
  const char* name() const { return role_ == Role::kHealth ? "health" : "admin"; }

 private:
  Role role_;
  Handlers handlers_;
  prometheus::Registry* registry_;
  httpd::Server server_;
  int port_ = -1;
};

// Reads a bearer token file: its first line, trimmed; an error names the file if it cannot
// be read or holds no token.
Result<std::string> read_token_file(const std::string& path);

}  // namespace endpointd::daemon
