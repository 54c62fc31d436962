// The Kubernetes API client: one watcher per kind, each on its own thread, and the loop that
// decides how a watcher gets its kind's state (list or WatchList), when it watches and how long
// it waits after a failure. The parts of a watcher are in kube_watcher.h.
#include "watcher/kube_client.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <random>

#include "watcher/backoff.h"
#include "watcher/decode.h"
#include "watcher/kube_watcher.h"

#ifndef ENDPOINTD_VERSION
#define ENDPOINTD_VERSION "dev"
#endif

namespace endpointd::watcher {

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

}  // namespace

uint64_t KindStats::reconnects_total() const {
  uint64_t n = 0;
  for (const auto& [_, v] : reconnects) n += v;
  return n;
}

uint64_t KindStats::reconnect_count(const std::string& reason) const {
  auto it = reconnects.find(reason);
  return it == reconnects.end() ? 0 : it->second;
}

std::string_view to_string(ListMode m) {
  switch (m) {
    case ListMode::kAuto:
      return "auto";
    case ListMode::kList:
      return "list";
    case ListMode::kCache:
      return "cache";
  }
  return "auto";
}

std::string_view collection_path(model::ObjectKind kind) {
  switch (kind) {
    case model::ObjectKind::kService:
      return "/api/v1/services";
    case model::ObjectKind::kEndpointSlice:
      return "/apis/discovery.k8s.io/v1/endpointslices";
    case model::ObjectKind::kNode:
      return "/api/v1/nodes";
    case model::ObjectKind::kPod:
      return "/api/v1/pods";
  }
  return "";
}

KubeClient::Shared::Shared(ClusterConfig c, KubeClientConfig cfg, Sink s,
                           prometheus::Registry& registry)
    : cluster(std::move(c)),
      config(std::move(cfg)),
      sink(std::move(s)),
      tokens(cluster),
      events(prometheus::BuildCounter()
                 .Name("endpointd_watch_events_total")
                 .Help("Watch events received from the API server, by kind and type")
                 .Register(registry)),
      relists(prometheus::BuildCounter()
                  .Name("endpointd_watch_relists_total")
                  .Help("Complete lists after the first one (410 Gone, restarts)")
                  .Register(registry)),
      reconnects(prometheus::BuildCounter()
                     .Name("endpointd_watch_reconnects_total")
                     .Help("Watch or list requests that ended and were retried, by reason")
                     .Register(registry)),
      decode_errors(prometheus::BuildCounter()
                        .Name("endpointd_decode_errors_total")
                        .Help("Objects refused because they did not decode")
                        .Register(registry)),
      watch_list_fallbacks(
          prometheus::BuildCounter()
              .Name("endpointd_watch_list_fallbacks_total")
              .Help("WatchLists given up for lists, by kind and reason (refused: the API "
                    "server's WatchList is off; no_end / not_offered: it sent no end of the "
                    "initial events; behind: the state was older than the one held)")
              .Register(registry)),
      bookmarks(prometheus::BuildCounter()
                    .Name("endpointd_watch_bookmarks_total")
                    .Help("Watch bookmarks received")
                    .Register(registry)),
      stalls(prometheus::BuildCounter()
                 .Name("endpointd_watch_stalls_total")
                 .Help("Watches abandoned because nothing arrived on them for the stall "
                       "timeout; each is re-established from its last resourceVersion")
                 .Register(registry)),
      // client-go's request metrics, under its names, labels and buckets.
      requests(prometheus::BuildCounter()
                   .Name("rest_client_requests_total")
                   .Help("Number of HTTP requests, partitioned by status code, method, and host.")
                   .Register(registry)),
      request_duration(prometheus::BuildHistogram()
                           .Name("rest_client_request_duration_seconds")
                           .Help("Request latency in seconds. Broken down by verb, and host.")
                           .Register(registry)),
      response_size(prometheus::BuildHistogram()
                        .Name("rest_client_response_size_bytes")
                        .Help("Response size in bytes. Broken down by verb and host.")
                        .Register(registry)) {
  user_agent =
      config.user_agent.empty() ? std::string("endpointd/") + ENDPOINTD_VERSION : config.user_agent;
  while (!cluster.server.empty() && cluster.server.back() == '/') cluster.server.pop_back();
  host = url_host(cluster.server);
}

void KubeClient::Shared::count_request(long status, Clock::duration latency,
                                       std::optional<size_t> response_bytes) {
  static const prometheus::Histogram::BucketBoundaries kLatency = {
      0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0};
  static const prometheus::Histogram::BucketBoundaries kSize = {
      64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216};
  requests
      .Add({{"code", status > 0 ? std::to_string(status) : std::string("<error>")},
            {"method", "GET"},
            {"host", host}})
      .Increment();
  request_duration.Add({{"verb", "GET"}, {"host", host}}, kLatency)
      .Observe(std::chrono::duration<double>(latency).count());
  if (response_bytes)
    response_size.Add({{"verb", "GET"}, {"host", host}}, kSize)
        .Observe(static_cast<double>(*response_bytes));
}

KubeClient::Watcher::Watcher(std::shared_ptr<Shared> shared, model::ObjectKind kind, uint64_t seed)
    : shared_(std::move(shared)),
      kind_(kind),
      kind_name_(model::to_string(kind)),
      rng_(seed),
      easy_(curl_easy_init()),
      multi_(curl_multi_init()),
      line_buffer_(kMaxObjectBytes + 64 * 1024),
      added_(shared_->events.Add({{"kind", kind_name_}, {"type", "ADDED"}})),
      modified_(shared_->events.Add({{"kind", kind_name_}, {"type", "MODIFIED"}})),
      deleted_(shared_->events.Add({{"kind", kind_name_}, {"type", "DELETED"}})),
      error_events_(shared_->events.Add({{"kind", kind_name_}, {"type", "ERROR"}})),
      relists_(shared_->relists.Add({{"kind", kind_name_}})),
      decode_errors_(shared_->decode_errors.Add({{"kind", kind_name_}})),
      bookmarks_(shared_->bookmarks.Add({{"kind", kind_name_}})),
      stalls_(shared_->stalls.Add({{"kind", kind_name_}})) {
  const auto& c = shared_->cluster;
  ca_data_ = c.ca_data;
  cert_data_ = c.client_cert_data;
  key_data_ = c.client_key_data;
  base_url_ = c.server + std::string(collection_path(kind));
  // Services and slices labelled service.kubernetes.io/service-proxy-name are listed too:
  // only the dataplane leaves them to that proxy (model::has_proxy_rules); DNS and the feed
  // serve them, as CoreDNS does.
  if (kind == model::ObjectKind::kPod && !shared_->config.pods_cluster_wide) {
    selectors_ = "&fieldSelector=" + query_escape("spec.nodeName=" + shared_->config.node_name);
  }
  if (kind == model::ObjectKind::kNode && shared_->config.own_node_only)
    selectors_ = "&fieldSelector=" + query_escape("metadata.name=" + shared_->config.node_name);
}

// --- stats and metrics -----------------------------------------------------------------

void KubeClient::Watcher::count_reconnect(const std::string& reason) {
  shared_->reconnects.Add({{"kind", kind_name_}, {"reason", reason}}).Increment();
  std::lock_guard lock(stats_mu_);
  stats_.reconnects[reason]++;
}

void KubeClient::Watcher::count_decode_error(const std::string& what) {
  spdlog::warn("kube {}: rejected {}", kind_name_, what);
  decode_errors_.Increment();
  std::lock_guard lock(stats_mu_);
  stats_.decode_errors++;
}

void KubeClient::Watcher::set_resource_version(const std::string& rv) {
  resource_version_ = rv;
  std::lock_guard lock(stats_mu_);
  stats_.resource_version = rv;
}

void KubeClient::Watcher::post(model::Event ev) {
  ev.received = Clock::now();  // each event is made just before it is posted
  shared_->sink(std::move(ev));
}

// Another node's pod (watched cluster-wide for DNS's verified pod records) keeps what DNS
// and the routing rules read of it: its key, node, addresses, phase and deletion; its labels
// and annotations (drain's, for this node's pods only) are dropped, for memory.
void KubeClient::Watcher::slim(model::Object& o) const {
  auto* p = std::get_if<model::Pod>(&o);
  if (!p || p->node_name == shared_->config.node_name) return;
  p->labels.clear();
  p->annotations.clear();
}

// --- the loop --------------------------------------------------------------------------

milliseconds KubeClient::Watcher::backoff_delay(int failures, std::optional<seconds> retry_after) {
  return watcher::backoff_delay(shared_->config, failures, retry_after, rng_);
}

milliseconds KubeClient::Watcher::spread(milliseconds d) {
  return watcher::spread(d, rng_);
}

void KubeClient::Watcher::count_watch_list_fallback(const std::string& reason) {
  shared_->watch_list_fallbacks.Add({{"kind", kind_name_}, {"reason", reason}}).Increment();
  std::lock_guard lock(stats_mu_);
  stats_.watch_list_fallbacks[reason]++;
}

void KubeClient::Watcher::run() {
  // The first state of a process: a consistent one (no version) unless the mode says any.
  // A relist after an expired watch asks for one not older than the last version seen, so
  // that the state never goes back in time. With kCache the first list may be older than a
  // state this agent held before it restarted: one whose endpoint removal it had confirmed
  // is then back in its dataplane, DNS and feed until the watch catches up — which is why
  // kAuto falls back to consistent lists, not to this.
  const ListMode mode = shared_->config.list_mode;
  bool watch_list = mode == ListMode::kAuto;
  int failures = 0;
  bool force_token = false;
  ListFrom from = mode == ListMode::kCache ? ListFrom::kAny : ListFrom::kConsistent;
  while (!shared_->stop.load()) {
    bool initial = false;
    if (need_list_) {
      if (!watch_list) {
        if (!list(force_token, from, failures)) return;
        if (need_list_) continue;
      } else {
        initial = true;
      }
    }
    WatchResult w = watch_once(force_token, initial, from);
    force_token = false;
    if (w.end == WatchEnd::kStopped) return;
    if (w.state_posted) {
      need_list_ = false;
      from = ListFrom::kConsistent;
    }
    if (w.progress) failures = 0;
    std::optional<milliseconds> delay;
    switch (w.end) {
      case WatchEnd::kNotOffered:
        count_watch_list_fallback(w.reason);
        // A lagging server's state (behind) is listed once; a server without WatchList is
        // listed from now on.
        if (w.reason == "behind") {
          if (!list(force_token, from, failures)) return;
        } else {
          watch_list = false;
        }
        continue;
      case WatchEnd::kExpired:
        count_reconnect("expired");
        need_list_ = true;
        from = ListFrom::kNotOlderThan;  // nothing older than what this agent has seen
        delay = w.progress ? spread(shared_->config.relist_spread)
                           : backoff_delay(failures++, std::nullopt);
        break;
      case WatchEnd::kClosed:
        count_reconnect("closed");
        if (!w.progress) delay = backoff_delay(failures++, std::nullopt);
        break;
      case WatchEnd::kFailed:
        count_reconnect(w.reason);
        force_token = w.unauthorized;
        if (w.version_unavailable) {
          from = ListFrom::kConsistent;
          delay = spread(shared_->config.backoff_initial);
          break;
        }
        if (!w.progress) delay = backoff_delay(failures++, w.retry_after);
        break;
      case WatchEnd::kStopped:
        return;
    }
    if (delay && !shared_->sleep_for(*delay)) return;
  }
}

KubeClient::KubeClient(ClusterConfig cluster, KubeClientConfig config, Sink sink,
                       prometheus::Registry& registry) {
  curl_init_once();
  uint64_t seed = config.seed;
  if (seed == 0) seed = std::random_device{}();
  std::vector<model::ObjectKind> kinds;
  if (config.watch_services) kinds.push_back(model::ObjectKind::kService);
  if (config.watch_endpoint_slices) kinds.push_back(model::ObjectKind::kEndpointSlice);
  if (config.watch_nodes) kinds.push_back(model::ObjectKind::kNode);
  if (config.watch_pods) {
    if (config.node_name.empty()) {
      spdlog::warn("kube: not watching pods: no node name");
    } else {
      kinds.push_back(model::ObjectKind::kPod);
    }
  }
  shared_ =
      std::make_shared<Shared>(std::move(cluster), std::move(config), std::move(sink), registry);
  for (size_t i = 0; i < kinds.size(); ++i) {
    watchers_.push_back(std::make_unique<Watcher>(shared_, kinds[i], seed + i));
  }
}

KubeClient::~KubeClient() {
  stop();
}

void KubeClient::start() {
  if (started_) return;
  started_ = true;
  spdlog::info("kube: watching {} ({})", shared_->cluster.server, shared_->cluster.origin);
  for (auto& w : watchers_) w->start();
}

void KubeClient::stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard lock(shared_->sleep_mu);
    shared_->stop.store(true);
  }
  shared_->sleep_cv.notify_all();
  for (auto& w : watchers_) w->wake();
  for (auto& w : watchers_) w->join();
}

bool KubeClient::synced() const {
  for (const auto& w : watchers_) {
    if (!w->stats().synced) return false;
  }
  return true;
}

KindStats KubeClient::stats(model::ObjectKind kind) const {
  for (const auto& w : watchers_) {
    if (w->kind() == kind) return w->stats();
  }
  return {};
}

std::vector<model::ObjectKind> KubeClient::kinds() const {
  std::vector<model::ObjectKind> out;
  for (const auto& w : watchers_) out.push_back(w->kind());
  return out;
}

}  // namespace endpointd::watcher
