// ProxySink: planner -> backend batch -> acknowledgement, with full resyncs on failure.
#include "proxy/sink.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <optional>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "model/routing.h"
#include "proxy/frontends.h"
#include "proxy/healthcheck.h"

namespace endpointd::proxy {

namespace {
// An endpoint that may still carry traffic by the routing rule (a fallback included): its
// conntrack entries stay.
bool usable(const model::Service& svc, const model::MergedEndpoint& e) {
  return model::routing_of(svc, e.conditions) != model::Routing::kNone;
}

std::set<std::pair<model::IpAddr, uint16_t>> used_targets(const model::ServiceState* st,
                                                          const model::ServicePort& sp) {
  std::set<std::pair<model::IpAddr, uint16_t>> out;
  if (!st) return out;
  for (const auto& e : st->endpoints) {
    auto p = model::backend_port(e, sp);
    if (p && usable(st->service, e)) out.emplace(e.address, *p);
  }
  return out;
}

const model::ServicePort* same_port(const model::ServiceState* st, const model::ServicePort& sp) {
  if (!st) return nullptr;
  for (const auto& p : st->service.ports) {
    if (p.name == sp.name && p.protocol == sp.protocol) return &p;
  }
  return nullptr;
}
}  // namespace

std::vector<FlowMatch> stale_udp_flows(const model::ServiceState* before,
                                       const model::ServiceState* after) {
  std::vector<FlowMatch> out;
  if (before) {
    for (const auto& sp : before->service.ports) {
      if (sp.protocol != model::Protocol::kUDP) continue;
      const auto* now_port = same_port(after, sp);
      auto now = now_port ? used_targets(after, *now_port) : decltype(used_targets(after, sp)){};
      for (const auto& [addr, port] : used_targets(before, sp)) {
        if (!now.count({addr, port})) out.push_back(udp_to_endpoint(addr, port));
      }
    }
  }
  if (after) {
    for (const auto& sp : after->service.ports) {
      if (sp.protocol != model::Protocol::kUDP || used_targets(after, sp).empty()) continue;
      const auto* old_port = same_port(before, sp);
      if (old_port && !used_targets(before, *old_port).empty()) continue;
      const auto& svc = after->service;
      // Every address, on any node address for a NodePort (the flows may be to any of them).
      for (const Frontend& f : frontends(svc, sp, {}))
        out.push_back(udp_to_service(f.addr, f.port));
      if (auto np = node_port(svc, sp)) out.push_back(udp_to_node_port(*np));
    }
  }
  return out;
}

UdpServiceIndex::UdpServiceIndex(const model::Snapshot& snap, const NodeContext& node) {
  // The addresses the planner serves NodePorts on.
  std::vector<model::IpAddr> node_port_ips = proxy::node_port_ips(node);
  for (const auto& st : snap.services) {
    const model::Service& svc = st->service;
    if (!model::has_proxy_rules(svc)) continue;
    for (const auto& sp : svc.ports) {
      if (sp.protocol != model::Protocol::kUDP || sp.port == 0) continue;
      auto targets = std::make_shared<Targets>();
      for (const auto& e : st->endpoints) {
        auto p = model::backend_port(e, sp);
        if (p && usable(svc, e)) targets->push_back({e.address, *p});
      }
      std::sort(targets->begin(), targets->end());
      std::shared_ptr<const Targets> shared = std::move(targets);
      for (const Frontend& f : frontends(svc, sp, node_port_ips)) add({f.addr, f.port}, shared);
    }
  }
}

void UdpServiceIndex::add(const Key& k, const std::shared_ptr<const Targets>& targets) {
  auto [it, inserted] = by_address_.emplace(k, targets);
  if (inserted || it->second == targets) return;
  // Two services on one address and port (a conflict the API allows for external IPs): an
  // entry bound to an endpoint of either is kept.
  auto both = std::make_shared<Targets>(*it->second);
  both->insert(both->end(), targets->begin(), targets->end());
  std::sort(both->begin(), both->end());
  both->erase(std::unique(both->begin(), both->end()), both->end());
  it->second = std::move(both);
}

bool UdpServiceIndex::stale(const Flow& f) const {
  if (f.l4proto != ip_protocol_number(model::Protocol::kUDP)) return false;
  auto it = by_address_.find({f.orig_dst, f.orig_dst_port});
  if (it == by_address_.end()) return false;
  const Targets& targets = *it->second;
  bool dnat = f.reply_src != f.orig_dst || f.reply_src_port != f.orig_dst_port;
  if (!dnat) return !targets.empty();
  return !std::binary_search(targets.begin(), targets.end(), Key{f.reply_src, f.reply_src_port});
}

// kube-proxy's metrics carry `ip_family` (kube-proxy 1.33): one series per family, indexed by
// Planner::family_index. One endpointd commit programs every family of the node at once, so a
// sync's duration, time stamps and failures count under each family the node has; per-service
// figures under the families the service has addresses of.
struct ProxySink::Metrics {
  using PerFamily = std::array<prometheus::Histogram*, 2>;
  PerFamily sync{}, full{}, partial{}, programming{};
  prometheus::Histogram* queued_to_commit = nullptr;
  std::array<prometheus::Gauge*, 2> last_sync{}, last_queued{};
  prometheus::Gauge* elements_v4 = nullptr;
  prometheus::Gauge* elements_v6 = nullptr;
  std::array<prometheus::Gauge*, 2> no_local_internal{}, no_local_external{};
  std::array<prometheus::Counter*, 2> endpoint_changes{}, service_changes{};
  std::array<prometheus::Gauge*, 2> endpoint_pending{}, service_pending{};
  std::array<prometheus::Counter*, 2> failures{};
  prometheus::Counter* skipped = nullptr;
  prometheus::Counter* rejected = nullptr;
  prometheus::Counter* conntrack_deleted = nullptr;
  prometheus::Counter* conntrack_failures = nullptr;
  // kube-proxy's conntrack reconciler names: the entries deleted per family, and each
  // cleanup's time (one walk covers both families: observed under each family of the node).
  std::array<prometheus::Counter*, 2> reconciler_deleted{};
  PerFamily reconciler_duration{};
  prometheus::Counter* elements_full = nullptr;
  prometheus::Counter* elements_partial = nullptr;
};

namespace {
double seconds(ProxySink::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// `fn(metric, family_index)` for each family's series the node has.
template <typename Metric>
void each(const std::array<Metric*, 2>& m, auto&& fn) {
  for (size_t f = 0; f < 2; ++f)
    if (m[f]) fn(*m[f], f);
}
}  // namespace

ProxySink::ProxySink(Backend* backend, pipeline::AckBoard* board, Options opts)
    : backend_(backend),
      board_(board),
      opts_(std::move(opts)),
      metrics_(std::make_unique<Metrics>()),
      planner_(std::make_unique<Planner>(opts_.node)) {
  if (opts_.process_start == std::chrono::system_clock::time_point{})
    opts_.process_start = std::chrono::system_clock::now();
  rng_ = opts_.jitter_seed ? opts_.jitter_seed
                           : static_cast<uint32_t>(Clock::now().time_since_epoch().count()) | 1;
  if (board_) board_->add("proxy", model::RouteView::kDataplane);
  if (auto* r = opts_.registry) {
    prometheus::Histogram::BucketBoundaries b = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                 0.1,    0.25,  0.5,    1,     2.5,  5,     10};
    auto hist = [&](const char* name, const char* help) {
      return &prometheus::BuildHistogram().Name(name).Help(help).Register(*r).Add({}, b);
    };
    auto counter = [&](const char* name, const char* help) {
      return &prometheus::BuildCounter().Name(name).Help(help).Register(*r).Add({});
    };
    // One series per family the node has, labelled as kube-proxy labels them (a family the
    // node lacks has none: an alert on a stale time stamp must not fire for it).
    const std::array<bool, 2> has = {opts_.node.ipv4, opts_.node.ipv6};
    const char* kFamily[2] = {"IPv4", "IPv6"};
    auto per_family = [&](auto& family, std::map<std::string, std::string> labels, auto... args) {
      std::array<std::remove_reference_t<decltype(family.Add(labels, args...))>*, 2> out{};
      for (size_t f = 0; f < 2; ++f) {
        if (!has[f]) continue;
        auto l = labels;
        l["ip_family"] = kFamily[f];
        out[f] = &family.Add(l, args...);
      }
      return out;
    };
    auto hist2 = [&](const char* name, const char* help) {
      return per_family(prometheus::BuildHistogram().Name(name).Help(help).Register(*r),
                        std::map<std::string, std::string>{}, b);
    };
    auto gauge2 = [&](const char* name, const char* help) {
      return per_family(prometheus::BuildGauge().Name(name).Help(help).Register(*r),
                        std::map<std::string, std::string>{});
    };
    auto counter2 = [&](const char* name, const char* help) {
      return per_family(prometheus::BuildCounter().Name(name).Help(help).Register(*r),
                        std::map<std::string, std::string>{});
    };
    metrics_->sync = hist2("kubeproxy_sync_proxy_rules_duration_seconds",
                           "Time to apply one update to the kernel.");
    metrics_->full =
        hist2("kubeproxy_sync_full_proxy_rules_duration_seconds", "Time of a full sync.");
    metrics_->partial = hist2("kubeproxy_sync_partial_proxy_rules_duration_seconds",
                              "Time of an incremental sync.");
    // kube-proxy's buckets for it: 0.25 s to 5 min.
    prometheus::Histogram::BucketBoundaries programming = {0.25, 0.5};
    for (int i = 1; i <= 59; ++i) programming.push_back(i);
    for (int i = 60; i <= 115; i += 5) programming.push_back(i);
    for (int i = 120; i <= 300; i += 30) programming.push_back(i);
    metrics_->programming = per_family(
        prometheus::BuildHistogram()
            .Name("kubeproxy_network_programming_duration_seconds")
            .Help("From an EndpointSlice's last-change-trigger-time to the kernel committing the "
                  "rules for it, per service and change.")
            .Register(*r),
        std::map<std::string, std::string>{}, programming);
    metrics_->queued_to_commit =
        hist("endpointd_proxy_queued_to_commit_duration_seconds",
             "From an update being handed to the proxy to its batch committed.");
    metrics_->last_sync = gauge2("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                                 "Last successful sync (unix time).");
    metrics_->last_queued = gauge2("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                                   "Last update queued to the proxy (unix time).");
    auto& elems = prometheus::BuildGauge()
                      .Name("kubeproxy_sync_proxy_rules_nftables_elements")
                      .Help("Map and set elements in endpointd's nftables tables.")
                      .Register(*r);
    metrics_->elements_v4 = &elems.Add({{"table", "ip"}});
    metrics_->elements_v6 = &elems.Add({{"table", "ip6"}});
    auto& nolocal = prometheus::BuildGauge()
                        .Name("kubeproxy_sync_proxy_rules_no_local_endpoints_total")
                        .Help("Services with a Local traffic policy and no endpoint on this node.")
                        .Register(*r);
    metrics_->no_local_internal = per_family(nolocal, {{"traffic_policy", "internal"}});
    metrics_->no_local_external = per_family(nolocal, {{"traffic_policy", "external"}});
    metrics_->endpoint_changes =
        counter2("kubeproxy_sync_proxy_rules_endpoint_changes_total", "Endpoint changes applied.");
    metrics_->service_changes =
        counter2("kubeproxy_sync_proxy_rules_service_changes_total", "Service changes applied.");
    metrics_->endpoint_pending = gauge2("kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                                        "Endpoint changes not yet applied.");
    metrics_->service_pending = gauge2("kubeproxy_sync_proxy_rules_service_changes_pending",
                                       "Service changes not yet applied.");
    metrics_->failures = counter2("kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                                  "Batches the kernel rejected.");
    metrics_->skipped =
        counter("endpointd_proxy_skipped_total",
                "Service ports or addresses skipped because the kernel cannot take them.");
    metrics_->rejected =
        counter("endpointd_proxy_rejected_services_total",
                "Service updates the nftables tables cannot hold, left at their previous rules.");
    metrics_->conntrack_deleted =
        counter("endpointd_proxy_conntrack_deleted_total", "Stale UDP conntrack entries deleted.");
    metrics_->conntrack_failures = counter("endpointd_proxy_conntrack_cleanup_failures_total",
                                           "UDP conntrack cleanups that failed.");
    metrics_->reconciler_deleted =
        counter2("kubeproxy_conntrack_reconciler_deleted_entries_total",
                 "Stale UDP conntrack entries deleted, by the entry's family.");
    metrics_->reconciler_duration =
        hist2("kubeproxy_conntrack_reconciler_sync_duration_seconds",
              "Time of one UDP conntrack cleanup: the sweep after a full sync, or the entries of "
              "the endpoints a batch removed (one walk of the table for both families).");
    auto& written = prometheus::BuildCounter()
                        .Name("endpointd_proxy_elements_written_total")
                        .Help(
                            "Set and map elements committed batches added or deleted; a full "
                            "sync sends only what differs from the kernel's listing (a restart "
                            "over rules already right adds 0).")
                        .Register(*r);
    metrics_->elements_full = &written.Add({{"sync", "full"}});
    metrics_->elements_partial = &written.Add({{"sync", "partial"}});
  }
  resync_ = std::thread([this] { resync_loop(); });
}

ProxySink::~ProxySink() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (resync_.joinable()) resync_.join();
  // Never flush on exit: the rules keep serving while the agent restarts.
}

void ProxySink::note_queued(Clock::time_point t) {
  std::lock_guard<std::mutex> l(mu_);
  if (last_queued_ <= last_applied_) last_queued_ = t;
  double now = seconds(std::chrono::system_clock::now().time_since_epoch());
  each(metrics_->last_queued, [&](prometheus::Gauge& m, size_t) { m.Set(now); });
}

bool ProxySink::healthy(Clock::time_point now) const {
  std::lock_guard<std::mutex> l(mu_);
  return !(last_queued_ > last_applied_ && now - last_queued_ > opts_.health_timeout);
}

void ProxySink::request_resync() {
  {
    std::lock_guard<std::mutex> l(mu_);
    need_full_ = true;
    attempt_ = 0;
    next_try_ = Clock::now();
  }
  cv_.notify_all();
}

void ProxySink::set_host_addresses(std::vector<model::IpAddr> ips) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (opts_.node.node_ips == ips) return;
    opts_.node.node_ips = std::move(ips);
    if (!latest_) return;  // the first sync plans from them
    NodeContext c = node_context_from(opts_.node, *latest_);
    if (c == planner_->context()) return;
    spdlog::info("proxy: the host's addresses changed ({} node IPs): full sync", c.node_ips.size());
    planner_->set_context(std::move(c));
    need_full_ = true;
    attempt_ = 0;
    next_try_ = Clock::now();
  }
  cv_.notify_all();
}

bool ProxySink::wait_idle(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_until(l, deadline, [&] { return !need_full_ && latest_ == applied_; });
}

namespace {
// Services whose spec changed and services whose endpoints changed from `old` to `snap`, over
// the services `d` names (kube-proxy's service and endpoint change counts).
// The families a service has addresses of (its service addresses, else its endpoints'), as
// Planner::family_index bits: kube-proxy counts a change under each family's proxier.
unsigned families_of(const model::ServiceState* st) {
  unsigned bits = 0;
  if (!st) return 0;
  for (const Frontend& a : service_addresses(st->service))
    bits |= 1u << Planner::family_index(a.addr.family());
  if (bits == 0)
    for (const auto& e : st->endpoints) bits |= 1u << Planner::family_index(e.address.family());
  return bits;
}

struct ChangeCounts {
  std::array<uint64_t, 2> services{}, endpoints{};  // by family_index
};

// Services whose spec changed and services whose endpoints changed from `old` to `snap`, over
// the services `d` names (kube-proxy's service and endpoint change counts), per family.
ChangeCounts change_counts(const model::Snapshot* old, const model::Snapshot& snap,
                           const model::Delta& d) {
  ChangeCounts c;
  auto compare = [&](const model::ServiceKey& k) {
    const auto* a = old ? old->find(k) : nullptr;
    const auto* b = snap.find(k);
    unsigned fams = families_of(a) | families_of(b);
    bool svc = !a || !b || !a->service.equal_spec(b->service);
    bool eps = (!a || !b) ? (a && !a->endpoints.empty()) || (b && !b->endpoints.empty())
                          : !(a->endpoints == b->endpoints);
    for (size_t f = 0; f < 2; ++f) {
      if (!(fams & (1u << f))) continue;
      c.services[f] += svc;
      c.endpoints[f] += eps;
    }
  };
  for (const auto& k : d.added) compare(k);
  for (const auto& k : d.changed) compare(k);
  for (const auto& k : d.removed) compare(k);
  return c;
}
}  // namespace

void ProxySink::count_changes(const model::Snapshot* old, const model::Snapshot& snap,
                              const model::Delta& d) {
  ChangeCounts c = change_counts(old, snap, d);
  each(metrics_->service_changes,
       [&](prometheus::Counter& m, size_t f) { m.Increment(static_cast<double>(c.services[f])); });
  each(metrics_->endpoint_changes,
       [&](prometheus::Counter& m, size_t f) { m.Increment(static_cast<double>(c.endpoints[f])); });
}

void ProxySink::publish_pending() {
  ChangeCounts c;
  if (latest_ && latest_ != applied_) c = change_counts(applied_.get(), *latest_, pending_);
  each(metrics_->service_pending,
       [&](prometheus::Gauge& m, size_t f) { m.Set(static_cast<double>(c.services[f])); });
  each(metrics_->endpoint_pending,
       [&](prometheus::Gauge& m, size_t f) { m.Set(static_cast<double>(c.endpoints[f])); });
}

void ProxySink::record_success(const model::SnapshotPtr& snap, bool full,
                               Clock::time_point started) {
  auto now = Clock::now();
  applied_ = snap;
  last_applied_ = now;
  attempt_ = 0;
  publish_pending();
  const PlanStats& stats = planner_->last_stats();
  uint64_t skipped = stats.skipped;
  if (skipped) {
    skipped_ += skipped;
    for (const auto& why : stats.skip_reasons) spdlog::warn("proxy: skipped {}", why);
  }
  if (stats.rejected) {
    rejected_ += stats.rejected;
    for (const auto& why : stats.rejections) {
      spdlog::error("proxy: generation {}: service {}; it keeps the rules it had before",
                    snap->generation, why);
    }
  }
  if (metrics_->queued_to_commit) {
    double took = seconds(now - started);
    double wall = seconds(std::chrono::system_clock::now().time_since_epoch());
    each(metrics_->sync, [&](prometheus::Histogram& m, size_t) { m.Observe(took); });
    each(full ? metrics_->full : metrics_->partial,
         [&](prometheus::Histogram& m, size_t) { m.Observe(took); });
    if (last_queued_ != Clock::time_point{})
      metrics_->queued_to_commit->Observe(seconds(now - last_queued_));
    each(metrics_->last_sync, [&](prometheus::Gauge& m, size_t) { m.Set(wall); });
    metrics_->elements_v4->Set(static_cast<double>(planner_->table(IpFamily::kV4).element_count()));
    metrics_->elements_v6->Set(static_cast<double>(planner_->table(IpFamily::kV6).element_count()));
    const IpFamily fam[2] = {IpFamily::kV4, IpFamily::kV6};
    each(metrics_->no_local_internal, [&](prometheus::Gauge& m, size_t f) {
      m.Set(static_cast<double>(planner_->no_local_internal(fam[f])));
    });
    each(metrics_->no_local_external, [&](prometheus::Gauge& m, size_t f) {
      m.Set(static_cast<double>(planner_->no_local_external(fam[f])));
    });
    each(metrics_->endpoint_pending, [](prometheus::Gauge& m, size_t) { m.Set(0); });
    each(metrics_->service_pending, [](prometheus::Gauge& m, size_t) { m.Set(0); });
    if (skipped) metrics_->skipped->Increment(static_cast<double>(skipped));
    if (stats.rejected) metrics_->rejected->Increment(static_cast<double>(stats.rejected));
  }
  if (board_) board_->applied("proxy", snap);
}

bool ProxySink::full_sync_locked(const model::SnapshotPtr& snap) {
  auto started = Clock::now();
  planner_->reset(*snap, /*helper=*/true);
  const auto planned = Clock::now();
  std::vector<const Table*> tables;
  for (IpFamily f : planner_->families()) tables.push_back(&planner_->table(f));
  auto r = backend_->full_sync(tables);
  const auto synced = Clock::now();
  ++full_syncs_;
  if (!r) {
    ++failures_;
    each(metrics_->failures, [](prometheus::Counter& m, size_t) { m.Increment(); });
    // Bounded, jittered exponential backoff before the next attempt.
    auto base = opts_.backoff_min * (1 << std::min(attempt_, 16));
    if (base > opts_.backoff_max) base = opts_.backoff_max;
    rng_ = rng_ * 1103515245u + 12345u;
    double jitter = 0.5 + static_cast<double>((rng_ >> 8) % 1000) / 1000.0;  // 0.5x .. 1.5x
    ++attempt_;
    // From the failure, not from the attempt's start: planning a large state can take longer
    // than the backoff itself, and the kernel would then be retried back to back.
    next_try_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(base * jitter);
    need_full_ = true;
    spdlog::error("proxy: full sync of generation {} failed (attempt {}): {}", snap->generation,
                  attempt_, r.error());
    return false;
  }
  need_full_ = false;
  synced_ = true;
  // Elements changed: what the kernel held differed by this many (0 after a restart over rules
  // already right).
  spdlog::info(
      "proxy: full sync of generation {}: {} elements changed, {} messages, {} bytes ({} sets "
      "listed, {} left alone by their digests; {} ms planning, {} ms listing, encoding and "
      "committing)",
      snap->generation, r->elements, r->messages, r->bytes, r->sets_listed, r->sets_unchanged,
      std::chrono::duration_cast<std::chrono::milliseconds>(planned - started).count(),
      std::chrono::duration_cast<std::chrono::milliseconds>(synced - planned).count());
  if (metrics_->elements_full) metrics_->elements_full->Increment(static_cast<double>(r->elements));
  model::SnapshotPtr before = applied_;
  // What changed since the kernel last had a whole generation: the deltas given since then,
  // merged (none when the full sync repairs a foreign change to the same generation).
  model::Delta since = before && before != snap ? pending_ : model::Delta{};
  record_success(snap, true, started);
  after_commit(before.get(), *snap, since, true);
  return true;
}

bool ProxySink::follow_node(const model::Snapshot& snap) {
  NodeContext c = node_context_from(opts_.node, snap);
  if (c == planner_->context()) return false;
  spdlog::info("proxy: node {} changed (zone '{}', {} node IPs): full sync", c.node_name, c.zone,
               c.node_ips.size());
  planner_->set_context(std::move(c));
  return true;
}

void ProxySink::observe_programming(const model::Snapshot* before, const model::Snapshot& now,
                                    const model::Delta& d) {
  auto at = std::chrono::system_clock::now();
  auto consider = [&](const model::ServiceKey& k, bool observe) {
    const auto* st = now.find(k);
    if (!st) {
      last_trigger_.erase(k);
      return;
    }
    auto trigger = st->trigger_time;
    if (trigger == std::chrono::system_clock::time_point{} || trigger < opts_.process_start) return;
    auto [it, inserted] = last_trigger_.try_emplace(k, trigger);
    if (!inserted) {
      if (trigger <= it->second) return;  // observed already: the change was something else
      it->second = trigger;
    }
    if (observe) {
      unsigned fams = families_of(st);
      double took = std::max(0.0, std::chrono::duration<double>(at - trigger).count());
      each(metrics_->programming, [&](prometheus::Histogram& m, size_t f) {
        if (fams & (1u << f)) m.Observe(took);
      });
    }
  };
  if (!before) {
    for (const auto& st : now.services) consider(st->key(), false);
    return;
  }
  for (const auto& k : d.added) consider(k, true);
  for (const auto& k : d.changed) consider(k, true);
  for (const auto& k : d.removed) last_trigger_.erase(k);
}

void ProxySink::after_commit(const model::Snapshot* before, const model::Snapshot& now,
                             const model::Delta& delta, bool full) {
  const model::Delta& d = delta;
  observe_programming(before, now, d);
  bool health = full || d.nodes_changed;
  std::vector<FlowMatch> stale;
  auto local_hc = [](const model::ServiceState* s) {
    return s && s->service.external_traffic_policy == model::TrafficPolicy::kLocal &&
           s->service.health_check_node_port != 0;
  };
  auto visit = [&](const model::ServiceKey& k) {
    const auto* a = before ? before->find(k) : nullptr;
    const auto* b = now.find(k);
    health = health || local_hc(a) || local_hc(b);
    if (opts_.conntrack) {
      auto m = stale_udp_flows(a, b);
      stale.insert(stale.end(), m.begin(), m.end());
    }
  };
  for (const auto& k : d.added) visit(k);
  for (const auto& k : d.changed) visit(k);
  for (const auto& k : d.removed) visit(k);
  // The sweep: after a full sync (the first one of this process included, when entries to
  // endpoints that left while the agent was down are still there), every UDP entry to a served
  // address is checked against the endpoints now, in the same walk as the delta's matches.
  // Only over a synced snapshot: a partial one would make every live entry look stale.
  bool sweep = opts_.conntrack && now.synced && (full || !swept_);
  std::optional<UdpServiceIndex> index;
  if (sweep) {
    index.emplace(now, planner_->context());
    // The sweep decides precisely for every served address; of the delta's matches only those
    // for endpoints that left stay (a removed service is no longer in the index). The delta's
    // "had no endpoints" matches would also take entries bound to endpoints in use.
    std::erase_if(stale, [](const FlowMatch& m) { return !m.reply_src; });
    if (index->empty() && stale.empty()) {
      swept_ = true;
      sweep = false;
    }
  }
  if (sweep || !stale.empty()) {
    auto started = Clock::now();
    Result<DeletedFlows> r = sweep ? opts_.conntrack->delete_flows_if([&](const Flow& f) {
      return index->stale(f) || std::any_of(stale.begin(), stale.end(),
                                            [&](const FlowMatch& m) { return m.matches(f); });
    })
                                   : opts_.conntrack->delete_flows(stale);
    const double took = seconds(Clock::now() - started);
    each(metrics_->reconciler_duration, [&](prometheus::Histogram& h, size_t) { h.Observe(took); });
    if (!r) {
      ++conntrack_failures_;
      if (metrics_->conntrack_failures) metrics_->conntrack_failures->Increment();
      spdlog::warn("proxy: UDP conntrack cleanup for generation {} failed: {}", now.generation,
                   r.error());
    } else {
      if (sweep) {
        swept_ = true;
        spdlog::log(r->total() ? spdlog::level::info : spdlog::level::debug,
                    "proxy: UDP conntrack sweep of generation {} ({} service addresses): {} stale "
                    "entries deleted in {:.1f} ms",
                    now.generation, index->addresses(), r->total(),
                    std::chrono::duration<double, std::milli>(Clock::now() - started).count());
      }
      conntrack_deleted_ += r->total();
      if (metrics_->conntrack_deleted)
        metrics_->conntrack_deleted->Increment(static_cast<double>(r->total()));
      // An entry of a family the node has no series for (none is programmed) counts in the
      // total only.
      each(metrics_->reconciler_deleted, [&](prometheus::Counter& c, size_t f) {
        c.Increment(static_cast<double>(f == 0 ? r->ipv4 : r->ipv6));
      });
    }
  }
  if (opts_.health_checks && health)
    opts_.health_checks->update(now, planner_->context().node_name);
}

void ProxySink::apply(const model::SnapshotPtr& snap, const model::Delta& delta) {
  std::unique_lock<std::mutex> l(mu_);
  if (last_queued_ <= last_applied_) last_queued_ = Clock::now();
  model::SnapshotPtr old = latest_;
  latest_ = snap;
  // pending_: from what the kernel has (applied_) to latest_. The update loop's deltas chain,
  // so after a failed batch they are merged rather than the snapshots diffed again.
  pending_ = old == applied_ ? delta : model::merge(pending_, delta);
  count_changes(old.get(), *snap, delta);
  publish_pending();  // until the kernel has it (record_success publishes again)
  // As kube-proxy: nothing is programmed before the first full state (every kind listed) has
  // arrived. The kernel keeps what it has meanwhile (the previous agent's rules, after a
  // restart), and the first state is one full sync rather than a partial table followed by
  // incremental updates of thousands of services (at 10k services: seconds).
  if (!applied_ && !snap->synced) return;
  if ((delta.nodes_changed || !applied_) && follow_node(*snap)) {
    need_full_ = true;
    attempt_ = 0;
  }
  if (need_full_) {
    // The resync thread owns retries; the first sync (or one requested) happens here at once.
    if (attempt_ == 0) full_sync_locked(snap);
    cv_.notify_all();
    return;
  }
  auto started = Clock::now();
  const model::Delta& d = pending_;
  auto changes = planner_->update(*snap, d);
  if (changes.empty()) {
    model::SnapshotPtr before = applied_;
    record_success(snap, false, started);
    after_commit(before.get(), *snap, d, false);
    cv_.notify_all();
    return;
  }
  if (!backend_->fits(changes)) {
    // A set outgrew the size it was made with: a full sync makes it anew, larger (the set
    // doubles each time, so this is rare).
    spdlog::info("proxy: generation {} outgrows a set's size: full sync", snap->generation);
    full_sync_locked(snap);
    cv_.notify_all();
    return;
  }
  auto r = backend_->apply(changes);
  if (!r) {
    ++failures_;
    each(metrics_->failures, [](prometheus::Counter& m, size_t) { m.Increment(); });
    spdlog::error("proxy: batch for generation {} rejected: {}; full resync", snap->generation,
                  r.error());
    need_full_ = true;  // the planner's model is ahead of the kernel now
    attempt_ = 0;
    next_try_ = Clock::now();
    cv_.notify_all();
    return;
  }
  if (metrics_->elements_partial)
    metrics_->elements_partial->Increment(static_cast<double>(r->elements));
  model::SnapshotPtr before = applied_;
  record_success(snap, false, started);
  after_commit(before.get(), *snap, d, false);
  cv_.notify_all();
}

void ProxySink::resync_loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    if (need_full_ && latest_ && (applied_ || latest_->synced)) {
      if (Clock::now() >= next_try_) {
        full_sync_locked(latest_);
        cv_.notify_all();
        continue;
      }
      cv_.wait_until(l, next_try_);
      continue;
    }
    cv_.wait(l);
  }
}

}  // namespace endpointd::proxy
