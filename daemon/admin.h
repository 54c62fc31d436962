// The admin HTTP server: /healthz, /readyz, /livez, /metrics, /debug/state.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "model/hostport.h"
#include "model/result.h"

namespace prometheus {
class Registry;
}
namespace httplib {
class Server;
}

namespace endpointd::daemon {

struct Probe {
  bool ok = true;
  std::string detail;  // the body: why it is not ok, or "ok"
};

class AdminServer {
 public:
  struct Handlers {
    std::function<Probe()> healthz;
    std::function<Probe()> readyz;
    std::function<Probe()> livez;
    std::function<std::string()> debug_state;
  };

  AdminServer(Handlers h, prometheus::Registry* registry);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Binds the address (empty host: every IPv4 address; port 0 picks one) and serves on a
  // thread of its own.
  Status start(const model::HostPort& listen);
  void stop();
  int port() const { return port_; }

 private:
  Handlers handlers_;
  prometheus::Registry* registry_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace endpointd::daemon
