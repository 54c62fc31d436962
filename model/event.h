// Events from a source of cluster state to the update loop: an object added or changed, an
// object gone, or the complete current list of one kind (an initial list or a relist).
#pragma once

#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "model/objects.h"
#include "model/result.h"

namespace endpointd::model {

enum class ObjectKind : uint8_t { kService, kEndpointSlice, kNode, kPod };
std::string_view to_string(ObjectKind k);

using Object = std::variant<Service, EndpointSlice, Node, Pod>;
ObjectKind kind_of(const Object& o);
// ns/name; for a Node just the name.
std::string key_string(const Object& o);

struct Upsert {
  Object object;
};

struct Remove {
  ObjectKind kind = ObjectKind::kService;
  ObjectKey key;  // for a Node: ns empty, name set
};

// Everything of one kind that exists now. The Store reconciles against what it holds and
// changes only what really differs, so an object present before and after is never removed
// in between. A Replace also marks the kind as synced.
struct Replace {
  Replace() = default;
  Replace(ObjectKind k, std::vector<Object> o, std::vector<ObjectKey> kept = {})
      : kind(k), objects(std::move(o)), keep(std::move(kept)) {}
  ObjectKind kind = ObjectKind::kService;
  std::vector<Object> objects;
  // Objects that exist but could not be decoded this time: their last good version stays.
  std::vector<ObjectKey> keep;
};

// Several kinds replaced at once (a manifest directory re-read): applied as one change, so no
// snapshot ever shows one kind updated and another not.
struct ReplaceMany {
  std::vector<Replace> kinds;
};

// Several objects changed and removed at once (a re-read manifest file): one change, so no
// snapshot shows half of it.
struct Batch {
  std::vector<Object> upserts;
  std::vector<Remove> removes;
};

struct Event {
  std::variant<Upsert, Remove, Replace, ReplaceMany, Batch> change;
  // The source's position after this event, as the API server wrote it: the event's
  // resourceVersion, or a list's. Empty for sources without one (a manifest directory).
  std::string resource_version{};
  // When its source had it, on the source's steady clock: the start of the update loop's
  // event-to-snapshot latency. The source stamps it (model/ reads no clock); an event posted
  // without one (zero) is stamped by UpdateLoop::post.
  std::chrono::steady_clock::time_point received{};
};

// A resourceVersion as a position in the API server's write order: "12345" -> 12345. The API
// calls resourceVersions opaque; endpointd compares only those of one watch, which the API server
// delivers in order and issues from one counter (etcd's revision, in decimal). Empty, signs,
// non-digits, leading zeros, "0" (not a position: "any" in a request) and values past 2^64-1 are
// errors naming the value; the drain then waits instead of guessing.
Result<uint64_t> parse_revision(std::string_view rv);

}  // namespace endpointd::model
