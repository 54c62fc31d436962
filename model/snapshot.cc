// Merging a service's EndpointSlices into one endpoint list, and diffing snapshots.
#include "model/snapshot.h"

#include <algorithm>

namespace endpointd::model {

std::optional<uint16_t> MergedEndpoint::port_for(const ServicePort& sp) const {
  for (const auto& p : ports)
    if (p.name == sp.name && p.protocol == sp.protocol) return p.port;
  return std::nullopt;
}

const MergedEndpoint* ServiceState::find(const IpAddr& a) const {
  auto it =
      std::lower_bound(endpoints.begin(), endpoints.end(), a,
                       [](const MergedEndpoint& e, const IpAddr& x) { return e.address < x; });
  if (it == endpoints.end() || it->address != a) return nullptr;
  return &*it;
}

namespace {

// Lower rank wins when two slices carry the same address: a copy that is not terminating
// beats one that is (the endpoint moved to a new slice while the old one is rewritten), then
// a ready copy beats a not-ready one.
int rank(const EndpointConditions& c) {
  return (c.terminating ? 2 : 0) + (c.ready ? 0 : 1);
}

template <typename Vec, typename Key>
auto find_sorted(const Vec& v, const Key& key, auto key_of) -> decltype(v.begin()) {
  auto it = std::lower_bound(v.begin(), v.end(), key,
                             [&](const auto& e, const Key& k) { return key_of(e) < k; });
  if (it != v.end() && !(key_of(*it) == key)) return v.end();
  return it;
}

}  // namespace

ServiceState build_service_state(const Service& svc,
                                 const std::vector<const EndpointSlice*>& slices) {
  ServiceState st;
  st.service = svc;
  if (svc.type == ServiceType::kExternalName) return st;  // no endpoints by definition

  size_t total = 0;
  for (const auto* s : slices) total += s->endpoints.size();
  st.endpoints.reserve(total);
  for (const auto* s : slices) {
    if (s->address_type == AddressType::kFQDN) continue;
    for (const auto& e : s->endpoints) {
      if (e.addresses.empty()) continue;
      // Only the first address is used, as every Kubernetes consumer does.
      MergedEndpoint m;
      m.address = e.addresses.front();
      m.conditions = e.conditions;
      m.ports = s->ports;
      m.hostname = e.hostname;
      m.node_name = e.node_name;
      m.zone = e.zone;
      m.hint_zones = e.hint_zones;
      m.hint_nodes = e.hint_nodes;
      m.target_ref = e.target_ref;
      st.endpoints.push_back(std::move(m));
    }
  }
  std::stable_sort(st.endpoints.begin(), st.endpoints.end(),
                   [](const MergedEndpoint& a, const MergedEndpoint& b) {
                     if (a.address != b.address) return a.address < b.address;
                     return rank(a.conditions) < rank(b.conditions);
                   });
  // De-duplicate: keep the best-ranked copy of each address and give it any port the others
  // carried that it lacks.
  std::vector<MergedEndpoint> out;
  out.reserve(st.endpoints.size());
  for (auto& e : st.endpoints) {
    if (!out.empty() && out.back().address == e.address) {
      auto& kept = out.back();
      for (const auto& p : e.ports) {
        bool have = std::any_of(kept.ports.begin(), kept.ports.end(), [&](const EndpointPort& q) {
          return q.name == p.name && q.protocol == p.protocol;
        });
        if (!have) kept.ports.push_back(p);
      }
      continue;
    }
    out.push_back(std::move(e));
  }
  st.endpoints = std::move(out);
  return st;
}

const ServiceState* Snapshot::find(const ServiceKey& key) const {
  auto it = find_sorted(services, key,
                        [](const ServiceStatePtr& p) -> const ServiceKey& { return p->key(); });
  return it == services.end() ? nullptr : it->get();
}

ServiceStatePtr Snapshot::find_ptr(const ServiceKey& key) const {
  auto it = find_sorted(services, key,
                        [](const ServiceStatePtr& p) -> const ServiceKey& { return p->key(); });
  return it == services.end() ? nullptr : *it;
}

const Node* Snapshot::find_node(std::string_view name) const {
  auto it = find_sorted(nodes, name, [](const NodePtr& p) -> std::string_view { return p->name; });
  return it == nodes.end() ? nullptr : it->get();
}

const Pod* Snapshot::find_pod(const ObjectKey& key) const {
  auto it = find_sorted(pods, key, [](const PodPtr& p) -> const ObjectKey& { return p->key; });
  return it == pods.end() ? nullptr : it->get();
}

size_t Snapshot::endpoint_count() const {
  size_t n = 0;
  for (const auto& s : services) n += s->endpoints.size();
  return n;
}

Delta diff(const Snapshot* from, const Snapshot& to) {
  Delta d;
  d.to_generation = to.generation;
  static const Snapshot kEmpty;
  const Snapshot& a = from ? *from : kEmpty;
  d.from_generation = a.generation;
  size_t i = 0, j = 0;
  while (i < a.services.size() || j < to.services.size()) {
    if (j == to.services.size() ||
        (i < a.services.size() && a.services[i]->key() < to.services[j]->key())) {
      d.removed.push_back(a.services[i++]->key());
    } else if (i == a.services.size() || to.services[j]->key() < a.services[i]->key()) {
      d.added.push_back(to.services[j++]->key());
    } else {
      if (a.services[i] != to.services[j]) d.changed.push_back(to.services[j]->key());
      ++i;
      ++j;
    }
  }
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin());
  };
  d.nodes_changed = !same(a.nodes, to.nodes);
  d.pods_changed = !same(a.pods, to.pods);
  return d;
}

}  // namespace endpointd::model
