// Merging a service's EndpointSlices into one endpoint list, and diffing snapshots.
#include "model/snapshot.h"

#include <algorithm>
#include <map>

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
  for (const auto* s : slices) st.trigger_time = std::max(st.trigger_time, s->trigger_time);

  // Order the endpoints by (address, rank), ties in slice order, on small sort keys: a
  // merged endpoint is large, and every service is merged at start.
  struct Item {
    IpAddr address;
    int rank;
    uint32_t slice;
    uint32_t index;
  };
  std::vector<Item> items;
  {
    size_t total = 0;
    for (const auto* s : slices) total += s->endpoints.size();
    items.reserve(total);
  }
  for (uint32_t si = 0; si < slices.size(); ++si) {
    const auto* s = slices[si];
    if (s->address_type == AddressType::kFQDN) continue;
    for (uint32_t ei = 0; ei < s->endpoints.size(); ++ei) {
      const auto& e = s->endpoints[ei];
      // Only the first address is used, as every Kubernetes consumer does.
      if (!e.addresses.empty()) items.push_back({e.addresses.front(), rank(e.conditions), si, ei});
    }
  }
  auto before = [](const Item& a, const Item& b) {
    if (a.address != b.address) return a.address < b.address;
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.slice != b.slice) return a.slice < b.slice;
    return a.index < b.index;
  };
  // Slices usually list their endpoints in order: then there is nothing to move.
  if (!std::is_sorted(items.begin(), items.end(), before))
    std::sort(items.begin(), items.end(), before);

  // One port list per slice, shared by its endpoints (made only for slices that have some).
  std::vector<std::optional<SharedVector<EndpointPort>>> ports(slices.size());
  st.endpoints.reserve(items.size());
  for (const Item& it : items) {
    const EndpointSlice& s = *slices[it.slice];
    auto& slice_ports = ports[it.slice];
    if (!slice_ports) slice_ports.emplace(s.ports);
    if (!st.endpoints.empty() && st.endpoints.back().address == it.address) {
      // Another copy of the address: the best-ranked one (kept) gets any port this one
      // carries that it lacks.
      auto& kept = st.endpoints.back();
      for (const auto& p : *slice_ports) {
        bool have = std::any_of(kept.ports.begin(), kept.ports.end(), [&](const EndpointPort& q) {
          return q.name == p.name && q.protocol == p.protocol;
        });
        if (!have) kept.ports.push_back(p);
      }
      continue;
    }
    const Endpoint& e = s.endpoints[it.index];
    MergedEndpoint& m = st.endpoints.emplace_back();
    m.address = it.address;
    m.conditions = e.conditions;
    m.ports = *slice_ports;
    m.hostname = e.hostname;
    m.node_name = e.node_name;
    m.zone = e.zone;
    m.hint_zones = e.hint_zones;
    m.hint_nodes = e.hint_nodes;
    m.target_ref = e.target_ref;
  }
  return st;
}

const ServiceState* Snapshot::find(const ServiceKey& key) const {
  const ServiceStatePtr* p = services.find(key);
  return p ? p->get() : nullptr;
}

ServiceStatePtr Snapshot::find_ptr(const ServiceKey& key) const {
  const ServiceStatePtr* p = services.find(key);
  return p ? *p : nullptr;
}

const Node* Snapshot::find_node(std::string_view name) const {
  auto it = find_sorted(nodes, name, [](const NodePtr& p) -> std::string_view { return p->name; });
  return it == nodes.end() ? nullptr : it->get();
}

const Pod* Snapshot::find_pod(const ObjectKey& key) const {
  auto it = find_sorted(pods, key, [](const PodPtr& p) -> const ObjectKey& { return p->key; });
  return it == pods.end() ? nullptr : it->get();
}

const Pod* Snapshot::find_node_pod(std::string_view node, const IpAddr& ip) const {
  for (const auto& p : pods) {
    if (p->node_name != node || p->host_network) continue;
    if (std::find(p->pod_ips.begin(), p->pod_ips.end(), ip) != p->pod_ips.end()) return p.get();
  }
  return nullptr;
}

Delta diff(const Snapshot* from, const Snapshot& to) {
  static const Snapshot kEmpty;
  const Snapshot& a = from ? *from : kEmpty;
  Delta d = diff_services(a.services, to.services);
  d.from_generation = a.generation;
  d.to_generation = to.generation;
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin());
  };
  d.nodes_changed = !same(a.nodes, to.nodes);
  d.pods_changed = !same(a.pods, to.pods);
  return d;
}

Delta diff_services(const ServiceList& from, const ServiceList& to) {
  Delta d;
  // Walk both lists; a chunk shared by both is skipped whole.
  const auto& ca = from.chunks();
  const auto& cb = to.chunks();
  size_t i = 0, ii = 0, j = 0, jj = 0;  // chunk and item positions
  auto at_a = [&]() -> const ServiceStatePtr& { return ca[i]->items[ii]; };
  auto at_b = [&]() -> const ServiceStatePtr& { return cb[j]->items[jj]; };
  auto next_a = [&] {
    if (++ii == ca[i]->items.size()) ++i, ii = 0;
  };
  auto next_b = [&] {
    if (++jj == cb[j]->items.size()) ++j, jj = 0;
  };
  while (i < ca.size() || j < cb.size()) {
    if (i < ca.size() && j < cb.size() && ii == 0 && jj == 0 && ca[i] == cb[j]) {
      ++i;
      ++j;
      continue;
    }
    if (j == cb.size() || (i < ca.size() && at_a()->key() < at_b()->key())) {
      d.removed.push_back(at_a()->key());
      next_a();
    } else if (i == ca.size() || at_b()->key() < at_a()->key()) {
      d.added.push_back(at_b()->key());
      next_b();
    } else {
      if (at_a() != at_b()) d.changed.push_back(at_b()->key());
      next_a();
      next_b();
    }
  }
  return d;
}

Delta merge(const Delta& first, const Delta& second) {
  // Per service, how it stands against first's base: a key added then removed is no change;
  // removed then added is a change.
  enum class Kind { kAdded, kChanged, kRemoved, kNone };
  std::map<ServiceKey, Kind> kinds;
  for (const auto& k : first.added) kinds[k] = Kind::kAdded;
  for (const auto& k : first.changed) kinds[k] = Kind::kChanged;
  for (const auto& k : first.removed) kinds[k] = Kind::kRemoved;
  auto then = [&](const ServiceKey& k, Kind next) {
    auto [it, fresh] = kinds.try_emplace(k, next);
    if (fresh) return;
    Kind before = it->second;
    if (before == Kind::kAdded) {
      it->second = next == Kind::kRemoved ? Kind::kNone : Kind::kAdded;
    } else if (before == Kind::kRemoved) {
      it->second = next == Kind::kRemoved ? Kind::kRemoved : Kind::kChanged;
    } else if (before == Kind::kChanged) {
      it->second = next == Kind::kRemoved ? Kind::kRemoved : Kind::kChanged;
    } else {
      it->second = next;
    }
  };
  for (const auto& k : second.added) then(k, Kind::kAdded);
  for (const auto& k : second.changed) then(k, Kind::kChanged);
  for (const auto& k : second.removed) then(k, Kind::kRemoved);
  Delta d;
  d.from_generation = first.from_generation;
  d.to_generation = second.to_generation;
  for (const auto& [k, kind] : kinds) {  // sorted by key, as diff's lists are
    if (kind == Kind::kAdded) d.added.push_back(k);
    if (kind == Kind::kChanged) d.changed.push_back(k);
    if (kind == Kind::kRemoved) d.removed.push_back(k);
  }
  d.nodes_changed = first.nodes_changed || second.nodes_changed;
  d.pods_changed = first.pods_changed || second.pods_changed;
  return d;
}

}  // namespace endpointd::model
