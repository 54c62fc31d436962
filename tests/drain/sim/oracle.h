// The drain simulation's oracle: who may still route to an address, read from what each
// consumer actually holds, as endpointd's own builders make it — never from the routing rule
// (model/routing.h) that the drain machine, LocalMarks and those builders share. A wrong rule,
// or a gap between the rule and what a consumer holds, then shows as a false "confirmed".
//
//  - a node's kernel: the proxy planner's tables for the snapshot the kernel holds, planned as
//    that node; an address routes when an element that DNATs new connections names it (the
//    backend maps `backends-N` and `local-backends-N`, the fallback's elements among them, and
//    the ClientIP affinity backends `affinity-backends-T`, which the affinity records DNAT to);
//  - a feed subscriber: the feed's encoders for its last accepted snapshot, the UpstreamFeed's
//    endpoints (their `routing` verdict ROUTED or ROUTED_FALLBACK; an unspecified one counts
//    too) and the EDS ClusterLoadAssignments (HEALTHY or UNKNOWN; DRAINING only when no
//    endpoint of the assignment is HEALTHY or UNKNOWN, the last resort the feed documents);
//  - DNS: the A answer of the zone the DNS consumer built from its snapshot.
//
// tests/drain/CMakeLists.txt compiles this file on its own and fails the build's tests when its
// object references any function of model/routing.h (drain_sim_oracle_independent).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/snapshot.h"

namespace endpointd::proxy {
class Planner;
}
namespace endpointd::dns {
class ZoneBuilder;
}

namespace endpointd::drain::sim {

class Oracle {
 public:
  Oracle();
  ~Oracle();
  // Whether the kernel of `node` programmed with `snap` DNATs new connections to `ip`.
  bool kernel_routes(const model::Snapshot& snap, const std::string& node, const model::IpAddr& ip);
  // Every address the kernel of `node` programmed with `snap` DNATs new connections to (valid
  // until the next call).
  const std::set<model::IpAddr>& kernel_targets(const model::Snapshot& snap,
                                                const std::string& node);

  // What a feed subscriber whose last accepted state is `snap` may do with `ip`.
  struct FeedHold {
    bool upstream = false;  // endpointd.v1: ROUTED or ROUTED_FALLBACK (or unspecified)
    bool eds = false;       // EDS: HEALTHY/UNKNOWN, or DRAINING with nothing healthy
    // EDS: DRAINING or UNHEALTHY in an assignment less than half of which is healthy. An Envoy
    // with its default panic threshold (50 %) balances over every host then; endpointd's
    // documented contract is that a subscriber leaves DRAINING hosts alone while any is
    // healthy (threshold 0), which the oracle assumes, counting the cases.
    bool eds_panic = false;
    bool routes() const { return upstream || eds; }
  };
  FeedHold feed_holds(const model::Snapshot& snap, const model::IpAddr& ip);

  // The addresses of the A (or AAAA) answer DNS built from `snap` gives for `name`, in the
  // order of its records; empty when it answers anything else. A name of a service
  // (<service>.<namespace>.svc.…) is answered by a zone of that service alone: the others
  // cannot change its records, and most of a world's changes leave it as it was.
  const std::vector<model::IpAddr>& dns_answer(const model::Snapshot& snap, std::string_view name,
                                               bool aaaa = false);

  // How many plans, encodings and zones were built (the caches' misses).
  size_t builds() const { return builds_; }

  struct Feed {
    std::set<model::IpAddr> upstream, eds, eds_panic;
  };
  using Services = std::vector<model::ServiceStatePtr>;
  using ServicesKey = std::vector<const model::ServiceState*>;

 private:
  static Feed encode(const model::ServiceState& svc);
  // Keyed by what each build reads, not by generation: a world publishes a new generation for
  // every pod or Node change, and most leave the services as they were (the store keeps an
  // unchanged service's state). The services by identity — each entry keeps its states alive,
  // so an address in a key is never another state's — and for a kernel its node and the Nodes'
  // addresses (its context). Bounded: cleared when large.
  struct Kernel {
    Services keep;
    std::set<model::IpAddr> targets;
  };
  struct Answer {
    Services keep;
    std::vector<model::IpAddr> addresses;
  };
  std::map<std::pair<ServicesKey, std::string>, Kernel> kernel_;
  std::map<const model::ServiceState*, std::pair<model::ServiceStatePtr, Feed>> feed_;
  std::map<std::pair<ServicesKey, std::string>, Answer> dns_;
  struct NodePlanner {
    std::unique_ptr<proxy::Planner> planner;
    model::Snapshot last;  // what it planned last
  };
  std::map<std::string, NodePlanner> planners_;
  std::unique_ptr<dns::ZoneBuilder> zones_;
  size_t builds_ = 0;
};

}  // namespace endpointd::drain::sim
