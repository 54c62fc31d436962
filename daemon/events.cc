// Events on pods: the recorder's limits and queue, and the drain events from the coordinator's
// published state.
#include "daemon/events.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <simdjson.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "watcher/yaml_json.h"

namespace endpointd::daemon {

namespace {

std::string quote(std::string_view s) {
  std::string out;
  watcher::append_json_string(out, s);
  return out;
}

// Kubernetes MicroTime: RFC 3339 with microseconds, UTC.
std::string micro_time(std::chrono::system_clock::time_point t) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  time_t secs = static_cast<time_t>(us / 1000000);
  tm parts{};
  gmtime_r(&secs, &parts);
  char b[40];
  size_t n = std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%S", &parts);
  std::snprintf(b + n, sizeof b - n, ".%06lldZ", static_cast<long long>(us % 1000000));
  return b;
}

// The API server refuses a note over 1 KiB.
std::string bounded_note(std::string s) {
  if (s.size() > 1024) {
    s.resize(1021);
    s += "...";
  }
  return s;
}

constexpr unsigned kToldRemoved = 1, kToldReleased = 2;

}  // namespace

std::string event_json(const PodEvent& e, const std::string& name, const std::string& node,
                       std::chrono::system_clock::time_point at) {
  return R"({"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":)" + quote(name) +
         R"(,"namespace":)" + quote(e.ns) + R"(},"eventTime":)" + quote(micro_time(at)) +
         R"(,"reportingController":"endpointd.io/agent","reportingInstance":)" + quote(node) +
         R"(,"action":)" + quote(e.action) + R"(,"reason":)" + quote(e.reason) +
         R"(,"regarding":{"apiVersion":"v1","kind":"Pod","namespace":)" + quote(e.ns) +
         R"(,"name":)" + quote(e.pod) + (e.uid.empty() ? "" : R"(,"uid":)" + quote(e.uid)) +
         R"(},"note":)" + quote(bounded_note(e.note)) + R"(,"type":)" + quote(e.type) + "}";
}

EventRecorder::EventRecorder(EventRecorderOptions opts, Send send)
    : opts_(std::move(opts)), send_(std::move(send)) {
  if (opts_.registry)
    metric_ = &prometheus::BuildCounter()
                   .Name("endpointd_events_total")
                   .Help(
                       "Kubernetes Events on pods, by result: written, patched (a repeat into "
                       "its series), dropped_queue, dropped_rate_limit, failed (the API server "
                       "refused or did not answer)")
                   .Register(*opts_.registry);
  global_.tokens = opts_.global_burst;
  global_.at = now();
  thread_ = std::thread([this] { run(); });
}

EventRecorder::~EventRecorder() {
  stop();
}

void EventRecorder::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::chrono::system_clock::time_point EventRecorder::now() const {
  return opts_.clock ? opts_.clock() : std::chrono::system_clock::now();
}

bool EventRecorder::take(Bucket& b, double burst, double per_second,
                         std::chrono::system_clock::time_point t) {
  if (b.at == std::chrono::system_clock::time_point{}) {
    b.tokens = burst;
    b.at = t;
  }
  double secs = std::chrono::duration<double>(t - b.at).count();
  if (secs > 0) b.tokens = std::min(burst, b.tokens + secs * per_second);
  b.at = std::max(b.at, t);
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

void EventRecorder::count(const char* result, uint64_t Counts::*field) {
  ++(counts_.*field);
  if (metric_) metric_->Add({{"result", result}}).Increment();
}

void EventRecorder::record(PodEvent e) {
  std::unique_lock lock(mu_);
  if (stopping_) return;
  auto t = now();
  double object_rate =
      1000.0 / static_cast<double>(std::max<int64_t>(1, opts_.object_refill.count()));
  Bucket& obj = objects_[e.ns + "/" + e.pod + "/" + e.uid];
  // The object's bucket first: a pod that floods does not use up the others' global tokens.
  if (!take(obj, opts_.object_burst, object_rate, t) ||
      !take(global_, opts_.global_burst, opts_.global_per_second, t)) {
    count("dropped_rate_limit", &Counts::dropped_rate_limit);
    return;
  }
  if (queue_.size() >= opts_.queue) {
    count("dropped_queue", &Counts::dropped_queue);
    return;
  }
  // Buckets of objects idle long enough to be full again are forgotten (bounded memory).
  if (objects_.size() > 4096) {
    for (auto it = objects_.begin(); it != objects_.end();)
      it = t - it->second.at > opts_.object_refill * opts_.object_burst ? objects_.erase(it)
                                                                        : std::next(it);
  }
  queue_.push_back(std::move(e));
  lock.unlock();
  cv_.notify_all();
}

EventRecorder::Counts EventRecorder::counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

bool EventRecorder::flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return queue_.empty() && !busy_; });
}

void EventRecorder::run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    PodEvent e = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    send_one(e);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void EventRecorder::send_one(const PodEvent& e) {
  auto t = now();
  std::string key = e.ns + "/" + e.pod + "/" + e.uid + "\n" + e.reason + "\n" + e.note;
  // Series are kept for the window only.
  for (auto it = series_.begin(); it != series_.end();)
    it = t - it->second.last > opts_.series_window ? series_.erase(it) : std::next(it);
  auto found = series_.find(key);
  std::string base = "/apis/events.k8s.io/v1/namespaces/" + e.ns + "/events";
  if (found != series_.end()) {
    Series& s = found->second;
    std::string patch = R"({"series":{"count":)" + std::to_string(s.count + 1) +
                        R"(,"lastObservedTime":)" + quote(micro_time(t)) + "}}";
    auto r = send_("PATCH", base + "/" + s.name, patch, "application/merge-patch+json",
                   opts_.request_timeout);
    std::lock_guard lock(mu_);
    if (r && r->status >= 200 && r->status < 300) {
      ++s.count;
      s.last = t;
      count("patched", &Counts::patched);
      return;
    }
    count("failed", &Counts::failed);
    spdlog::debug("event {} on pod {}/{}: series patch failed ({})", e.reason, e.ns, e.pod,
                  r ? std::to_string(r->status) : r.error());
    return;
  }
  char suffix[32];
  {
    std::lock_guard lock(mu_);
    std::snprintf(
        suffix, sizeof suffix, ".%llx",
        static_cast<unsigned long long>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count() +
            static_cast<int64_t>(names_++)));
  }
  std::string name = e.pod + suffix;
  auto r = send_("POST", base, event_json(e, name, opts_.node, t), "application/json",
                 opts_.request_timeout);
  std::lock_guard lock(mu_);
  if (r && r->status >= 200 && r->status < 300) {
    series_[key] = Series{name, 1, t};
    count("written", &Counts::written);
    return;
  }
  // A pod (or namespace) that is gone, throttling, an outage: counted, not retried.
  count("failed", &Counts::failed);
  spdlog::debug("event {} on pod {}/{} not written ({})", e.reason, e.ns, e.pod,
                r ? "HTTP " + std::to_string(r->status) : r.error());
}

std::vector<PodEvent> DrainEvents::observe(std::string_view drains_json, size_t members) {
  std::vector<PodEvent> out;
  simdjson::dom::parser parser;
  simdjson::dom::array drains;
  if (parser.parse(drains_json.data(), drains_json.size()).get(drains) != simdjson::SUCCESS)
    return out;
  std::map<std::string, unsigned> seen;
  for (simdjson::dom::element d : drains) {
    std::string_view pod, uid, address, stage, release_after;
    if (d["pod"].get(pod) || d["address"].get(address) || d["stage"].get(stage)) continue;
    if (d["pod_uid"].get(uid)) uid = {};
    if (d["release_after"].get(release_after)) release_after = {};
    auto slash = pod.find('/');
    if (slash == std::string_view::npos) continue;
    std::string key = std::string(uid) + "/" + std::string(address);
    unsigned told = told_.count(key) ? told_[key] : 0;
    PodEvent base;
    base.ns = std::string(pod.substr(0, slash));
    base.pod = std::string(pod.substr(slash + 1));
    base.uid = std::string(uid);
    int64_t removed = -1, released = -1;
    if (d["timeline_ms"]["removed"].get(removed)) removed = -1;
    if (d["timeline_ms"]["released"].get(released)) released = -1;
    bool forced = false;
    if (d["removal_forced"].get(forced)) forced = false;
    // Removed everywhere only when nobody was left unconfirmed at the removal (an excluded or
    // silent node is named by DrainUnconfirmed at the release instead).
    simdjson::dom::array unconfirmed_at;
    bool all_confirmed =
        d["unconfirmed"].get(unconfirmed_at) != simdjson::SUCCESS || unconfirmed_at.size() == 0;
    if (removed >= 0 && (forced || !all_confirmed)) told |= kToldRemoved;
    if (removed >= 0 && !(told & kToldRemoved)) {
      PodEvent e = base;
      e.reason = "DrainRemoved";
      e.note = std::string(address) + " removed from every consumer on " + std::to_string(members) +
               (members == 1 ? " node" : " nodes") + " in " + std::to_string(removed) + " ms";
      out.push_back(std::move(e));
      told |= kToldRemoved;
    }
    if (stage == "released" && !(told & kToldReleased)) {
      std::string_view outcome;
      if (d["outcome"].get(outcome)) outcome = "released";
      PodEvent e = base;
      e.reason = "DrainReleased";
      e.note = std::string(address) + " released after " + std::to_string(released) +
               " ms: " + std::string(outcome) + " (release after " + std::string(release_after) +
               ")";
      out.push_back(std::move(e));
      simdjson::dom::array un;
      if (d["unconfirmed"].get(un) == simdjson::SUCCESS && un.size() > 0) {
        std::string who;
        for (simdjson::dom::element u : un) {
          std::string_view node, consumer, reason;
          if (u["node"].get(node)) node = "?";
          if (u["consumer"].get(consumer)) consumer = "?";
          if (u["reason"].get(reason)) reason = {};
          who += (who.empty() ? "" : "; ") + std::string(node) + "/" + std::string(consumer) +
                 (reason.empty() ? "" : " (" + std::string(reason) + ")");
        }
        PodEvent w = base;
        w.type = "Warning";
        w.reason = "DrainUnconfirmed";
        w.note = std::string(address) + " released without confirmation from " + who;
        out.push_back(std::move(w));
      }
      told |= kToldReleased;
    }
    seen[key] = told;
  }
  // What the coordinator no longer lists is forgotten: its state is bounded, so this is too.
  told_ = std::move(seen);
  return out;
}

namespace {
constexpr size_t kMaxPending = 4096;
}  // namespace

std::vector<double> PropagationEvents::buckets() {
  std::vector<double> b = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5};
  for (int i = 1; i <= 59; ++i) b.push_back(i);
  for (int i = 60; i <= 115; i += 5) b.push_back(i);
  for (int i = 120; i <= 300; i += 30) b.push_back(i);
  return b;
}

void PropagationEvents::on_snapshot(const model::Snapshot& snap, const std::string& node,
                                    std::chrono::steady_clock::time_point now) {
  if (snap.generation == generation_ || !snap.synced) return;
  generation_ = snap.generation;
  auto wait_for = [&](const model::MergedEndpoint& e, bool ready,
                      std::chrono::system_clock::time_point trigger) {
    if (pending_.size() >= kMaxPending) return;
    Pending p;
    p.base.ns = e.target_ref->ns;
    p.base.pod = e.target_ref->name;
    p.base.uid = e.target_ref->uid;
    p.base.reason = "Propagated";
    p.base.action = "Propagate";
    p.address = e.address.str();
    p.revision = snap.slice_revision;
    p.since = now;
    p.ready = ready;
    // A trigger time from before this agent started is not this agent's to measure.
    if (programming_ && trigger >= started_) p.trigger = trigger;
    std::string key = p.base.uid + "/" + p.address + (ready ? "+" : "-");
    spdlog::debug("events: {}/{} {} {} at revision {}; waits for the cluster watermark", p.base.ns,
                  p.base.pod, p.address, ready ? "turned ready" : "stopped being ready",
                  p.revision);
    // A later change of the same endpoint the same way replaces the one not yet covered.
    pending_.insert_or_assign(std::move(key), std::move(p));
  };
  if (!first_) {
    model::Delta d = model::diff_services(seen_, snap.services);
    // Services added or changed since the last look (a service gone: nothing to wait for).
    auto look = [&](const model::ServiceKey& key) {
      const model::ServiceStatePtr* now_at = snap.services.find(key);
      if (!now_at) return;
      const model::ServiceState& st = **now_at;
      const model::ServiceStatePtr* before = seen_.find(key);
      const model::ServiceState* was = before ? before->get() : nullptr;
      // A new trigger time: the slice change this snapshot carries was triggered then.
      auto trigger = was && st.trigger_time <= was->trigger_time
                         ? std::chrono::system_clock::time_point{}
                         : st.trigger_time;
      for (const auto& e : st.endpoints) {
        if (e.node_name != node || !e.conditions.ready || !e.target_ref) continue;
        const model::MergedEndpoint* b = was ? was->find(e.address) : nullptr;
        if (b && b->conditions.ready) continue;
        wait_for(e, true, trigger);
      }
      // Ready before and not now (not ready, terminating, or out of the slice).
      if (was && programming_)
        for (const auto& b : was->endpoints) {
          if (b.node_name != node || !b.conditions.ready || !b.target_ref) continue;
          const model::MergedEndpoint* e = st.find(b.address);
          if (e && e->conditions.ready) continue;
          wait_for(b, false, trigger);
        }
    };
    for (const auto& k : d.added) look(k);
    for (const auto& k : d.changed) look(k);
  }
  seen_ = snap.services;
  first_ = false;
}

std::vector<PodEvent> PropagationEvents::observe(uint64_t cluster_watermark, size_t members,
                                                 std::chrono::steady_clock::time_point now,
                                                 std::chrono::system_clock::time_point wall) {
  std::vector<PodEvent> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const Pending& p = it->second;
    if (p.revision == 0 || cluster_watermark < p.revision) {
      ++it;
      continue;
    }
    if (programming_ && p.trigger != std::chrono::system_clock::time_point{}) {
      programming_->Observe(std::max(0.0, std::chrono::duration<double>(wall - p.trigger).count()));
      ++programmed_;
    }
    if (p.ready) {
      PodEvent e = p.base;
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.since).count();
      e.note = p.address + " routable on " + std::to_string(members) + "/" +
               std::to_string(members) + (members == 1 ? " node" : " nodes") +
               " (every consumer and feed subscriber) " + std::to_string(ms) +
               " ms after this agent saw it ready";
      out.push_back(std::move(e));
    }
    it = pending_.erase(it);
  }
  return out;
}

DrainEventPoller::DrainEventPoller(Inputs in, EventRecorder* recorder,
                                   std::chrono::milliseconds every) {
  thread_ = std::thread([this, in = std::move(in), recorder, every] {
    DrainEvents drains;
    PropagationEvents propagation(in.cluster_programming, in.started);
    bool based = false;
    uint64_t seen_version = 0;
    model::SnapshotPtr seen_snap;
    bool looked = false;
    std::unique_lock lock(mu_);
    while (!stopping_) {
      lock.unlock();
      model::SnapshotPtr snap = in.snapshot ? in.snapshot() : nullptr;
      // Nothing moved since the last look: no drains, members or watermark to read again (at
      // 10 looks a second, rendering and parsing them was most of an idle agent's CPU).
      const uint64_t version = in.version ? in.version() : 0;
      if (looked && in.version && version == seen_version && snap == seen_snap) {
        lock.lock();
        cv_.wait_for(lock, every, [&] { return stopping_; });
        continue;
      }
      looked = true;
      seen_version = version;
      seen_snap = snap;
      // The members and the cluster watermark, as /debug/state's drainCluster has them.
      std::string cj = in.cluster_json ? in.cluster_json() : "null";
      simdjson::dom::parser p;
      simdjson::dom::element c;
      uint64_t members = 0, watermark = 0;
      bool cluster = p.parse(cj).get(c) == simdjson::SUCCESS && c.is_object();
      if (!cluster || c["members"].get(members) != simdjson::SUCCESS)
        members = snap ? snap->nodes.size() : 0;
      if (!cluster || c["cluster_watermark"].get(watermark) != simdjson::SUCCESS) watermark = 0;
      spdlog::debug(
          "events: look at generation {} (state {}): cluster {}, watermark {}, {} members",
          snap ? snap->generation : 0, version, cluster ? "read" : cj.substr(0, 80), watermark,
          members);
      if (recorder)
        for (auto& e : drains.observe(in.drains_json(), members)) recorder->record(std::move(e));
      // Without the cluster watermark nothing says when every node routes: no Propagated.
      if (snap && cluster) {
        auto now = std::chrono::steady_clock::now();
        // What changed since the first synced state counts, even before the first look.
        // Not before there is one: a look at the loop's empty state before its first publish
        // must not make the next look the baseline (what turned ready in between was missed).
        if (!based) {
          model::SnapshotPtr first = in.first_synced ? in.first_synced() : nullptr;
          if (first) {
            spdlog::debug("events: first synced generation {}, now {}", first->generation,
                          snap->generation);
            propagation.on_snapshot(*first, in.node, now);
            based = true;
          } else if (!in.first_synced && snap->synced) {
            based = true;  // without the hook, the first synced look is the baseline
          }
        }
        propagation.on_snapshot(*snap, in.node, now);
        for (auto& e : propagation.observe(watermark, members, now))
          if (recorder) recorder->record(std::move(e));
      }
      lock.lock();
      cv_.wait_for(lock, every, [&] { return stopping_; });
    }
  });
}

DrainEventPoller::~DrainEventPoller() {
  stop();
}

void DrainEventPoller::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace endpointd::daemon
