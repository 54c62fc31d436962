// The coordinator's own thread: one owner of the Machine; the board, snapshots, peers and
// prestop calls wake it, and it polls only while a drain waits on conntrack or a DNS TTL.
#include "drain/coordinator.h"
#include "drain/late_inputs.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include "drain/cluster.h"
#include "drain/machine_json.h"
#include "drain/servers.h"
#include "model/hostport.h"
#include "model/json.h"
#include "model/routing.h"

namespace endpointd::drain {

struct Coordinator::Metrics {
  std::shared_ptr<prometheus::Registry> own;
  prometheus::Family<prometheus::Histogram>* stage;
  prometheus::Family<prometheus::Counter>* deadlines;
  prometheus::Counter* peers_unconfirmed;
  prometheus::Counter* conntrack_unavailable;
  prometheus::Counter* no_endpoints;
  prometheus::Counter* never_terminating;
  prometheus::Counter* not_terminating_in_api;
  prometheus::Counter* deletion_clamped;
  prometheus::Counter* action_failures;
  prometheus::Counter* bad_actions;
  prometheus::Family<prometheus::Counter>* prestop;
  prometheus::Counter* released_confirmed;
  prometheus::Counter* released_unconfirmed;
  prometheus::Counter* routed_again;
  prometheus::Counter* no_pod_uid;
  prometheus::Counter* address_conflicts;
  prometheus::Counter* address_reused;
  prometheus::Gauge* active;
  prometheus::Family<prometheus::Counter>* late;

  explicit Metrics(prometheus::Registry* r) {
    if (!r) {
      own = std::make_shared<prometheus::Registry>();
      r = own.get();
    }
    stage = &prometheus::BuildHistogram()
                 .Name("endpointd_drain_stage_duration_seconds")
                 .Help(
                     "Time a terminating endpoint spent before reaching each drain stage, by stage "
                     "reached")
                 .Register(*r);
    deadlines = &prometheus::BuildCounter()
                     .Name("endpointd_drain_deadlines_total")
                     .Help("Drain stages that ended at their deadline instead of a confirmation")
                     .Register(*r);
    auto counter = [&](const char* name, const char* help) {
      return &prometheus::BuildCounter().Name(name).Help(help).Register(*r).Add({});
    };
    peers_unconfirmed =
        counter("endpointd_drain_peers_unconfirmed_total",
                "Peer agents that did not confirm an endpoint's removal by their deadline");
    conntrack_unavailable = counter("endpointd_drain_conntrack_unavailable_total",
                                    "Drains that could not count live connections in conntrack");
    no_endpoints =
        counter("endpointd_drain_no_endpoints_total", "prestop calls from pods without endpoints");
    never_terminating =
        counter("endpointd_drain_never_terminating_total",
                "Endpoints of terminating pods never shown terminating within the budget");
    not_terminating_in_api =
        counter("endpointd_drain_not_terminating_in_api_total",
                "prestop calls whose pod the API did not show terminating in time");
    deletion_clamped = counter(
        "endpointd_drain_deletion_timestamp_clamped_total",
        "Pods whose deletionTimestamp lay beyond their grace period from now (clock skew) or "
        "already past: the drain budget was clamped");
    action_failures = counter("endpointd_drain_action_failures_total",
                              "Drain actions that failed, hung past the budget or could not run "
                              "(the pod released after removal)");
    bad_actions = counter("endpointd_drain_action_invalid_total",
                          "Drain actions (--drain-action or the endpointd.io/drain-action "
                          "annotation) that do not parse");
    no_pod_uid = counter("endpointd_drain_endpoint_without_pod_uid_total",
                         "Terminating endpoints of this node whose targetRef names no pod UID "
                         "(drained as the pod of this node at the address)");
    address_conflicts = counter("endpointd_drain_address_conflicts_total",
                                "Drains of two pods (neither hostNetwork) claiming one address at "
                                "once: both released unconfirmed");
    address_reused = counter("endpointd_drain_address_reused_total",
                             "Drains started at an address an earlier pod's drain had (pod IP "
                             "reuse): a drain of its own");
    prestop = &prometheus::BuildCounter()
                   .Name("endpointd_drain_prestop_total")
                   .Help(
                       "prestop calls by outcome: released, failed, refused, limited (too many in "
                       "progress, from the caller or in all)")
                   .Register(*r);
    auto& releases = prometheus::BuildCounter()
                         .Name("endpointd_drain_releases_total")
                         .Help(
                             "Endpoints released, by outcome: confirmed (nothing could still "
                             "route to them) or unconfirmed (the drain names who may)")
                         .Register(*r);
    released_confirmed = &releases.Add({{"outcome", "confirmed"}});
    released_unconfirmed = &releases.Add({{"outcome", "unconfirmed"}});
    routed_again = counter("endpointd_drain_routed_again_total",
                           "Terminating endpoints that became routable again during their drain "
                           "(the terminating fallback): their removal is confirmed anew");
    late = &prometheus::BuildCounter()
                .Name("endpointd_drain_late_connections_total")
                .Help(
                    "New connections to a terminating pod of this node after its removal was "
                    "confirmed, by the kind of their source (pod, node, external) and whether they "
                    "came before or after its release")
                .Register(*r);
    active = &prometheus::BuildGauge()
                  .Name("endpointd_drain_active")
                  .Help("Drains in progress")
                  .Register(*r)
                  .Add({});
  }
  void observe(const Transition& t) {
    static const std::vector<double> buckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                0.5,   1,     2.5,  5,     10,   30,  60};
    stage->Add({{"stage", std::string(to_string(t.to))}}, buckets)
        .Observe(std::chrono::duration<double>(t.stage_duration).count());
  }
};

// Lets the board's observer outlive the coordinator safely (observers cannot be removed).
struct BoardHook {
  std::mutex mu;
  Coordinator* target = nullptr;
};

Coordinator::Coordinator(pipeline::AckBoard* board, Flows* flows, CoordinatorOptions opts)
    : board_(board),
      flows_(flows),
      opts_(std::move(opts)),
      metrics_(std::make_unique<Metrics>(opts_.registry)),
      machine_(opts_.machine),
      deleted_(opts_.deleted_node_hold),
      late_(opts_.late_window) {
  // The nodes an earlier process of this node's agent saw running an agent stay members.
  if (opts_.node_state) {
    NodeState loaded = opts_.node_state->loaded();
    agents_seen_ = std::move(loaded.agents);
    // And the members it waited for: one whose Node is gone is held as deleted.
    Members earlier;
    for (const auto& [name, address] : loaded.members)
      earlier[name] = address.empty() ? std::nullopt : model::IpAddr::parse(address);
    deleted_.seed(earlier);
  }
}

Coordinator::~Coordinator() {
  stop();
}

Status Coordinator::start() {
  if (!opts_.peer_listen.empty()) {
    // Before any thread that calls peers starts.
    auto creds = load_peer_credentials(opts_.peer_tls, opts_.peer_insecure);
    if (!creds) return Error{creds.error()};
    peer_creds_ = std::move(*creds);
  }
  hook_ = std::make_shared<BoardHook>();
  hook_->target = this;
  board_->on_change([h = hook_] {
    std::lock_guard lock(h->mu);
    if (h->target) h->target->wake();
  });
  {
    std::lock_guard lock(mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "drain");
    run();
  });
  for (size_t i = 0; i < std::max<size_t>(1, opts_.peer_concurrency); ++i)
    peer_threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "drain-peer");
      peer_worker();
    });
  if (!opts_.peer_listen.empty()) {
    if (opts_.watermark) {
      ClusterOptions co;
      co.credentials = peer_creds_.client;
      co.tls = peer_creds_.tls;
      co.verifier = peer_creds_.verifier;
      co.node = opts_.machine.node_name;
      co.aggregator = opts_.aggregator;
      // A stream nothing went over for three heartbeats is not a tree edge any more.
      co.idle = 3 * opts_.aggregator.heartbeat;
      co.registry = opts_.registry;
      cluster_ = std::make_unique<Cluster>(co, [this] { wake(); });
      cluster_->start();
    }
    peer_server_ = std::make_unique<PeerServer>(this, opts_.machine.node_name,
                                                opts_.peer_answer_max, cluster_.get());
    auto port = peer_server_->start(opts_.peer_listen, peer_creds_);
    if (!port) return Error{port.error()};
    bound_peer_port_ = *port;
  }
  if (!opts_.drain_socket.empty()) {
    prestop_server_ = std::make_unique<PrestopServer>(
        this, opts_.machine.node_name, opts_.prestop_max_connections,
        [this](const std::string& result) {
          metrics_->prestop->Add({{"result", result}}).Increment();
        });
    if (auto st = prestop_server_->start(opts_.drain_socket); !st) return st;
  }
  spdlog::info("drain: coordinator on node {} (peers on {}, prestop socket {})",
               opts_.machine.node_name, opts_.peer_listen.empty() ? "-" : opts_.peer_listen,
               opts_.drain_socket.empty() ? "-" : opts_.drain_socket);
  return {};
}

void Coordinator::stop() {
  if (hook_) {
    std::lock_guard lock(hook_->mu);
    hook_->target = nullptr;
  }
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  peer_cv_.notify_all();
  changed_.notify_all();
  if (prestop_server_) prestop_server_->stop();
  if (peer_server_) peer_server_->stop();
  if (cluster_) cluster_->stop();
  if (thread_.joinable()) thread_.join();
  for (auto& t : peer_threads_) t.join();
  peer_threads_.clear();
  prestop_server_.reset();
  peer_server_.reset();
  cluster_.reset();
}

void Coordinator::wake() {
  {
    std::lock_guard lock(mu_);
    dirty_ = true;
  }
  cv_.notify_all();
  changed_.notify_all();
}

void Coordinator::on_snapshot(model::SnapshotPtr snap) {
  {
    std::lock_guard lock(mu_);
    pending_ = snap;
    latest_ = std::move(snap);
    dirty_ = true;
  }
  cv_.notify_all();
  changed_.notify_all();
}

model::SnapshotPtr Coordinator::snapshot() const {
  std::lock_guard lock(mu_);
  return latest_;
}

model::SnapshotPtr Coordinator::wait_snapshot(
    const std::function<bool(const model::Snapshot&)>& pred, TimePoint deadline) const {
  std::unique_lock lock(mu_);
  while (true) {
    if (latest_ && pred(*latest_)) return latest_;
    if (stopping_ || Clock::now() >= deadline) return nullptr;
    changed_.wait_until(lock, deadline);
  }
}

std::string Coordinator::cluster_json() const {
  if (!cluster_) return "null";
  std::string j = cluster_->to_json();
  if (j.empty() || j.back() != '}') return j;
  j.pop_back();
  // Where the members come from and where their agents are reached.
  const auto& svc = opts_.machine.members_service;
  j += ",\"members_from\":" +
       model::json_string(svc ? "nodes with an agent in service " + svc->str()
                              : std::string("nodes")) +
       ",\"agents_at\":" +
       model::json_string(svc ? "service " + svc->str() : std::string("InternalIP"));
  // Nodes whose agent left the Service: members still (their kernels keep the rules), unknown
  // until their agent is back or their Node deleted.
  std::lock_guard lock(mu_);
  j += ",\"departed\":[";
  bool first = true;
  for (const auto& n : departed_) {
    j += (first ? "" : ",") + model::json_string(n);
    first = false;
  }
  // Nodes whose Node was deleted, held as members until their agent has been silent past the
  // bound.
  j += "],\"deleted\":[";
  first = true;
  for (const auto& n : deleted_.held()) {
    j += (first ? "" : ",") + model::json_string(n);
    first = false;
  }
  return j + "]}";
}

void Coordinator::update_watermark(const std::vector<pipeline::AckBoard::Entry>& entries,
                                   TimePoint now, TimePoint* next) {
  if (!cluster_ || marks_.empty()) return;
  auto m = marks_.update(entries, opts_.machine.node_name, now, next);
  local_fallback_ = std::move(m.fallback);
  cluster_->set_local(m.routing, m.dns, std::move(m.holdouts));
}

std::string Coordinator::drains_json() const {
  std::lock_guard lock(mu_);
  return drain::drains_json(machine_, Clock::now(), std::chrono::system_clock::now(),
                            [&](const Drain& d) {
                              const auto* r = late_.record(d.pod_uid);
                              return r ? ",\"late\":" + late_json(*r) : std::string();
                            });
}

Counters Coordinator::counters() const {
  std::lock_guard lock(mu_);
  return machine_.counters();
}

LocalRemoval Coordinator::local_removal(const model::IpAddr& ip, uint64_t revision) const {
  return drain::local_removal(board_->entries(), ip, opts_.machine.node_name, Clock::now(),
                              revision);
}

LocalRemoval Coordinator::await_local_removal(const model::IpAddr& ip, uint64_t revision,
                                              TimePoint deadline) const {
  while (true) {
    LocalRemoval r = local_removal(ip, revision);
    if (r.removed || Clock::now() >= deadline) return r;
    std::unique_lock lock(mu_);
    if (stopping_) return r;
    // Board changes notify; the short bound covers DNS TTLs that pass without an event.
    changed_.wait_for(lock, std::min<Clock::duration>(milliseconds(20), deadline - Clock::now()));
  }
}

Verdict Coordinator::prestop(const model::ObjectKey& pod, const std::string& uid,
                             const std::function<bool()>& gone, const std::string& action,
                             const RunAction& run_action) {
  std::unique_lock lock(mu_);
  uint64_t id = machine_.add_waiter(pod, uid, Clock::now(), action);
  dirty_ = true;
  cv_.notify_all();
  int64_t grace = 30;
  if (latest_)
    if (const model::Pod* p = latest_->find_pod(pod)) grace = p->termination_grace_period_seconds;
  TimePoint hard = Clock::now() + std::chrono::seconds(grace) + opts_.machine.terminating_wait +
                   std::chrono::seconds(5);
  while (true) {
    if (auto v = machine_.verdict(id)) {
      machine_.remove_waiter(id);
      return *v;
    }
    TimePoint action_deadline{};
    if (auto spec = machine_.take_due_action(id, Clock::now(), &action_deadline)) {
      spdlog::info("drain: {} removed everywhere; its drain action runs: {}", pod.str(), *spec);
      lock.unlock();
      Result<std::string> r =
          run_action ? run_action(*spec, action_deadline)
                     : Result<std::string>(Error{
                           "this prestop client cannot run drain actions (an older endpointd)"});
      lock.lock();
      if (r)
        spdlog::info("drain: drain action of {}: {}", pod.str(), *r);
      else
        spdlog::warn("drain: drain action of {} failed: {}; it releases after removal", pod.str(),
                     r.error());
      machine_.action_finished(id, r, Clock::now());
      dirty_ = true;
      cv_.notify_all();
      continue;
    }
    if (stopping_) {
      machine_.remove_waiter(id);
      return {false, "the agent is stopping; retry"};
    }
    if (Clock::now() >= hard) {
      machine_.remove_waiter(id);
      return {false, "no verdict within the pod's grace period"};
    }
    lock.unlock();
    bool hung_up = gone && gone();
    lock.lock();
    if (hung_up) {
      machine_.remove_waiter(id);
      return {false, "the caller hung up"};
    }
    changed_.wait_for(lock, milliseconds(20));
  }
}

void Coordinator::record(const std::vector<Transition>& ts) {
  for (const auto& t : ts) {
    metrics_->observe(t);
    auto it = machine_.drains().find(DrainKey{t.ip, t.uid});
    std::string pod = it != machine_.drains().end() ? it->second.pod.str() : "";
    spdlog::info("drain: {} (pod {}) {} after {:.1f} ms", t.ip.str(), pod, to_string(t.to),
                 std::chrono::duration<double, std::milli>(t.stage_duration).count());
    if (t.to != Stage::kReleased || it == machine_.drains().end()) continue;
    const Drain& d = it->second;
    if (d.unconfirmed.empty()) {
      spdlog::info("drain: {} (pod {}) released, confirmed: nothing routes to it", t.ip.str(), pod);
      continue;
    }
    std::string who;
    for (const auto& u : d.unconfirmed)
      who += (who.empty() ? "" : "; ") + u.node + "/" + u.consumer + ": " + u.reason;
    spdlog::warn("drain: {} (pod {}) released UNCONFIRMED; may still route: {}", t.ip.str(), pod,
                 who);
  }
  const Counters& c = machine_.counters();
  auto bump = [](prometheus::Counter* m, uint64_t now, uint64_t before) {
    if (now > before) m->Increment(static_cast<double>(now - before));
  };
  if (c.removal_deadlines > last_counters_.removal_deadlines)
    metrics_->deadlines->Add({{"stage", "removal"}})
        .Increment(static_cast<double>(c.removal_deadlines - last_counters_.removal_deadlines));
  if (c.drain_deadlines > last_counters_.drain_deadlines)
    metrics_->deadlines->Add({{"stage", "drain"}})
        .Increment(static_cast<double>(c.drain_deadlines - last_counters_.drain_deadlines));
  bump(metrics_->peers_unconfirmed, c.peers_unconfirmed, last_counters_.peers_unconfirmed);
  bump(metrics_->released_confirmed, c.released_confirmed, last_counters_.released_confirmed);
  bump(metrics_->released_unconfirmed, c.released_unconfirmed, last_counters_.released_unconfirmed);
  bump(metrics_->routed_again, c.routed_again, last_counters_.routed_again);
  bump(metrics_->conntrack_unavailable, c.conntrack_unavailable,
       last_counters_.conntrack_unavailable);
  bump(metrics_->no_endpoints, c.no_endpoints, last_counters_.no_endpoints);
  bump(metrics_->never_terminating, c.never_terminating, last_counters_.never_terminating);
  bump(metrics_->not_terminating_in_api, c.not_terminating_in_api,
       last_counters_.not_terminating_in_api);
  // Counts whose cases the drains' notes in /debug/state name: one warning per new batch.
  auto warn_new = [](uint64_t now, uint64_t before, const char* what) {
    if (now > before)
      spdlog::warn("drain: {} {}: the drain's notes in /debug/state say which and why",
                   now - before, what);
  };
  warn_new(c.deletion_clamped, last_counters_.deletion_clamped,
           "pod deletionTimestamp(s) clamped (clock skew, or seen late)");
  bump(metrics_->deletion_clamped, c.deletion_clamped, last_counters_.deletion_clamped);
  bump(metrics_->action_failures, c.action_failures, last_counters_.action_failures);
  warn_new(c.bad_actions, last_counters_.bad_actions, "drain action(s) that do not parse");
  warn_new(c.no_pod_uid, last_counters_.no_pod_uid,
           "terminating endpoint(s) whose targetRef names no pod UID");
  bump(metrics_->no_pod_uid, c.no_pod_uid, last_counters_.no_pod_uid);
  warn_new(c.address_conflicts, last_counters_.address_conflicts,
           "pair(s) of pods claiming one address at once (released unconfirmed)");
  bump(metrics_->address_conflicts, c.address_conflicts, last_counters_.address_conflicts);
  bump(metrics_->address_reused, c.address_reused, last_counters_.address_reused);
  bump(metrics_->bad_actions, c.bad_actions, last_counters_.bad_actions);
  last_counters_ = c;
  metrics_->active->Set(static_cast<double>(machine_.drains().size()));
}

void Coordinator::run() {
  std::unique_lock lock(mu_);
  TimePoint next = Clock::now() + std::chrono::hours(1);
  while (true) {
    cv_.wait_until(lock, next, [&] { return dirty_ || stopping_; });
    if (stopping_) return;
    dirty_ = false;
    if (pending_) {
      auto snap = std::move(pending_);
      pending_.reset();
      if (cluster_) marks_.snapshot(snap, opts_.machine.node_name);
      // The member list follows its source: the Node objects or the agents' Service
      // (unchanged ones are the same pointers).
      const auto& svc = opts_.machine.members_service;
      model::ServiceStatePtr member_state = svc ? snap->find_ptr(*svc) : nullptr;
      bool changed = member_state != member_state_ || snap->nodes != member_nodes_;
      if (changed || (snap->synced && !members_synced_)) {
        member_nodes_ = snap->nodes;
        members_snap_ = snap;
        member_state_ = std::move(member_state);
        members_synced_ = snap->synced;
        size_t seen_before = agents_seen_.size();
        if (member_state_)
          for (const auto& ep : member_state_->endpoints)
            if (!ep.node_name.empty()) agents_seen_.insert(ep.node_name);
        if (opts_.node_state && agents_seen_.size() != seen_before) {
          // Kept before any drain counts on it: a restart after this cannot forget them.
          if (auto st = opts_.node_state->add_agents(agents_seen_); !st)
            spdlog::warn("drain: the node's state file: {}; a restart may forget members",
                         st.error());
        }
        from_nodes_ = members_of(*snap, svc, &agents_seen_);
        // Only a synced list says a Node is gone (a first partial one says nothing).
        if (snap->synced) deleted_.observe(from_nodes_, Clock::now());
        deleted_.take_changed();
        update_members(deleted_.with_held(from_nodes_), Clock::now());
      }
      auto started = machine_.on_snapshot(snap, Clock::now());
      for (const auto& key : started) {
        const model::IpAddr& ip = key.ip;
        const Drain& d = machine_.drains().at(key);
        if (cluster_ && d.revision > 0 && !d.ask_peers) {
          spdlog::info(
              "drain: {} (pod {}) stop-accepting; waiting for the cluster watermark to reach {}",
              ip.str(), d.pod.str(), d.revision);
          continue;
        }
        TimePoint deadline = opts_.machine.peer_policy == PeerPolicy::kWait
                                 ? (d.reconfirm ? d.budget_end : d.removal_deadline)
                                 : std::max(d.start, d.peers_since) + opts_.machine.peer_timeout;
        for (const auto& [node, p] : d.peers) {
          if (p.state != PeerState::State::kPending) continue;
          peer_jobs_.push_back(
              {ip, node, model::HostPort{p.address, opts_.peer_port}.str(), deadline, d.revision});
        }
        spdlog::info("drain: {} (pod {}) stop-accepting; asking {} peers", ip.str(), d.pod.str(),
                     d.peers.size());
      }
      if (!started.empty()) peer_cv_.notify_all();
    }
    auto need = machine_.need_flow_counts();
    std::map<model::IpAddr, Result<FlowCount>> flows;
    lock.unlock();
    if (!need.empty()) {
      if (!flows_) {
        for (const auto& ip : need) flows.emplace(ip, Error{"no conntrack on this agent"});
      } else {
        auto counts = flows_->count_to_each(need);
        for (size_t i = 0; i < need.size(); ++i) {
          if (counts.ok())
            flows.emplace(need[i], counts.value()[i]);
          else
            flows.emplace(need[i], Error{counts.error()});
        }
      }
    }
    auto entries = board_->entries();
    lock.lock();
    TimePoint wake_dns = Clock::now() + std::chrono::hours(1);
    update_watermark(entries, Clock::now(), &wake_dns);
    ClusterFacts facts;
    if (cluster_) facts = cluster_->view().facts;
    // Deleted Nodes held as members go once their agent has been silent past the bound.
    // With members from the agents' Service: a node the cluster excludes ran an agent, even one
    // this agent never saw in the Service (it started while that node's agent was out).
    if (cluster_ && opts_.machine.members_service && members_snap_ &&
        learn_agents(agents_seen_, facts.excluded)) {
      spdlog::info("drain: learnt from the cluster's decision that {} ran an agent",
                   fmt::join(facts.excluded, ", "));
      if (opts_.node_state)
        if (auto st = opts_.node_state->add_agents(agents_seen_); !st)
          spdlog::warn("drain: the node's state file: {}; a restart may forget members",
                       st.error());
      from_nodes_ = members_of(*members_snap_, opts_.machine.members_service, &agents_seen_);
      update_members(deleted_.with_held(from_nodes_), Clock::now());
    }
    if (cluster_)
      deleted_.excluded(facts.excluded, Clock::now());
    else
      deleted_.expire_unobserved(Clock::now());
    if (deleted_.take_changed()) update_members(deleted_.with_held(from_nodes_), Clock::now());
    Machine::Inputs in;
    in.cluster = cluster_ ? &facts : nullptr;
    in.local_fallback = local_fallback_;
    in.now = Clock::now();
    in.consumers = std::move(entries);
    in.flows = std::move(flows);
    observe_late(Clock::now());
    in.late = late_inputs(late_, machine_.drains());
    auto ts = machine_.evaluate(in);
    record(ts);
    state_version_.fetch_add(1, std::memory_order_release);
    changed_.notify_all();
    // Everything else that moves a drain wakes this loop (the board, the cluster watermark, a
    // snapshot, a prestop call) or is a deadline; only connection counts are polled, and only
    // while a removed drain waits for them (or has not been asked yet).
    bool polling = false;
    for (const auto& [key, d] : machine_.drains())
      if (d.stage == Stage::kRemoved && d.release_after == ReleaseAfter::kDrained &&
          (flows_ || !d.conntrack_failed_since))
        polling = true;
    next = Clock::now() + std::chrono::hours(1);
    if (auto dl = machine_.next_deadline()) next = std::min(next, *dl);
    if (polling) next = std::min(next, Clock::now() + opts_.conntrack_poll);
    if (auto t = deleted_.next_expiry()) next = std::min(next, *t);
    next = std::min(next, wake_dns);
    // New connections are looked at while an address is watched (they wake nothing).
    if (!late_watched_.empty()) next = std::min(next, Clock::now() + kLatePoll);
    // Everything that moves a drain now wakes the loop itself; a deadline already behind is a
    // state the machine waits in without acting (a bug): looked at again no sooner than this,
    // rather than at once, over and over.
    next = std::max(next, Clock::now() + kMinDeadlineWait);
  }
}

void Coordinator::observe_late(TimePoint now) {
  if (!opts_.new_flows) return;
  late_.update(late_watch_pods(machine_.drains()), opts_.machine.node_name, latest_.get(), now);
  late_.observe(opts_.new_flows->take(), latest_.get());
  if (auto addresses = late_.addresses(); addresses != late_watched_) {
    if (auto st = opts_.new_flows->watch(addresses); !st)
      spdlog::warn("drain: cannot watch new connections to terminating pods: {}", st.error());
    late_watched_ = std::move(addresses);
  }
  const auto& s = late_.stats();
  static const char* const kKinds[] = {"pod", "node", "external"};
  for (int k = 0; k < 3; ++k) {
    auto bump = [&](uint64_t now_count, uint64_t& counted, const char* when) {
      if (now_count > counted)
        metrics_->late->Add({{"source", kKinds[k]}, {"when", when}})
            .Increment(static_cast<double>(now_count - counted));
      counted = now_count;
    };
    bump(s.late[k], late_counted_.late[k], "before_release");
    bump(s.after_release[k], late_counted_.after_release[k], "after_release");
  }
  for (const auto& r : late_.take_finished(now)) {
    if (r.after_release.empty()) continue;
    spdlog::warn(
        "drain: {} (pod {}) was released, then {} new connection(s) reached it within {} ms, "
        "from: {}",
        r.pod.ip.str(), r.pod.name, r.after_release.total(), opts_.late_window.count(),
        r.after_release.summary());
  }
}

void Coordinator::update_members(Members current, TimePoint now) {
  (void)now;
  // This node missing from its own member list (no Node of that name, or one without an
  // InternalIP and no agent endpoint): its drains cannot be confirmed by the watermark. Said
  // once a change.
  bool self = current.count(opts_.machine.node_name) && current.at(opts_.machine.node_name);
  if (cluster_ && members_synced_ && self != self_member_) {
    if (!self) {
      spdlog::warn(
          "drain: this node ({}) is not among the {} members (every Node with an InternalIP): its "
          "drains wait for their peer deadline instead of the cluster watermark",
          opts_.machine.node_name, current.size());
    } else {
      spdlog::info("drain: this node ({}) is one of {} members", opts_.machine.node_name,
                   current.size());
    }
    self_member_ = self;
  }
  // Nodes whose agent left the agents' Service but whose Node remains: members still, unknown.
  departed_.clear();
  if (opts_.machine.members_service && member_state_) {
    std::set<std::string> in_service;
    for (const auto& ep : member_state_->endpoints) in_service.insert(ep.node_name);
    for (const auto& [name, _] : current)
      if (!in_service.count(name)) departed_.insert(name);
  }
  machine_.set_members(current);
  if (opts_.node_state && members_synced_) {
    std::map<std::string, std::string> keep;
    for (const auto& [name, address] : current) keep[name] = address ? address->str() : "";
    if (auto st = opts_.node_state->set_members(keep); !st)
      spdlog::warn("drain: the node's state file: {}; a restart may forget members", st.error());
  }
  current_members_ = std::move(current);
  std::map<std::string, std::string> members;
  for (const auto& [name, address] : current_members_)
    if (address) members[name] = model::HostPort{address->str(), opts_.peer_port}.str();
  if (cluster_) cluster_->set_members(std::move(members));
}

}  // namespace endpointd::drain
