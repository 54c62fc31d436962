// The coordinator's two servers (private to drain/): Peer.AwaitRemoval over gRPC for other
// nodes' agents, and the prestop unix socket for pods of this node.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "drain/coordinator.h"
#include "drain/identify.h"
#include "model/result.h"

namespace grpc {
class Server;
}

namespace endpointd::drain {

class Coordinator::PeerServer {
 public:
  // `cluster` (may be null) serves Peer.Exchange.
  PeerServer(Coordinator* c, std::string node, milliseconds answer_max, Cluster* cluster);
  ~PeerServer();
  // Returns the bound port.
  Result<uint16_t> start(const std::string& listen, const PeerCredentials& creds);
  void stop();

 private:
  class Service;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

class Coordinator::PrestopServer {
 public:
  PrestopServer(Coordinator* c, std::string node, size_t max_connections,
                std::function<void(const std::string&)> count);
  ~PrestopServer();
  Status start(const std::string& path);
  void stop();

 private:
  void accept_loop();
  void serve(int fd, Result<Caller> caller);
  // Joins the workers that finished (a finished thread keeps its stack until joined).
  void reap();

  Coordinator* c_;
  std::string node_;
  size_t max_connections_;
  std::function<void(const std::string&)> count_;
  std::string path_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd: wakes the accept loop
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> active_{0};
  std::thread accept_;
  std::mutex mu_;
  std::map<uint64_t, std::thread> workers_;
  std::vector<uint64_t> finished_;            // workers done, not yet joined
  std::map<std::string, size_t> per_caller_;  // calls in progress per pod (or process)
  uint64_t limited_ = 0;  // calls refused for a limit (accept thread only), for the log's pacing
  // A pod with several containers makes one call per container's hook.
  static constexpr size_t kPerCaller = 16;
  uint64_t next_worker_ = 0;
};

}  // namespace endpointd::drain
