// The nftables dataplane as the daemon runs it: the netlink backend, the sink that drives it,
// the monitor that repairs foreign changes (with quiet full syncs), conntrack cleanup and the
// healthCheckNodePort servers, assembled in the one order that works. The daemon registers
// sink() with its update loop and calls note_queued() on every publish.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "model/ip.h"
#include "model/result.h"
#include "pipeline/ack_board.h"
#include "proxy/conntrack.h"
#include "proxy/planner.h"
#include "proxy/sink.h"

namespace prometheus {
class Registry;
}

namespace endpointd::proxy {

class AddressMonitor;
class HealthCheckServer;
class Monitor;
class NetlinkBackend;

struct DataplaneOptions {
  // Node name, cluster CIDRs, nodePort address ranges, masqueradeAll; node_ips are filled in
  // from the host's addresses when empty, and then follow them (an AddressMonitor).
  NodeContext node;
  prometheus::Registry* registry = nullptr;
  // When the agent started: EndpointSlice trigger times before it are left out of
  // kubeproxy_network_programming_duration_seconds. Zero: when the dataplane starts.
  std::chrono::system_clock::time_point process_start{};
};

class Dataplane {
 public:
  // Opens the netlink socket in the calling thread's network namespace and starts the monitor
  // (without one, foreign changes are repaired only at the next full sync: logged).
  static Result<std::unique_ptr<Dataplane>> start(DataplaneOptions opts, pipeline::AckBoard* board);
  // Leaves the tables as they are: traffic keeps flowing while the agent restarts.
  ~Dataplane();
  Dataplane(const Dataplane&) = delete;
  Dataplane& operator=(const Dataplane&) = delete;

  ProxySink* sink() const { return sink_.get(); }
  // The conntrack table the sink cleans (drain/ counts flows in it too).
  Conntrack* conntrack() const { return conntrack_.get(); }
  bool healthy() const { return sink_->healthy(); }

 private:
  Dataplane() = default;
  std::unique_ptr<NetlinkBackend> netlink_;
  std::unique_ptr<Conntrack> conntrack_;
  std::unique_ptr<HealthCheckServer> health_checks_;
  std::unique_ptr<ProxySink> sink_;
  // When the node IPs came from the host: follows its addresses (destroyed before the sink).
  std::unique_ptr<AddressMonitor> addresses_;
  // Shared with the backend's quiet full sync hooks.
  std::shared_ptr<Monitor> monitor_;
};

// This host's global unicast addresses (no loopback, no link-local): where NodePorts may be
// served before --nodeport-addresses narrows them.
std::vector<model::IpAddr> host_addresses();

}  // namespace endpointd::proxy
