// Store bookkeeping: objects by key, the slice → service index, and which services must be
// rebuilt in the next snapshot.
#include "pipeline/store.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>

namespace endpointd::pipeline {

using model::ObjectKind;

namespace {

bool slice_event(const std::variant<model::Upsert, model::Remove, model::Replace,
                                    model::ReplaceMany, model::Batch>& change) {
  if (const auto* u = std::get_if<model::Upsert>(&change))
    return model::kind_of(u->object) == ObjectKind::kEndpointSlice;
  if (const auto* r = std::get_if<model::Remove>(&change))
    return r->kind == ObjectKind::kEndpointSlice;
  if (const auto* r = std::get_if<model::Replace>(&change))
    return r->kind == ObjectKind::kEndpointSlice;
  return false;
}

}  // namespace

size_t Store::KeyHash::operator()(const model::ObjectKey& k) const noexcept {
  const size_t a = std::hash<std::string_view>{}(k.ns);
  const size_t b = std::hash<std::string_view>{}(k.name);
  return a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
}

Store::Store(std::set<ObjectKind> expected) : expected_(std::move(expected)) {}

bool Store::synced() const {
  return std::includes(listed_.begin(), listed_.end(), expected_.begin(), expected_.end());
}

bool Store::pending() const {
  return !dirty_.empty() || nodes_dirty_ || pods_dirty_ || synced_changed_ ||
         slice_revision_ != built_revision_;
}

void Store::touch(const model::ServiceKey& key) {
  if (!dirty_.insert(key).second || relisting_) skipped_.insert(key);
}

void Store::upsert(model::Service&& s) {
  auto it = services_.find(s.key);
  if (it != services_.end() && it->second.equal_spec(s)) {
    it->second.resource_version = std::move(s.resource_version);
    return;
  }
  touch(s.key);
  services_.insert_or_assign(s.key, std::move(s));
}

void Store::upsert(model::EndpointSlice&& s) {
  if (s.service_name.empty()) {
    remove(ObjectKind::kEndpointSlice, s.key);
    return;
  }
  auto it = slices_.find(s.key);
  if (it != slices_.end()) {
    if (it->second.equal_content(s)) {
      // A relist that finds a slice rewritten with what it held before: the writes in between
      // (an endpoint unready and ready again) were states this store never saw.
      if (relisting_ && it->second.resource_version != s.resource_version)
        touch(it->second.service_key());
      it->second.resource_version = std::move(s.resource_version);
      return;
    }
    auto old_svc = it->second.service_key();
    if (old_svc != s.service_key()) {  // the slice moved to another service
      auto& set = slices_by_service_[old_svc];
      set.erase(s.key);
      if (set.empty()) slices_by_service_.erase(old_svc);
      touch(old_svc);
    }
  }
  auto svc = s.service_key();
  slices_by_service_[svc].insert(s.key);
  touch(svc);
  slices_.insert_or_assign(s.key, std::move(s));
}

void Store::upsert(model::Node&& n) {
  auto it = nodes_.find(n.name);
  if (it != nodes_.end() && it->second->equal_content(n)) return;
  nodes_dirty_ = true;
  auto name = n.name;
  nodes_.insert_or_assign(std::move(name), std::make_shared<const model::Node>(std::move(n)));
}

void Store::upsert(model::Pod&& p) {
  auto it = pods_.find(p.key);
  if (it != pods_.end() && it->second->equal_content(p)) return;
  pods_dirty_ = true;
  auto key = p.key;
  pods_.insert_or_assign(std::move(key), std::make_shared<const model::Pod>(std::move(p)));
}

void Store::remove(ObjectKind kind, const model::ObjectKey& key) {
  switch (kind) {
    case ObjectKind::kService:
      if (services_.erase(key)) touch(key);
      break;
    case ObjectKind::kEndpointSlice: {
      auto it = slices_.find(key);
      if (it == slices_.end()) break;
      auto svc = it->second.service_key();
      auto& set = slices_by_service_[svc];
      set.erase(key);
      if (set.empty()) slices_by_service_.erase(svc);
      slices_.erase(it);
      touch(svc);
      break;
    }
    case ObjectKind::kNode:
      if (nodes_.erase(key.name)) nodes_dirty_ = true;
      break;
    case ObjectKind::kPod:
      if (pods_.erase(key)) pods_dirty_ = true;
      break;
  }
}

void Store::replace(model::Replace&& r) {
  // Collect the keys of the new list, drop what is not in it, then upsert everything: the
  // upserts compare with what is held, so only real differences mark anything dirty. Nothing
  // of the kind held yet (the first list): nothing to drop, and no set of every key to build.
  bool held = false;
  switch (r.kind) {
    case ObjectKind::kService:
      held = !services_.empty();
      break;
    case ObjectKind::kEndpointSlice:
      held = !slices_.empty();
      break;
    case ObjectKind::kNode:
      held = !nodes_.empty();
      break;
    case ObjectKind::kPod:
      held = !pods_.empty();
      break;
  }
  if (!held && r.kind == ObjectKind::kService) services_.reserve(r.objects.size());
  if (!held && r.kind == ObjectKind::kEndpointSlice) slices_.reserve(r.objects.size());
  std::set<model::ObjectKey> keep;
  if (held) keep.insert(r.keep.begin(), r.keep.end());
  for (size_t i = 0; held && i < r.objects.size(); ++i) {
    const auto& o = r.objects[i];
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, model::Node>)
            keep.insert({"", x.name});
          else
            keep.insert(x.key);
        },
        o);
  }
  std::vector<model::ObjectKey> gone;
  switch (r.kind) {
    case ObjectKind::kService:
      for (const auto& [k, v] : services_)
        if (!keep.count(k)) gone.push_back(k);
      break;
    case ObjectKind::kEndpointSlice:
      for (const auto& [k, v] : slices_)
        if (!keep.count(k)) gone.push_back(k);
      break;
    case ObjectKind::kNode:
      for (const auto& [k, v] : nodes_)
        if (!keep.count({"", k})) gone.push_back({"", k});
      break;
    case ObjectKind::kPod:
      for (const auto& [k, v] : pods_)
        if (!keep.count(k)) gone.push_back(k);
      break;
  }
  relisting_ = held;
  for (const auto& k : gone) remove(r.kind, k);
  for (auto& o : r.objects)
    if (model::kind_of(o) == r.kind)
      std::visit([&](auto&& x) { upsert(std::move(x)); }, std::move(o));
  relisting_ = false;
  if (listed_.insert(r.kind).second) synced_changed_ = true;
}

void Store::apply(model::Event&& ev) {
  // The EndpointSlice watch's position: its events arrive in resourceVersion order, so the
  // newest one seen is a position every earlier slice event is behind. Other kinds' positions
  // come from other watches and say nothing about slices.
  if (!ev.resource_version.empty() && slice_event(ev.change)) {
    if (auto rv = model::parse_revision(ev.resource_version); rv.ok())
      slice_revision_ = std::max(slice_revision_, rv.value());
  }
  std::visit(
      [&](auto&& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, model::Upsert>) {
          std::visit([&](auto&& x) { upsert(std::move(x)); }, std::move(c.object));
        } else if constexpr (std::is_same_v<T, model::Remove>) {
          remove(c.kind, c.key);
        } else if constexpr (std::is_same_v<T, model::Replace>) {
          replace(std::move(c));
        } else if constexpr (std::is_same_v<T, model::ReplaceMany>) {
          for (auto& r : c.kinds) replace(std::move(r));
        } else {
          for (const auto& r : c.removes) remove(r.kind, r.key);
          for (auto& o : c.upserts)
            std::visit([&](auto&& x) { upsert(std::move(x)); }, std::move(o));
        }
      },
      std::move(ev.change));
}

model::SnapshotPtr Store::build(const model::SnapshotPtr& prev) {
  static const model::Snapshot kEmpty;
  const model::Snapshot& p = prev ? *prev : kEmpty;
  auto next = std::make_shared<model::Snapshot>();
  bool changed = false;

  // Services: rebuild the dirty ones; every chunk of the list without one is shared.
  std::vector<std::pair<model::ServiceKey, model::ServiceStatePtr>> changes;
  size_t endpoints = p.endpoints;
  // Each dirty service's state is built from the held objects alone (read, never changed
  // here), so when there are many (the first lists: every service) they are built on a few
  // threads at once, then compared and taken in key order as one by one.
  std::vector<const model::ServiceKey*> keys;
  keys.reserve(dirty_.size());
  for (const auto& key : dirty_) keys.push_back(&key);
  std::vector<std::optional<model::ServiceState>> built(keys.size());
  std::atomic<size_t> next_key{0};
  auto build_some = [&] {
    std::vector<const model::EndpointSlice*> slices;
    for (size_t i; (i = next_key.fetch_add(1)) < keys.size();) {
      auto svc = services_.find(*keys[i]);
      if (svc == services_.end()) continue;
      slices.clear();
      if (auto idx = slices_by_service_.find(*keys[i]); idx != slices_by_service_.end())
        for (const auto& sk : idx->second) slices.push_back(&slices_.at(sk));
      built[i] = model::build_service_state(svc->second, slices);
    }
  };
  constexpr size_t kServicesPerThread = 2048;  // below this a thread costs more than it saves
  size_t threads = std::min<size_t>(
      {std::max(1u, std::thread::hardware_concurrency()), keys.size() / kServicesPerThread + 1, 4});
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(build_some);
    } catch (const std::system_error&) {
      break;  // no thread to be had: this one builds the rest
    }
  }
  build_some();
  for (auto& t : helpers) t.join();
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& key = *keys[i];
    model::ServiceStatePtr old = p.find_ptr(key);
    if (!built[i]) {
      if (old) {
        endpoints -= old->endpoints.size();
        changes.emplace_back(key, nullptr);
      }
      continue;
    }
    auto& state = *built[i];
    const bool direct = !skipped_.count(key);
    // Same content: keep the old pointer, so sinks see no change — unless states were merged
    // in between, which a reader of `follows` must hear of.
    if (old && direct && old->service.equal_spec(state.service) &&
        old->endpoints == state.endpoints)
      continue;
    state.revision = slice_revision_;
    state.follows = old && direct ? old->revision : 0;
    if (old) endpoints -= old->endpoints.size();
    endpoints += state.endpoints.size();
    changes.emplace_back(key, std::make_shared<const model::ServiceState>(std::move(state)));
  }
  dirty_.clear();
  skipped_.clear();
  if (!changes.empty()) changed = true;
  next->services = p.services.with(changes);
  next->endpoints = endpoints;

  if (nodes_dirty_) {
    next->nodes.reserve(nodes_.size());
    for (const auto& [name, n] : nodes_) next->nodes.push_back(n);
    changed = changed || next->nodes != p.nodes;
    nodes_dirty_ = false;
  } else {
    next->nodes = p.nodes;
  }
  if (pods_dirty_) {
    next->pods.reserve(pods_.size());
    for (const auto& [key, pod] : pods_) next->pods.push_back(pod);
    changed = changed || next->pods != p.pods;
    pods_dirty_ = false;
  } else {
    next->pods = p.pods;
  }
  next->synced = synced();
  if (next->synced != p.synced) changed = true;
  synced_changed_ = false;
  next->slice_revision = slice_revision_;
  if (slice_revision_ != p.slice_revision) changed = true;
  built_revision_ = slice_revision_;
  if (!changed && prev) return prev;
  next->generation = p.generation + 1;
  return next;
}

}  // namespace endpointd::pipeline
