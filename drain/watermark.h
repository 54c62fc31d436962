// The cluster watermark's pieces, pure: the position a resourceVersion names in the API
// server's write order, the aggregation tree every agent lays out alone from the same member
// list, and the coverage a report carries so that the root can tell that every live agent is
// in its minimum.
//
// Positions. The API calls resourceVersions opaque; endpointd compares them only where the API
// server itself orders them: the events of one watch arrive in resourceVersion order, and
// every API server in a cluster issues them from one counter (etcd's revision, written in
// decimal). An agent's watermark is the resourceVersion of the newest EndpointSlice event every
// one of its consumers has applied; the update that made an endpoint terminating carries one
// too. A value that is not a plain decimal number (an API server with another storage) makes
// parse_revision fail, and the drain then falls back to waiting, never to guessing.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/event.h"
#include "model/result.h"

namespace endpointd::drain {

using model::parse_revision;  // model/event.h: a resourceVersion as a position

// A well-mixed 64-bit hash of a node name (FNV-1a, then a SplitMix64 finalizer). Fixed for
// every agent and every version: the tree and the coverage digests depend on it.
uint64_t member_hash(std::string_view node);

// Who a report covers: how many agents and the XOR of their member_hash. Two coverages of the
// same set are equal; one that misses an agent or counts one twice differs (but for a 2^-64
// collision), so the root can check a minimum against the member list without the names.
struct Coverage {
  uint32_t count = 0;
  uint64_t digest = 0;
  void add(std::string_view node) {
    ++count;
    digest ^= member_hash(node);
  }
  void add(const Coverage& c) {
    count += c.count;
    digest ^= c.digest;
  }
  bool operator==(const Coverage&) const = default;
};

// The aggregation tree: the members in hash order (member_hash, then name), laid out as a heap
// of degree `fan_in` — member i's parent is member (i-1)/fan_in. Every agent computes the same
// tree from the same member list, with no coordination. Hash order, not name order, so that
// sequentially named nodes (one rack, one zone) are spread over the tree. An agent holds at most
// fan_in + 1 tree connections; the depth is ceil(log_fan_in(N(fan_in-1)+1)). When a member
// leaves, the members after it move one place, and about one in fan_in of them gets a new parent.
class Tree {
 public:
  Tree() = default;
  Tree(std::vector<std::string> members, size_t fan_in);

  size_t size() const { return order_.size(); }
  size_t fan_in() const { return fan_in_; }
  bool contains(std::string_view node) const { return pos_.find(node) != pos_.end(); }
  // Null for the root and for a node that is not a member.
  const std::string* parent(std::string_view node) const;
  std::vector<std::string> children(std::string_view node) const;
  // The first member in hash order; empty when there are none.
  const std::string& root() const;
  // Levels from the root to the deepest member (1 for a single member, 0 for none).
  size_t depth() const;
  // The coverage of every member: what the root must see to publish a minimum.
  const Coverage& coverage() const { return coverage_; }
  // The coverage of `node` and every member below it (empty for a non-member): what a report
  // from `node` must cover to count at its parent.
  Coverage subtree(std::string_view node) const;
  // `node`'s ancestors, its parent first, the root last (empty for the root or a non-member).
  std::vector<std::string> ancestors(std::string_view node) const;
  const std::vector<std::string>& members() const { return order_; }

 private:
  size_t fan_in_ = 2;
  std::vector<std::string> order_;
  std::map<std::string, size_t, std::less<>> pos_;
  Coverage coverage_;
};

}  // namespace endpointd::drain
