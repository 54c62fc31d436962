// The Store: every object endpointd knows, by key, and the next Snapshot built from it.
// Owned by the update loop's thread alone; not thread-safe by design (a build of many
// services spreads their states over a few threads of its own, reading the held objects only).
#pragma once

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/snapshot.h"

namespace endpointd::pipeline {

class Store {
 public:
  // `expected` are the kinds that must each have been listed once before the state counts as
  // synced (a Replace of that kind marks it).
  explicit Store(std::set<model::ObjectKind> expected);

  void apply(model::Event&& ev);
  // Something changed since the last build().
  bool pending() const;
  // The next snapshot: `prev` plus what changed, generation prev+1. Returns `prev` itself
  // when nothing a consumer can see changed.
  model::SnapshotPtr build(const model::SnapshotPtr& prev);

  size_t service_count() const { return services_.size(); }
  size_t slice_count() const { return slices_.size(); }
  bool synced() const;

 private:
  void upsert(model::Service&& s);
  void upsert(model::EndpointSlice&& s);
  void upsert(model::Node&& n);
  void upsert(model::Pod&& p);
  void remove(model::ObjectKind kind, const model::ObjectKey& key);
  void replace(model::Replace&& r);

  std::set<model::ObjectKind> expected_;
  std::set<model::ObjectKind> listed_;
  bool synced_changed_ = true;

  // Hashed, not ordered: nothing walks these in key order (dirty_ gives the order a build
  // needs), and at 10k services the ordered maps' key comparisons were a third of applying
  // the first list. A service's slices stay ordered: that order is the merge order.
  struct KeyHash {
    size_t operator()(const model::ObjectKey& k) const noexcept;
  };
  std::unordered_map<model::ServiceKey, model::Service, KeyHash> services_;
  std::unordered_map<model::ObjectKey, model::EndpointSlice, KeyHash> slices_;
  std::unordered_map<model::ServiceKey, std::set<model::ObjectKey>, KeyHash> slices_by_service_;
  std::map<std::string, model::NodePtr> nodes_;
  std::map<model::ObjectKey, model::PodPtr> pods_;

  // Marks `key` changed since the last build. A second change before the build (or one made
  // by a relist, which may hide states the watch never delivered) makes the next state one
  // that does not directly follow the last (ServiceState::follows = 0).
  void touch(const model::ServiceKey& key);

  std::set<model::ServiceKey> dirty_;
  std::set<model::ServiceKey> skipped_;  // dirty services whose states in between were merged
  bool relisting_ = false;               // in replace() over held objects
  bool nodes_dirty_ = false;
  bool pods_dirty_ = false;
  uint64_t slice_revision_ = 0;  // the EndpointSlice watch's position (0: none known)
  uint64_t built_revision_ = 0;  // ... as of the last build()
};

}  // namespace endpointd::pipeline
