// Conntrack: what the proxy and drain/ need from the kernel's connection tracking table.
// Behind an interface so the logic above it is tested with a fake; the netlink
// implementation (libnl-nf) acts on the network namespace of the thread that calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/flow_count.h"
#include "model/ip.h"
#include "model/objects.h"
#include "model/result.h"

namespace endpointd::proxy {

// One conntrack entry, reduced to what endpointd matches on. For a DNAT'd connection the
// original direction is client -> service VIP and the reply direction is backend -> client,
// so reply_src is the endpoint the connection is bound to.
struct Flow {
  uint8_t l4proto = 0;  // IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP, ...
  model::IpAddr orig_src, orig_dst;
  uint16_t orig_src_port = 0, orig_dst_port = 0;
  model::IpAddr reply_src, reply_dst;
  uint16_t reply_src_port = 0, reply_dst_port = 0;
  std::optional<uint8_t> tcp_state;  // enum tcp_conntrack, for TCP entries
  friend bool operator==(const Flow&, const Flow&) = default;
};

uint8_t ip_protocol_number(model::Protocol p);

// Which entries an operation acts on: every field that is set must match.
struct FlowMatch {
  std::optional<model::Protocol> protocol;
  std::optional<model::IpAddr> orig_dst;  // the address the client sent to (a service VIP)
  std::optional<uint16_t> orig_dst_port;
  std::optional<model::IpAddr> reply_src;  // the backend the connection was DNAT'd to
  std::optional<uint16_t> reply_src_port;
  bool matches(const Flow& f) const;
};

// UDP entries still bound to an endpoint that left (its port optional).
FlowMatch udp_to_endpoint(const model::IpAddr& endpoint, std::optional<uint16_t> port = {});
// UDP entries to a service VIP:port made while it had no endpoints (they blackhole the client
// until deleted, since NAT is only chosen for a connection's first packet).
FlowMatch udp_to_service(const model::IpAddr& vip, uint16_t port);
// Likewise for a NodePort: any destination address, that port.
FlowMatch udp_to_node_port(uint16_t node_port);

// Live connections to one endpoint (drain/ reads them through its own Flows interface).
using model::FlowCount;

// Adds one entry's contribution (if reply_src is `endpoint`) to `count`.
void count_flow(const Flow& f, const model::IpAddr& endpoint, FlowCount& count);

// What a deletion removed, per family (kube-proxy counts its reconciler's deletions under
// `ip_family`).
struct DeletedFlows {
  size_t ipv4 = 0, ipv6 = 0;
  size_t total() const { return ipv4 + ipv6; }
  void count(bool v6) { ++(v6 ? ipv6 : ipv4); }
};

class Conntrack {
 public:
  virtual ~Conntrack() = default;
  // Every entry of every family.
  virtual Result<std::vector<Flow>> list() = 0;
  // Deletes every entry matching any of `matches`, in one walk of the table. Returns how many
  // it deleted, per family (entries that vanished meanwhile are not errors and not counted).
  virtual Result<DeletedFlows> delete_flows(const std::vector<FlowMatch>& matches) = 0;
  // Deletes every entry `stale` selects, in one walk of the table (the sweep after a full sync,
  // whose test is a lookup, not a list of matches). Counted as delete_flows counts.
  virtual Result<DeletedFlows> delete_flows_if(const std::function<bool(const Flow&)>& stale) = 0;
  // The connections whose reply source is `endpoint` (any port).
  virtual Result<FlowCount> count_flows_to(const model::IpAddr& endpoint) = 0;
  // The same for several endpoints in one walk of the table (a rolling update drains many at
  // once); the counts are in the order of `endpoints`.
  virtual Result<std::vector<FlowCount>> count_flows_to_each(
      const std::vector<model::IpAddr>& endpoints) = 0;
};

// The libnl-nf implementation. Each call opens its own netlink socket in the calling thread's
// network namespace, so one instance is safe to use from several threads.
std::unique_ptr<Conntrack> make_netlink_conntrack();

}  // namespace endpointd::proxy
