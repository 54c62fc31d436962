// The planner: Snapshot + node context -> the endpointd tables (one per IP family), and
// per Delta the minimal changes to them. Pure: no I/O, no clock, no threads.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/snapshot.h"
#include "proxy/table.h"

namespace endpointd::proxy {

struct NodeContext {
  std::string node_name;
  std::string zone;                            // topology.kubernetes.io/zone of this node
  std::vector<model::IpAddr> node_ips;         // addresses NodePorts are served on (candidates)
  std::vector<model::IpPrefix> cluster_cidrs;  // pod CIDRs: traffic from them is "local"
  bool masquerade_all = false;
  // kube-proxy's nodePortAddresses: CIDRs that select which node IPs serve NodePorts. Empty:
  // every address in node_ips (kube-proxy nftables' default, "primary", is the node's IPs).
  std::vector<model::IpPrefix> node_port_addresses;
  bool ipv4 = true;  // families this node has
  bool ipv6 = true;
  friend bool operator==(const NodeContext&, const NodeContext&) = default;
};

// What one plan or update counted, for logs and metrics.
struct PlanStats {
  uint64_t skipped = 0;  // service ports or addresses the kernel cannot take
  uint64_t no_local_endpoints_internal = 0;
  uint64_t no_local_endpoints_external = 0;
  std::vector<std::string> skip_reasons;  // "ns/name: why", for the log
};

class Planner {
 public:
  explicit Planner(NodeContext ctx);

  const NodeContext& context() const { return ctx_; }
  // A new node context (this node's IPs or zone changed); takes effect at the next reset().
  void set_context(NodeContext ctx) { ctx_ = std::move(ctx); }

  // Builds the tables for `snap` from nothing (forgets any earlier state).
  void reset(const model::Snapshot& snap);
  // Applies the services named in `delta` (looked up in `snap`) and returns what changed per
  // family (families without change are left out).
  std::vector<TableChanges> update(const model::Snapshot& snap, const model::Delta& delta);

  const Table& table(IpFamily f) const { return f == IpFamily::kV4 ? v4_ : v6_; }
  // The families this node programs (a table for a family the node lacks is not created).
  std::vector<IpFamily> families() const;
  const PlanStats& last_stats() const { return stats_; }
  // Current no-local-endpoints counts (kube-proxy's gauge-like counters).
  uint64_t no_local_internal() const { return no_local_internal_; }
  uint64_t no_local_external() const { return no_local_external_; }

 private:
  struct Contribution {
    IpFamily family;
    std::string set;
    Element element;
  };
  struct ServicePlan {
    std::vector<Contribution> contributions;
    bool no_local_internal = false;
    bool no_local_external = false;
  };
  struct Owned {
    Element element;
    uint32_t refs = 0;
  };
  struct FamilyState {
    // Per set: element key -> the element and how many services put it there.
    std::map<std::string, std::map<std::string, Owned>> owned;
    // Per backend-map size: how many elements use it (drives the per-N sets and chains).
    std::map<uint32_t, uint32_t> lb_sizes;
    std::map<uint32_t, uint32_t> local_lb_sizes;
  };

  ServicePlan plan_service(const model::ServiceState& st);
  void base_table(Table& t) const;
  void add_contribution(const Contribution& c, std::vector<TableChanges>* out);
  void remove_contribution(const Contribution& c, std::vector<TableChanges>* out);
  Table& table_mut(IpFamily f) { return f == IpFamily::kV4 ? v4_ : v6_; }
  FamilyState& state(IpFamily f) { return f == IpFamily::kV4 ? s4_ : s6_; }
  bool has_family(IpFamily f) const { return f == IpFamily::kV4 ? ctx_.ipv4 : ctx_.ipv6; }
  void ensure_size(IpFamily f, bool local, uint32_t n);
  void release_size(IpFamily f, bool local, uint32_t n);
  // Rewrites the rules of lb, lb-hash and local-lb from the backend-map sizes in use.
  void rebuild_lb_chains(IpFamily f);
  void forget_service(const ServicePlan& p);
  void remember_service(const ServicePlan& p);
  TableChanges& changes_for(std::vector<TableChanges>* out, IpFamily f);

  NodeContext ctx_;
  Table v4_;
  Table v6_;
  FamilyState s4_;
  FamilyState s6_;
  std::map<model::ServiceKey, ServicePlan> services_;
  PlanStats stats_;
  uint64_t no_local_internal_ = 0;
  uint64_t no_local_external_ = 0;
};

// The map of one backend-map size (shared by the planner and tests).
Set backends_set(bool local, uint32_t n);

}  // namespace endpointd::proxy
