// The cluster thread owns the Aggregator and every stream's bookkeeping; gRPC's callbacks only
// hand events to it (a stream opened, a message, a stream done), so no stream is ever freed
// under a caller and no lock is held across a call into gRPC but a stream's own.
// Here: the thread's loop and what it publishes (the view, /debug/state, the anomalies' log);
// its stream bookkeeping is in cluster_streams.cc, the wire conversion in peer_wire.cc.
#include "drain/cluster.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string_view>

#include "drain/cluster_internal.h"
#include "model/json.h"

namespace endpointd::drain {

Cluster::Cluster(ClusterOptions opts, std::function<void()> on_change)
    : opts_(std::move(opts)),
      on_change_(std::move(on_change)),
      metrics_(std::make_unique<Metrics>(opts_.registry)),
      agg_(opts_.node, opts_.aggregator) {}

Cluster::~Cluster() {
  stop();
}

void Cluster::start() {
  {
    std::lock_guard lock(inbox_mu_);
    stopping_ = false;
  }
  publish_view();
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "drain-cluster");
    run();
  });
}

void Cluster::stop() {
  {
    std::lock_guard lock(inbox_mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Cluster::set_members(std::map<std::string, std::string> addresses) {
  {
    std::lock_guard lock(inbox_mu_);
    if (addresses == pending_members_) return;
    pending_members_ = std::move(addresses);
    members_changed_ = true;
  }
  inbox_cv_.notify_all();
}

void Cluster::set_local(uint64_t watermark) {
  set_local(watermark, watermark, {});
}

void Cluster::set_local(uint64_t watermark, uint64_t dns_watermark, HoldoutList holdouts) {
  {
    std::lock_guard lock(inbox_mu_);
    if (watermark == pending_local_ && dns_watermark == pending_local_dns_ &&
        holdouts == pending_holdouts_)
      return;
    pending_local_ = watermark;
    pending_local_dns_ = dns_watermark;
    pending_holdouts_ = std::move(holdouts);
    local_changed_ = true;
  }
  inbox_cv_.notify_all();
}

Cluster::View Cluster::view() const {
  std::lock_guard lock(view_mu_);
  return view_;
}

Cluster::Stats Cluster::stats() const {
  std::lock_guard lock(view_mu_);
  return stats_;
}

std::string Cluster::to_json() const {
  std::lock_guard lock(view_mu_);
  return json_;
}

void Cluster::publish_view() {
  View v;
  v.local = 0;
  {
    std::lock_guard lock(inbox_mu_);
    v.local = pending_local_;
  }
  v.cluster = agg_.cluster_watermark();
  v.member = agg_.members().count(opts_.node) > 0;
  // The member list is shared, made again only when it changed: a heartbeat costs O(children),
  // not O(N).
  v.facts = agg_.facts();
  v.members = v.facts.members;
  v.excluded = agg_.excluded();
  std::string j = "{\"node\":" + model::json_string(opts_.node) +
                  ",\"local_watermark\":" + std::to_string(v.local) +
                  ",\"cluster_watermark\":" + std::to_string(v.cluster) +
                  ",\"cluster_dns_watermark\":" + std::to_string(v.facts.dns) +
                  ",\"coverage_current\":" + (v.facts.coverage_current ? "true" : "false") +
                  ",\"holdouts\":" + std::to_string(v.facts.holdouts.size()) +
                  ",\"member\":" + (v.member ? "true" : "false") +
                  ",\"members\":" + std::to_string(v.members->size()) +
                  ",\"root\":" + model::json_string(agg_.tree().root()) +
                  ",\"depth\":" + std::to_string(agg_.tree().depth());
  const std::string* parent = agg_.tree().parent(opts_.node);
  j += ",\"parent\":" + (parent ? model::json_string(*parent) : std::string("null"));
  auto list = [](const auto& names) {
    std::string s = "[";
    bool first = true;
    for (const auto& n : names) {
      if (!first) s += ",";
      first = false;
      s += model::json_string(n);
    }
    return s + "]";
  };
  j += ",\"children\":" + list(agg_.tree().children(opts_.node));
  j += ",\"excluded\":" + list(v.excluded);
  j += ",\"epoch\":" + std::to_string(agg_.epoch());
  std::vector<std::string> suspects;
  for (const auto& [n, since] : agg_.suspects()) suspects.push_back(n);
  j += ",\"suspects\":" + list(suspects);
  std::vector<std::string> in, out;
  for (const auto& [n, s] : incoming_by_node_) in.push_back(n);
  for (const auto& [n, s] : outgoing_) out.push_back(n);
  j += ",\"streams\":{\"incoming\":" + list(in) + ",\"outgoing\":" + list(out) +
       ",\"unnamed\":" + std::to_string(incoming_.size() - incoming_by_node_.size()) + "}";
  {
    std::lock_guard lock(view_mu_);
    stats_.incoming = incoming_.size();
    stats_.outgoing = outgoing_.size();
    stats_.peak_streams = std::max(stats_.peak_streams, stats_.incoming + stats_.outgoing);
    const Stats& s = stats_;
    j += ",\"counters\":{\"up_sent\":" + std::to_string(s.up_sent) +
         ",\"down_sent\":" + std::to_string(s.down_sent) +
         ",\"up_received\":" + std::to_string(s.up_received) +
         ",\"down_received\":" + std::to_string(s.down_received) +
         ",\"bytes_sent\":" + std::to_string(s.bytes_sent) +
         ",\"bytes_received\":" + std::to_string(s.bytes_received) +
         ",\"streams_opened\":" + std::to_string(s.streams_opened) +
         ",\"streams_accepted\":" + std::to_string(s.streams_accepted) +
         ",\"peak_streams\":" + std::to_string(s.peak_streams) +
         ",\"refused_unnamed\":" + std::to_string(s.refused_unnamed) +
         ",\"refused_not_member\":" + std::to_string(s.refused_not_member) +
         ",\"refused_renamed\":" + std::to_string(s.refused_renamed) +
         ",\"refused_limit\":" + std::to_string(s.refused_limit) +
         ",\"refused_identity\":" + std::to_string(s.refused_identity) +
         ",\"refused_replayed\":" + std::to_string(s.refused_replayed) +
         ",\"refused_malformed\":" + std::to_string(s.refused_malformed) +
         ",\"dropped_queue\":" + std::to_string(s.dropped_queue) +
         ",\"dropped_inbox\":" + std::to_string(s.dropped_inbox) +
         ",\"dropped_no_stream\":" + std::to_string(s.dropped_no_stream) +
         ",\"watermark_backwards\":" + std::to_string(s.watermark_backwards) +
         ",\"watermark_clamped_ahead\":" + std::to_string(s.watermark_clamped_ahead) +
         ",\"refused_coverage\":" + std::to_string(agg_.stats().refused_coverage) +
         ",\"refused_decision\":" + std::to_string(agg_.stats().refused_decision) +
         ",\"refused_epoch\":" + std::to_string(agg_.stats().refused_epoch) +
         ",\"not_parent\":" + std::to_string(agg_.stats().not_parent) +
         ",\"samples\":" + std::to_string(agg_.stats().samples) +
         ",\"sample_below\":" + std::to_string(agg_.stats().sample_below) + "}}";
    view_ = std::move(v);
    json_ = std::move(j);
  }
  metrics_->streams->Add({{"direction", "incoming"}}).Set(static_cast<double>(incoming_.size()));
  metrics_->streams->Add({{"direction", "outgoing"}}).Set(static_cast<double>(outgoing_.size()));
  metrics_->excluded->Set(static_cast<double>(agg_.excluded().size()));
  metrics_->watermark->Add({{"scope", "cluster"}})
      .Set(static_cast<double>(agg_.cluster_watermark()));
}

void Cluster::report_anomalies(SteadyClock::time_point) {
  for (const auto& a : agg_.take_anomalies()) {
    const std::string_view kind(a.kind);
    bool ahead = kind == "ahead";
    if (ahead || kind == "backwards") {
      std::lock_guard lock(view_mu_);
      ++(ahead ? stats_.watermark_clamped_ahead : stats_.watermark_backwards);
    }
    metrics_->anomalies->Add({{"kind", a.kind}}).Increment();
    // Logged at the 1st, 2nd, 4th, 8th… of each kind from each peer: a peer that keeps at it
    // is seen in the log without filling it.
    uint64_t n = ++anomaly_counts_[std::string(a.kind) + "/" + a.from];
    if ((n & (n - 1)) != 0) continue;
    if (kind == "epoch")
      spdlog::warn(
          "drain: peer {} sent an exclusion decision numbered {}, past the cap or more than {} "
          "decisions past this agent's {}: refused ({} so far)",
          a.from, a.reported, Aggregator::kMaxEpochStep, a.kept, n);
    else if (kind == "not-parent")
      spdlog::warn(
          "drain: peer {} sent a cluster watermark of {} but is not this agent's parent in its "
          "layout: not taken (this agent's is {}; {} so far)",
          a.from, a.reported, a.kept, n);
    else if (ahead)
      spdlog::warn(
          "drain: peer {} sent a cluster watermark of {}, above this agent's own {} that it "
          "counts: clamped to {} ({} so far)",
          a.from, a.reported, a.kept, a.kept, n);
    else if (kind == "coverage")
      spdlog::warn(
          "drain: peer {} reported over {} agents, not its subtree of {} in this agent's layout: "
          "not counted in the minimum (layouts differ while a member joins, leaves or is "
          "suspected; otherwise a false report; {} so far)",
          a.from, a.reported, a.kept, n);
    else if (kind == "decision")
      spdlog::warn(
          "drain: peer {} sent an exclusion decision (number {}) that excludes this agent or one "
          "of its ancestors, and is not its parent: refused, such a decision comes down the tree "
          "({} so far)",
          a.from, a.reported, n);
    else if (kind == "malformed")
      spdlog::warn(
          "drain: peer {} reported a DNS watermark of {} above its watermark of {}: refused ({} "
          "so far)",
          a.from, a.reported, a.kept, n);
    else if (kind == "sample-below") {
      std::string path;
      for (const auto& p : agg_.tree().ancestors(a.from))
        path = p + (path.empty() ? "" : " > ") + path;
      spdlog::warn(
          "drain: sampled directly, peer {} applied up to {} but the minimum over it was {}: "
          "the cluster watermark is held at {} until the tree agrees (it restarted, or an agent "
          "on its way up, {}, reported falsely; {} so far)",
          a.from, a.kept, a.reported, a.kept, path, n);
    } else
      spdlog::warn(
          "drain: peer {} reported a watermark of {}, below its previous report over the same "
          "agents (a restart, or a false report): taken as reported ({} so far)",
          a.from, a.reported, n);
  }
}

void Cluster::run() {
  auto next_sweep = SteadyClock::now();
  uint64_t last_cluster = agg_.cluster_watermark();
  std::set<std::string> last_excluded = agg_.excluded();
  while (true) {
    std::vector<Event> events;
    bool members_changed = false, local_changed = false, stopping = false;
    std::map<std::string, std::string> members;
    uint64_t local = 0, local_dns = 0;
    HoldoutList holdouts;
    {
      std::unique_lock lock(inbox_mu_);
      // At most a poll per millisecond whatever the deadlines say.
      auto deadline = std::max(std::min(agg_.next_deadline(), next_sweep),
                               SteadyClock::now() + std::chrono::milliseconds(1));
      inbox_cv_.wait_until(lock, deadline, [&] {
        return stopping_ || !inbox_.empty() || members_changed_ || local_changed_;
      });
      events.swap(inbox_);
      inbox_messages_ = 0;
      stopping = stopping_;
      if (members_changed_) {
        members = pending_members_;
        members_changed = true;
        members_changed_ = false;
      }
      local_changed = local_changed_;
      local_changed_ = false;
      local = pending_local_;
      local_dns = pending_local_dns_;
      if (local_changed) holdouts = pending_holdouts_;
    }
    auto now = SteadyClock::now();
    for (auto& ev : events) handle(ev, now);
    if (stopping) break;
    if (members_changed) {
      addresses_ = std::move(members);
      std::vector<std::string> names;
      for (const auto& [n, a] : addresses_) names.push_back(n);
      agg_.set_members(names, now);
    }
    if (local_changed) {
      agg_.set_local(local, local_dns, std::move(holdouts));
      metrics_->watermark->Add({{"scope", "local"}}).Set(static_cast<double>(local));
    }
    dispatch(agg_.poll(now), now);
    report_anomalies(now);
    if (now >= next_sweep) {
      sweep(now);
      // Hello and idle deadlines are seconds long; a sweep a quarter of the shorter apart.
      next_sweep =
          now + std::max(std::chrono::milliseconds(50), std::min(opts_.hello, opts_.idle) / 4);
    }
    publish_view();
    if (agg_.cluster_watermark() != last_cluster || agg_.excluded() != last_excluded) {
      if (agg_.excluded() != last_excluded) {
        std::vector<std::string> added, back;
        for (const auto& n : agg_.excluded())
          if (!last_excluded.count(n)) added.push_back(n);
        for (const auto& n : last_excluded)
          if (!agg_.excluded().count(n)) back.push_back(n);
        if (!added.empty())
          spdlog::warn("drain: excluded from the cluster watermark (silent past {} ms): {}",
                       opts_.aggregator.silence.count(), fmt::join(added, ", "));
        if (!back.empty()) spdlog::info("drain: readmitted: {}", fmt::join(back, ", "));
      }
      last_cluster = agg_.cluster_watermark();
      last_excluded = agg_.excluded();
      if (on_change_) on_change_();
    }
  }
  // Stopping: close every stream and wait for gRPC to be done with each.
  for (auto& [n, s] : outgoing_) s->close();
  for (InStream* s : incoming_)
    s->finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "endpointd is stopping"));
  auto until = SteadyClock::now() + std::chrono::seconds(5);
  while (true) {
    std::vector<Event> events;
    {
      std::unique_lock lock(inbox_mu_);
      if (live_reactors_ == 0) break;
      inbox_cv_.wait_until(lock, until, [&] { return !inbox_.empty(); });
      if (inbox_.empty() && SteadyClock::now() >= until) break;
      events.swap(inbox_);
    }
    auto now = SteadyClock::now();
    for (auto& ev : events) {
      handle(ev, now);
      if (ev.kind == Event::Kind::kNewIn)
        ev.in->finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "endpointd is stopping"));
    }
  }
}

}  // namespace endpointd::drain
