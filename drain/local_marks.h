// This agent's own watermarks, from the acknowledgement board, pure (the coordinator and the
// drain simulation both use it).
//
// The routing watermark is the revision of the newest generation every consumer applied. The
// DNS watermark is lower by the answers' TTL: a DNS consumer's generation counts for it only
// once the answers it gave from the state before have expired from clients' caches (the TTL
// each DNS consumer publishes on its board entry now: one value, read by the DNS sink and by
// drain alike, changed by a reload in both). Holdouts — clients that stopped holding a consumer
// back but may still route — are reported with the revision of their last accepted state.
// A terminating endpoint that an applied state routes to by the terminating fallback (every
// other endpoint of its service unready) is reported as a holdout "fallback/<address>" too: a
// drain of it is confirmed by no node that routes to it, whatever the revisions say (a
// fallback can come back after the removal; the draining node may not have seen that state).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "drain/aggregate.h"
#include "pipeline/ack_board.h"

namespace endpointd::drain {

// Whether consumer `e` may still send traffic to `ip` at `now` — the one answer to "does this
// consumer still route to it?" that drains and peers' questions share: its applied state routes
// to it (by the routing rule, as `node` sees it), or it has applied nothing, or (a consumer
// whose answers are cached: DNS) an answer it published as carrying `ip` has not expired yet —
// then `*expires` is lowered to when it does.
bool consumer_routes(const pipeline::AckBoard::Entry& e, const model::IpAddr& ip,
                     const std::string& node, std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::time_point* expires = nullptr);
// The same for one pod's endpoint at `ip`: a service whose endpoint at `ip` names another pod
// (targetRef.uid; a hostNetwork pod beside it at the node's address, or a new pod at a reused
// address) does not route to this pod. `uid` empty: every endpoint at `ip` counts.
bool consumer_routes(const pipeline::AckBoard::Entry& e, const model::IpAddr& ip,
                     const std::string& uid, const std::string& node,
                     std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::time_point* expires = nullptr);
// Whether endpoint `e` of a service stands for the pod `uid` (empty `uid`, or an endpoint that
// names no UID: yes).
bool names_pod(const model::MergedEndpoint& e, const std::string& uid);

// What a peer asked about `ip` (AwaitRemoval) answers from its own board: removed when no
// consumer routes to it (consumer_routes) and no client that stopped holding a consumer back
// may: one whose last accepted state routes to it, or one whose state is not known (kept across
// a restart by its revision only: it may route to anything terminating since).
struct LocalRemoval {
  bool removed = false;
  struct Consumer {
    std::string name;
    uint64_t generation = 0;
    bool routes = true;
  };
  std::vector<Consumer> consumers;
};
// `revision` (0: none): the EndpointSlice revision of the removal asked about — a consumer
// whose applied state is older has not applied it, and is not removed whatever that state says.
LocalRemoval local_removal(const std::vector<pipeline::AckBoard::Entry>& entries,
                           const model::IpAddr& ip, const std::string& node,
                           std::chrono::steady_clock::time_point now, uint64_t revision = 0);

class LocalMarks {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // A published snapshot (its generation, the EndpointSlice revision it includes, and the
  // terminating endpoints it routes to by the fallback, found from its difference to the last).
  void snapshot(const model::SnapshotPtr& snap, const std::string& node);

  struct Marks {
    uint64_t routing = 0;
    uint64_t dns = 0;
    HoldoutList holdouts;
    std::set<model::IpAddr> fallback;  // this node's own fallback-routed endpoints
    bool operator==(const Marks&) const = default;
  };
  // The marks now; `next` is lowered to when the DNS watermark moves without new input.
  Marks update(const std::vector<pipeline::AckBoard::Entry>& entries, const std::string& node,
               TimePoint now, TimePoint* next);

  bool empty() const { return revisions_.empty(); }

  // The client name of a fallback holdout for `ip`.
  static std::string fallback_client(const model::IpAddr& ip) { return "fallback/" + ip.str(); }

 private:
  uint64_t revision_at(uint64_t generation) const;
  // Recent snapshots, oldest first: every consumer's state is one of them.
  struct Seen {
    uint64_t generation = 0, revision = 0;
    std::vector<model::IpAddr> fallback;  // terminating endpoints it routes to
  };
  std::deque<Seen> revisions_;
  model::SnapshotPtr last_;
  std::map<model::ServiceKey, std::vector<model::IpAddr>> fallback_by_service_;
  // Holdouts' states looked at already, and what they route to by the fallback.
  std::map<model::SnapshotPtr, std::vector<model::IpAddr>> holdout_fallback_;
  // The last holdouts made, and what they were made from: unchanged inputs give the same list.
  std::string last_node_;
  std::set<model::IpAddr> last_fallback_;
  std::vector<std::pair<std::string, std::vector<pipeline::AckBoard::Holdout>>> last_clients_;
  HoldoutList last_holdouts_;
  // Per DNS consumer: (applied at, generation), oldest first, until the TTL passed.
  std::map<std::string, std::deque<std::pair<TimePoint, uint64_t>>> dns_applied_;
};

}  // namespace endpointd::drain
