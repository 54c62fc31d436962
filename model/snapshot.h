// Snapshot: the immutable, generation-numbered view of the cluster that every sink applies.
// Per service a shared ServiceState (spec + merged endpoints); an unchanged service is the
// same pointer in the next snapshot, so a Delta is cheap to compute and to act on.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/objects.h"
#include "model/service_list.h"

namespace endpointd::model {

// One endpoint of a service after all its slices are merged: one address, the ports its
// slice gave it, and its conditions.
struct MergedEndpoint {
  IpAddr address;
  EndpointConditions conditions;
  SharedVector<EndpointPort> ports;  // shared by the endpoints of one slice
  std::string hostname;
  std::string node_name;
  std::string zone;
  // Shared with the slice's endpoint.
  SharedVector<std::string> hint_zones;
  SharedVector<std::string> hint_nodes;
  Shared<ObjectRef> target_ref;
  friend bool operator==(const MergedEndpoint&, const MergedEndpoint&) = default;

  // The endpoint's port for a service port: matched by name as kube-proxy does.
  std::optional<uint16_t> port_for(const ServicePort& sp) const;
};

struct ServiceState {
  Service service;
  // Sorted by address, one entry per address (the non-terminating copy preferred).
  std::vector<MergedEndpoint> endpoints;
  // The newest last-change-trigger-time among its EndpointSlices (zero: none carried one):
  // where kube-proxy's network programming duration starts.
  std::chrono::system_clock::time_point trigger_time{};
  // The EndpointSlice position of the snapshot this state first appeared in, and that of the
  // state it directly follows: one update from it, with no state in between that any watch
  // could have seen (0: unknown — several updates merged into one build, or a relist after a
  // gap). A reader that held the state at `follows` saw every state of the service; one that
  // held another may have missed some (drain/'s terminating fallback check needs to know).
  uint64_t revision = 0;
  uint64_t follows = 0;
  const ServiceKey& key() const { return service.key; }
  const MergedEndpoint* find(const IpAddr& a) const;
};

using NodePtr = std::shared_ptr<const Node>;
using PodPtr = std::shared_ptr<const Pod>;

struct Snapshot {
  uint64_t generation = 0;
  bool synced = false;  // every source has delivered its first full list
  // The EndpointSlice watch's position this snapshot includes: every slice event up to this
  // resourceVersion (model::parse_revision) is in it. 0 for sources without resourceVersions.
  uint64_t slice_revision = 0;
  // Sorted by key, in shared chunks: the next snapshot shares what did not change.
  ServiceList services;
  // Merged endpoints over all services, kept by the builder.
  size_t endpoints = 0;
  std::vector<NodePtr> nodes;  // sorted by name
  std::vector<PodPtr> pods;    // sorted by key

  const ServiceState* find(const ServiceKey& key) const;
  ServiceStatePtr find_ptr(const ServiceKey& key) const;
  const Node* find_node(std::string_view name) const;
  const Pod* find_pod(const ObjectKey& key) const;
  // The pod of `node` (not host-network) that has address `ip`: who an address on a node is.
  const Pod* find_node_pod(std::string_view node, const IpAddr& ip) const;
  size_t endpoint_count() const { return endpoints; }
};

using SnapshotPtr = std::shared_ptr<const Snapshot>;

struct Delta {
  uint64_t from_generation = 0;
  uint64_t to_generation = 0;
  std::vector<ServiceKey> added;
  std::vector<ServiceKey> changed;
  std::vector<ServiceKey> removed;
  bool nodes_changed = false;
  bool pods_changed = false;
  bool empty() const {
    return added.empty() && changed.empty() && removed.empty() && !nodes_changed && !pods_changed;
  }
};

// The difference between two snapshots, by pointer identity first and value second. A null
// `from` means everything in `to` is added.
Delta diff(const Snapshot* from, const Snapshot& to);
// The services' part of it (added, changed, removed; nothing else set): a chunk both lists
// share is skipped whole, so it costs what changed, for a reader that keeps only the services.
Delta diff_services(const ServiceList& from, const ServiceList& to);

// The delta from `first.from_generation` to `second.to_generation`, where `second` follows
// `first`: what a sink that missed some generations must act on, without diffing snapshots.
Delta merge(const Delta& first, const Delta& second);

// Builds one service's state from its spec and every slice that belongs to it.
ServiceState build_service_state(const Service& svc,
                                 const std::vector<const EndpointSlice*>& slices);

}  // namespace endpointd::model
