// A multi-node test cluster made of network namespaces, laid out like examples/cluster:
//
//   client 192.168.77.100 ─┐
//   node-a 192.168.77.2  ──┼── bridge namespace (br0), 192.168.77.0/24
//   node-b 192.168.77.3  ──┘
//   node-a ── veth per pod ── web-1 10.244.1.10, web-2 10.244.1.11, ...
//   node-b ── veth per pod ── web-3 10.244.2.10, ...
//
// Nodes forward and route each other's pod CIDRs; a pod's default route is its node (the
// gateway 10.244.<n>.1 sits on every pod veth of the node, point-to-point as the CNI ptp
// plugin does it). The client routes pod CIDRs to their nodes and the service CIDR to one
// node. Every address lives inside namespaces the cluster made; destruction removes them.
// Plus the test programs (endpointd-testserver, endpointd-loadclient) and their logs.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/netns/netns.h"

namespace endpointd::netns {

struct PodSpec {
  std::string name;
  std::string ip;
};

struct NodeSpec {
  std::string name;
  std::string ip;        // on the bridge, /24
  std::string pod_cidr;  // "10.244.1.0/24"
  std::string gateway;   // the node's address on every pod veth, "10.244.1.1"
  std::vector<PodSpec> pods;
};

struct ClusterSpec {
  std::string bridge_prefix = "192.168.77";  // the node network is <prefix>.0/24
  std::vector<NodeSpec> nodes;
  std::string client_ip = "192.168.77.100";
  std::string service_cidr = "10.96.0.0/12";
  size_t client_via_node = 0;  // the node the client sends service traffic to

  // examples/cluster: node-a (web-1, web-2, db-1) and node-b (web-3, db-0).
  static ClusterSpec demo();
  // node-1..node-N at <prefix>.2.., pods "<node>-pod-<j>" at 10.244.<i+1>.<10+j>.
  static ClusterSpec make(int nodes, int pods_per_node);
};

class Cluster {
 public:
  // Builds every namespace and link; throws std::runtime_error (after removing what it made)
  // when a step fails.
  explicit Cluster(ClusterSpec spec);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const ClusterSpec& spec() const { return spec_; }
  Netns& bridge() { return *bridge_; }
  Netns& client() { return *client_; }
  Netns& node(const std::string& name);
  Netns& pod(const std::string& name);
  const PodSpec& pod_spec(const std::string& name) const;
  std::vector<std::string> pod_names() const;
  // All namespace names this cluster made.
  std::vector<std::string> namespace_names() const;

 private:
  ClusterSpec spec_;
  std::string prefix_;
  std::unique_ptr<Netns> bridge_;
  std::unique_ptr<Netns> client_;
  std::map<std::string, std::unique_ptr<Netns>> nodes_;
  std::map<std::string, std::unique_ptr<Netns>> pods_;  // destroyed first (declared last)
};

// ---- test programs ----

std::string testserver_path();
std::string loadclient_path();

struct ServerOptions {
  std::string name = {};  // answered to every request
  int tcp_port = 8080;    // -1: none
  int udp_port = -1;      // -1: none
  int grace_ms = 0;       // drain time after SIGTERM
  std::string bind = "0.0.0.0";
};

// A test server running inside a namespace; `events` is its accept/close/udp log.
struct Server {
  Process* process = nullptr;
  std::string events_path;
};

// Starts endpointd-testserver in ns and waits until it listens (throws if it does not).
Server start_server(Netns& ns, const ServerOptions& opts);

struct ServerEvent {
  int64_t time_ns = 0;
  std::string kind;  // listen, accept, close, udp, sigterm, exit
  std::string peer;  // accept/close/udp: "ip:port"
  uint64_t conn_id = 0;
};
std::vector<ServerEvent> read_server_events(const std::string& path);

struct LoadOptions {
  std::string target = {};  // "ip:port"
  bool udp = false;
  bool keepalive = false;
  int concurrency = 1;
  int count = 0;          // total requests (0: until the duration ends)
  int duration_ms = 0;    // 0: until count
  int interval_ms = 10;   // pause between one worker's requests
  int timeout_ms = 1000;  // per request
};

struct LoadRecord {
  int64_t time_ns = 0;
  bool ok = false;
  std::string what;  // backend name, or the error
  int64_t latency_us = 0;
  int worker = 0;
  uint64_t conn = 0;
};

struct LoadResult {
  int ok = 0;
  int failed = 0;
  std::map<std::string, int> by_backend;  // successes per answering server
  std::map<std::string, int> errors;      // failures per error
  std::vector<LoadRecord> records;
};

// A running endpointd-loadclient.
class LoadClient {
 public:
  LoadClient(Netns& ns, const LoadOptions& opts);
  // Waits for the client to end by itself (at most its --duration-ms plus `slack`), then
  // reads its records. Throws if it does not end in time.
  LoadResult wait(std::chrono::milliseconds slack = std::chrono::milliseconds(10000));
  // Asks it to stop now (SIGTERM) and reads its records.
  LoadResult stop();
  LoadResult results_so_far() const;
  const std::string& out_path() const { return out_path_; }

 private:
  Process* process_ = nullptr;
  std::string out_path_;
  int duration_ms_ = 0;
};

LoadResult read_load_results(const std::string& path);

}  // namespace endpointd::netns
