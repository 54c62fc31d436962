// The drain simulation: the world (API, kubelet, kernels, DNS caches, proxies), the agents with
// their real drain logic, the network between them, and the faults a seed draws.
#include "tests/drain/sim/sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <tuple>

#include "drain/late_inputs.h"
#include "feed/hub.h"       // kForgetAfter
#include "model/routing.h"  // the trace's "what the rule says" only; the check uses the oracle
#include "tests/drain/sim/oracle.h"

namespace endpointd::drain::sim {
namespace {

using namespace std::chrono_literals;

// The agents' Service (--drain-members-service) when the seed takes members from it.
const model::ServiceKey kAgentsService{"kube-system", "endpointd"};

// How often the DNS sink looks at what it answered (dns/sink.h).
constexpr milliseconds kAnswersTick{50};
// The share of agent stops that replace its pod (members from the agents' Service).
constexpr double kPodReplacedShare = 0.2;
// An unregistered router's connections (Faults::router_share): one this often, from an address
// outside the cluster; the node's connection tracking hands each to the agent this long after
// it arrived; the agent's drain loop reads them this often while an address is watched
// (drain/coordinator.cc's kLatePoll).
constexpr milliseconds kRouterEvery{20};
constexpr milliseconds kFlowLag{2};
constexpr milliseconds kLatePoll{100};
constexpr const char* kRouterAddress = "203.0.113.7";
// Each agent's --drain-peer-timeout.
constexpr milliseconds kPeerTimeout{2000};

std::string fmt_ms(milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

}  // namespace

// One pod of "web" (ClusterIP) or "db" (headless), as the API shows it.
struct PodRec {
  std::string name, ip, service;
  size_t node = 0;
  bool ready = true, terminating = false, exists = true;
  TimePoint terminated_at{};
  bool liveness = false;  // started in the fault-free tail: must release confirmed in time
  bool silent = false;    // annotated release-after: silent
  // An unregistered router sends to it every kRouterEvery from its termination until then
  // (none: the epoch).
  TimePoint router_until{};
  bool settled = false;  // released, failed, or past its grace
  model::PodPtr object;  // as the API shows it (made again when `terminating` changes)
};

// A proxy subscribed to one node's feed, and what it routes by: its last accepted config.
struct Sub {
  std::string name;
  model::SnapshotPtr acked;  // what it routes by (null: it never accepted anything)
  model::SnapshotPtr sent;   // the newest config its stream carried
  TimePoint ack_due{};
  bool wants = true;  // connects whenever the agent is there
  bool nacking = false;
  bool gone = false;  // never comes back during the fault phase
  // The hub forgot it (a lapsed ghost kForgetAfter gone) and it has not acknowledged since.
  bool forgotten = false;
  TimePoint back_at{}, nack_until{};
};

// What the feed hub of one agent knows of a subscriber identity (feed/hub.h's rules).
struct HubEntry {
  model::SnapshotPtr acked;  // the newest config it acknowledged
  bool connected = false;
  std::optional<TimePoint> outstanding_since;  // a response not acknowledged since
  std::optional<TimePoint> disconnected_at;
  bool lapsed = false;    // past its grace: a holdout until it acknowledges again
  uint64_t revision = 0;  // with no acked state (remembered across a restart): its revision
  TimePoint lapsed_at{};
};

// What of a board entry moves the drain: the consumer's state, its holdouts, its DNS TTL and
// answers (by identity: each is made anew when it changes).
struct BoardMark {
  const model::Snapshot* snapshot = nullptr;
  TimePoint applied_at{};
  milliseconds ttl{0};
  const pipeline::AnswerExpiry* answers = nullptr;
  std::vector<pipeline::AckBoard::Holdout> holdouts;
  bool operator==(const BoardMark&) const = default;
};

BoardMark mark_of(const pipeline::AckBoard::Entry& e) {
  return {e.snapshot.get(), e.applied_at, e.cache_ttl, e.answers.get(), e.holdouts};
}

// Whether `entries` are the board `last` marked (without copying them: asked every step).
bool same_board(const std::vector<pipeline::AckBoard::Entry>& entries,
                const std::vector<BoardMark>& last) {
  if (entries.size() != last.size()) return false;
  for (size_t k = 0; k < entries.size(); ++k) {
    const auto& e = entries[k];
    const auto& m = last[k];
    if (e.snapshot.get() != m.snapshot || e.applied_at != m.applied_at || e.cache_ttl != m.ttl ||
        e.answers.get() != m.answers || e.holdouts != m.holdouts)
      return false;
  }
  return true;
}

struct Agent {
  bool alive = true;
  // The members it waits for: the Node list's, and Nodes deleted while their agent may still
  // report, held as the coordinator holds them (drain/members.h).
  DeletedNodes deleted{std::chrono::seconds(30)};
  Members from_nodes, members;
  TimePoint down_until{}, paused_until{};
  std::unique_ptr<Machine> machine;
  std::unique_ptr<Aggregator> agg;
  LocalMarks marks;
  model::SnapshotPtr snap;  // the newest state its watch delivered
  TimePoint lag_until{};    // its watch is stuck until then (a relist after 410)
  milliseconds watch_delay{5};
  milliseconds program_delay{10};
  TimePoint slow_until{};
  model::SnapshotPtr proxy;  // the dataplane consumer: applied
  TimePoint proxy_at{};
  std::deque<std::pair<TimePoint, model::SnapshotPtr>> proxy_queue;
  model::SnapshotPtr dns;
  TimePoint dns_at{};
  // DNS, as the DNS sink keeps it (dns/sink.h): when the last answer that carried each
  // address expires; the addresses whose records left the zone (with that expiry); the zone's
  // answer at the last apply. What it publishes on its board entry (`answers`, a new map when
  // it changes) is the addresses that left the zone and the terminating or unready endpoints'
  // and terminating pods' addresses answered at all, looked at before each apply and every
  // kAnswersTick.
  std::map<model::IpAddr, TimePoint> served, departed;
  std::vector<model::IpAddr> in_zone;
  TimePoint answers_due{};
  std::shared_ptr<const pipeline::AnswerExpiry> answers =
      std::make_shared<pipeline::AnswerExpiry>();
  std::map<std::string, HubEntry> hub;      // by subscriber identity
  std::map<std::string, uint64_t> waiters;  // pod → prestop call id
  bool in_members = false;
  bool members_set = false;  // handed its members at least once
  uint64_t incarnation = 0;  // which process of the node's agent this is
  // New connections to its terminating pods, as the coordinator reads them (drain/late.h):
  // read up to late_read; the drain loop looks again at late_due while an address is watched.
  std::unique_ptr<LateWatch> late;
  TimePoint late_read{}, late_due{};
  // What woke the agent's loops since they last ran. The daemon's drain loop runs on a
  // snapshot, a board change, the cluster's view moving or a prestop call, else at the
  // machine's next deadline or the DNS answers' next expiry (drain/coordinator.cc); its
  // cluster loop on a message, its local watermark or members changing, else at the
  // aggregator's next deadline (drain/cluster.cc). Stepping the same way exercises those
  // deadlines, and a loop that would sleep costs nothing.
  bool drain_woken = true, cluster_woken = true;
  TimePoint cluster_due{};    // the aggregator's next deadline, as of its last poll
  uint64_t seen_cluster = 0;  // the cluster watermark and excluded list the cluster loop last saw
  std::set<std::string> seen_excluded;
  std::vector<BoardMark> last_board;
  TimePoint marks_due{};  // the DNS answers' next expiry (LocalMarks::update's wake)
  std::set<model::IpAddr> local_fallback;
  // The board as board() made it last, and what makes it again: something it reads changed
  // (dirty), or a subscriber's grace or the hub's forgetting comes due. Between those it is
  // what it was, and most steps of a quiet world need nothing else.
  std::vector<pipeline::AckBoard::Entry> board;
  bool board_dirty = true;
  bool board_unmarked = true;  // made since the local watermark last looked at it
  TimePoint board_due = TimePoint::max();
  // The DNS answer for the headless service at `dns` (the oracle's, asked once per state).
  model::SnapshotPtr answer_for;
  std::vector<model::IpAddr> answer;
};

struct NodeRec {
  std::string name, address;
  bool in_api = true;
  model::SnapshotPtr kernel;        // what its kernel routes by: outlives its agent
  model::SnapshotPtr targets_of;    // the kernel state `targets` was read from
  std::set<model::IpAddr> targets;  // what that state DNATs to (the oracle's reading)
  Members kept;  // the members its agent waited for, as --drain-state-file keeps them
  std::set<std::string> agents_seen;  // nodes its agent saw running an agent (the same file)
  bool in_agents_service = true;      // its agent's endpoint in the agents' Service
  TimePoint agents_service_at{};      // when that changes next (the EndpointSlice controller)
  std::vector<Sub> subs;
  Agent agent;
  model::NodePtr object;  // its Node as the API shows it
};

struct Packet {
  TimePoint at;
  uint64_t seq;
  size_t from, to;
  Message message;
};

class World {
 public:
  World(Options o, uint64_t seed)
      : o_(std::move(o)), rng_(seed), router_rng_(seed ^ 0x6c617465ULL) {
    report_.seed = seed;
    for (size_t i = 0; i < o_.nodes; ++i) {
      NodeRec n;
      n.name = "node-" + std::to_string(i);
      n.address = "10.0.0." + std::to_string(i + 1);
      for (size_t s = 0; s < o_.subscribers_per_node; ++s) {
        Sub sub;
        sub.name = "proxy-" + std::to_string(i) + "-" + std::to_string(s);
        n.subs.push_back(std::move(sub));
      }
      nodes_.push_back(std::move(n));
    }
    // Three pods of each service, spread over the nodes.
    for (const char* svc : {"web", "db"})
      for (int k = 0; k < 3; ++k) add_pod(svc, pick(o_.nodes));
    ttl_ = max_ttl_ = o_.dns_ttl;
    publish();
    for (size_t i = 0; i < nodes_.size(); ++i) start_agent(i);
  }

  // ---- the API ------------------------------------------------------------------------------

  // A new pod of `svc`; a replacement during the fault phase may get the address of a pod gone
  // earlier (`ip_reuse`).
  void add_pod(std::string svc, size_t node, bool replacement = false) {
    PodRec p;
    p.service = svc;
    p.name = svc + "-" + std::to_string(next_pod_);
    if (replacement && in_fault_phase() && !freed_.empty() && chance(o_.ip_reuse)) {
      size_t k = pick(freed_.size());
      p.ip = freed_[k];
      freed_.erase(freed_.begin() + static_cast<std::ptrdiff_t>(k));
      ++report_.ips_reused;
      trace("pod " + p.name + " reuses " + p.ip);
    } else {
      p.ip = "10.244." + std::to_string(next_pod_ / 200 + 1) + "." +
             std::to_string(next_pod_ % 200 + 2);
    }
    ++next_pod_;
    p.node = node;
    p.silent = router_chance(o_.silent_share);
    pods_.push_back(std::move(p));
  }

  // The API's revisions, as the agent's store takes them (pipeline/store.cc): every write moves
  // the resourceVersion (rev_), but a snapshot's slice revision moves only with an
  // EndpointSlice write; a Service-only, Node or Pod change leaves it where it was, and a
  // service state changed by its spec alone carries the slice revision it was built at.
  model::SnapshotPtr build() {
    auto s = std::make_shared<model::Snapshot>();
    s->generation = rev_;
    s->synced = true;
    const model::Snapshot* last = history_.empty() ? nullptr : history_.back().second.get();
    std::vector<model::ServiceStatePtr> services;
    std::vector<std::shared_ptr<model::ServiceState>> changed;
    bool slices_written = false;
    for (const char* svc : {"db", "web"}) {
      auto st = std::make_shared<model::ServiceState>();
      st->service.key = {"demo", svc};
      st->service.headless = std::string(svc) == "db";
      if (local_until_.count(svc))
        st->service.internal_traffic_policy = model::TrafficPolicy::kLocal;
      if (!st->service.headless) st->service.cluster_ips = {*model::IpAddr::parse("10.96.0.10")};
      model::ServicePort sp;
      sp.name = "http";
      sp.port = 80;
      sp.target_port_name = "http";
      st->service.ports = {sp};
      for (const auto& p : pods_) {
        if (!p.exists || p.service != svc) continue;
        model::MergedEndpoint m;
        m.address = *model::IpAddr::parse(p.ip);
        bool unready = fallback_.count(svc) && !p.terminating;
        m.conditions = {p.ready && !p.terminating && !unready, !unready, p.terminating};
        m.ports = {model::EndpointPort{"http", model::Protocol::kTCP, 8080, ""}};
        m.node_name = nodes_[p.node].name;
        m.target_ref = model::ObjectRef{"Pod", "demo", p.name, "uid-" + p.name};
        st->endpoints.push_back(m);
      }
      std::sort(st->endpoints.begin(), st->endpoints.end(),
                [](const auto& a, const auto& b) { return a.address < b.address; });
      // As the agent's store does: an unchanged service keeps its state; a changed one
      // directly follows the last (the API's updates are one revision each).
      const model::ServiceState* was = last ? last->find(st->service.key) : nullptr;
      if (was && was->endpoints == st->endpoints && was->service.equal_spec(st->service)) {
        services.push_back(last->find_ptr(st->service.key));
        continue;
      }
      if (!was || was->endpoints != st->endpoints) slices_written = true;
      st->follows = was ? was->revision : 0;
      changed.push_back(st);
      services.push_back(st);
    }
    if (o_.members_service) {
      auto st = std::make_shared<model::ServiceState>();
      st->service.key = kAgentsService;
      st->service.headless = true;
      for (const auto& n : nodes_) {
        if (!n.in_agents_service) continue;
        model::MergedEndpoint m;
        m.address = *model::IpAddr::parse(n.address);  // a hostNetwork DaemonSet's pod
        m.conditions = {true, true, false};
        m.node_name = n.name;
        m.target_ref = model::ObjectRef{"Pod", "kube-system", "endpointd-" + n.name,
                                        "uid-endpointd-" + n.name};
        st->endpoints.push_back(m);
      }
      const model::ServiceState* was = last ? last->find(kAgentsService) : nullptr;
      if (was && was->endpoints == st->endpoints) {
        services.push_back(last->find_ptr(kAgentsService));
      } else {
        slices_written = true;
        st->follows = was ? was->revision : 0;
        changed.push_back(st);
        services.push_back(st);
      }
      std::sort(services.begin(), services.end(),
                [](const auto& a, const auto& b) { return a->key() < b->key(); });
    }
    if (slices_written || !last) slice_rev_ = rev_;
    for (auto& st : changed) st->revision = slice_rev_;
    s->slice_revision = slice_rev_;
    s->services = model::ServiceList(std::move(services));
    // The objects that did not change are the ones the last state had, as the store keeps them.
    for (auto& n : nodes_) {
      if (!n.in_api) continue;
      if (!n.object) {
        auto node = std::make_shared<model::Node>();
        node->name = n.name;
        node->addresses = {{"InternalIP", n.address}};
        n.object = std::move(node);
      }
      s->nodes.push_back(n.object);
    }
    for (auto& p : pods_) {
      if (!p.exists) continue;
      if (!p.object || p.object->terminating != p.terminating) {
        auto pod = std::make_shared<model::Pod>();
        pod->key = {"demo", p.name};
        pod->uid = "uid-" + p.name;
        pod->node_name = nodes_[p.node].name;
        pod->pod_ips = {*model::IpAddr::parse(p.ip)};
        pod->terminating = p.terminating;
        pod->termination_grace_period_seconds = 10;
        pod->annotations[kReleaseAfterAnnotation] = p.silent ? "silent" : "removed";
        p.object = std::move(pod);
      }
      s->pods.push_back(p.object);
    }
    std::sort(s->pods.begin(), s->pods.end(),
              [](const auto& a, const auto& b) { return a->key < b->key; });
    return s;
  }

  void publish() {
    ++rev_;
    history_.emplace_back(now_, build());
    if (history_.size() > 512) history_.pop_front();
  }

  // ---- the agents ---------------------------------------------------------------------------

  void start_agent(size_t i) {
    Agent& a = nodes_[i].agent;
    // A new process: nothing of the old one but what the node keeps (its kernel) and, when the
    // hub's memory survives, the feed identities it knew.
    std::map<std::string, HubEntry> hub;
    if (o_.hub_memory_survives_restart) {
      hub = std::move(a.hub);
      // As the hub's state file keeps it (--feed-state-file): each name and the revision of its
      // last acknowledged state, not the state itself. A new process holds at nothing for each
      // until it is back and acknowledges, or its grace (from the start) passes.
      for (auto& [name, e] : hub) {
        if (e.acked) e.revision = e.acked->slice_revision;
        e.acked = nullptr;
        e.disconnected_at = now_;
        e.connected = false;
        e.outstanding_since.reset();
        e.lapsed = false;
      }
    }
    if (!o_.node_state_survives_restart) {
      nodes_[i].kept.clear();
      nodes_[i].agents_seen.clear();
    }
    a = Agent{};
    a.incarnation = ++incarnations_;
    a.hub = std::move(hub);
    a.deleted.seed(nodes_[i].kept);
    drain::Options mo;
    mo.node_name = nodes_[i].name;
    mo.peer_timeout = kPeerTimeout;
    if (o_.members_service) mo.members_service = kAgentsService;
    mo.peer_policy = o_.policy;
    mo.default_release_after = ReleaseAfter::kRemoved;
    mo.terminating_wait = 5000ms;
    a.machine = std::make_unique<Machine>(mo);
    a.late = std::make_unique<LateWatch>(std::chrono::seconds(5));
    a.late_read = now_;
    a.agg = std::make_unique<Aggregator>(nodes_[i].name, o_.aggregator);
    a.watch_delay = milliseconds(1 + static_cast<int64_t>(rng_() % 20));
    a.program_delay = milliseconds(2 + static_cast<int64_t>(rng_() % 30));
    a.alive = true;
  }

  bool running(size_t i) const {
    const Agent& a = nodes_[i].agent;
    return a.alive && a.paused_until <= now_;
  }

  // The agent's board, made again only when it may have changed (Agent::board).
  const std::vector<pipeline::AckBoard::Entry>& board(size_t i) {
    Agent& a = nodes_[i].agent;
    if (a.board_dirty || now_ >= a.board_due) {
      a.board = make_board(i);
      a.board_dirty = false;
      a.board_unmarked = true;
    }
    return a.board;
  }

  std::vector<pipeline::AckBoard::Entry> make_board(size_t i) {
    Agent& a = nodes_[i].agent;
    a.board_due = TimePoint::max();
    std::vector<pipeline::AckBoard::Entry> out;
    out.reserve(3);
    pipeline::AckBoard::Entry p;
    p.consumer = "proxy";
    p.view = model::RouteView::kDataplane;
    p.snapshot = a.proxy;
    p.applied_at = a.proxy_at;
    out.push_back(std::move(p));
    if (o_.dns) {
      pipeline::AckBoard::Entry d;
      d.consumer = "dns";
      d.view = model::RouteView::kDns;
      d.snapshot = a.dns;
      d.applied_at = a.dns_at;
      d.cache_ttl = max_ttl_;
      d.answers = a.answers;
      out.push_back(std::move(d));
    }
    if (!nodes_[i].subs.empty() && a.snap) {
      pipeline::AckBoard::Entry f;
      f.consumer = "feed";
      f.view = model::RouteView::kFeed;
      model::SnapshotPtr applied = a.snap;
      for (auto hit = a.hub.begin(); hit != a.hub.end();) {
        const std::string& name = hit->first;
        HubEntry& e = hit->second;
        std::optional<TimePoint> since = e.connected ? e.outstanding_since : e.disconnected_at;
        // Once past its grace it stays a holdout until it acknowledges again: holding the
        // watermark again while behind would move it back (feed/hub.h: applied never moves back).
        if (since && now_ - *since >= o_.feed_grace && !e.lapsed) {
          e.lapsed = true;
          e.lapsed_at = *since + o_.feed_grace;
        }
        // A lapsed ghost is forgotten kForgetAfter after it lapsed or went away, whichever is
        // later (feed/hub.h): from then on the hub knows no such subscriber.
        if (e.lapsed && !e.connected && e.disconnected_at &&
            now_ - std::max(e.lapsed_at, *e.disconnected_at) >= feed::kForgetAfter) {
          for (auto& s : nodes_[i].subs)
            if (s.name == name) s.forgotten = true;
          trace("hub of " + nodes_[i].name + " forgets " + name);
          ++report_.faults["subscriber forgotten"];
          hit = a.hub.erase(hit);
          continue;
        }
        ++hit;
        // When this entry next changes by time alone: its grace ends, or it is forgotten.
        if (!e.lapsed && since) a.board_due = std::min(a.board_due, *since + o_.feed_grace);
        if (e.lapsed && !e.connected && e.disconnected_at)
          a.board_due =
              std::min(a.board_due, std::max(e.lapsed_at, *e.disconnected_at) + feed::kForgetAfter);
        if (e.lapsed) {
          const char* why = !e.connected ? "disconnected" : "unacknowledged";
          for (const auto& s : nodes_[i].subs)
            if (s.name == name && s.nacking && e.connected) why = "nacking";
          f.holdouts.push_back({name, e.acked, e.lapsed_at, why, e.acked ? 0 : e.revision});
          continue;
        }
        if (!e.acked) {
          applied = nullptr;  // holds everything: it has accepted nothing yet
          break;
        }
        if (applied && e.acked->generation < applied->generation) applied = e.acked;
      }
      f.snapshot = applied;
      out.push_back(std::move(f));
    }
    return out;
  }

  // Hands the agent's machine and aggregator its members (the Node list's and the deleted ones
  // held), and keeps them as its node's state file does.
  void set_members(size_t i, bool unless_same = false) {
    Agent& a = nodes_[i].agent;
    Members next = a.deleted.with_held(a.from_nodes);
    // A new view with the same members: the coordinator hands on nothing.
    if (unless_same && a.members_set && next == a.members) return;
    a.members_set = true;
    a.members = std::move(next);
    a.machine->set_members(a.members);
    std::vector<std::string> names;
    for (const auto& [name, _] : a.members) names.push_back(name);
    a.agg->set_members(names, now_);
    a.in_members = a.members.count(nodes_[i].name) > 0;
    nodes_[i].kept = a.members;
    a.drain_woken = a.cluster_woken = true;
  }

  void step_agent(size_t i) {
    NodeRec& n = nodes_[i];
    Agent& a = n.agent;
    // The watch: the newest state it has had time to see.
    // A watch that fell behind (a relist after 410) delivers nothing until it catches up.
    model::SnapshotPtr next;
    for (auto it = history_.rbegin(); a.lag_until <= now_ && it != history_.rend(); ++it) {
      if (it->first + a.watch_delay <= now_) {
        next = it->second;
        break;
      }
    }
    if (next && (!a.snap || next->generation > a.snap->generation)) {
      a.snap = next;
      a.board_dirty = true;  // the feed's entry starts from the current state
      a.drain_woken = true;
      a.marks_due = now_;  // LocalMarks looks at the new view
      // The members first, as the coordinator hands them on before the snapshot.
      if (o_.members_service) {
        // As the coordinator: the nodes its agent saw in the agents' Service, kept in the
        // node's state file, are members from then on.
        if (const auto* st = next->find(kAgentsService))
          for (const auto& ep : st->endpoints) n.agents_seen.insert(ep.node_name);
        a.from_nodes = members_of(*next, kAgentsService, &n.agents_seen);
      } else {
        a.from_nodes = members_of(*next, std::nullopt);
      }
      a.deleted.observe(a.from_nodes, now_);
      a.deleted.take_changed();
      set_members(i, true);
      ask_peers(i, a.machine->on_snapshot(next, now_));
      a.marks.snapshot(next, n.name);
      milliseconds d = a.slow_until > now_ ? milliseconds(200 + rng_() % 800) : a.program_delay;
      a.proxy_queue.emplace_back(now_ + d, next);
      if (o_.dns && (!a.dns || a.dns->generation < next->generation)) {
        a.dns = next;
        a.dns_at = now_;
        a.board_dirty = true;
        dns_applied(i);
      }
      // The feed: every connected subscriber is sent the new state.
      for (auto& s : n.subs) {
        auto it = a.hub.find(s.name);
        if (it == a.hub.end() || !it->second.connected) continue;
        s.sent = next;
        s.ack_due = now_ + milliseconds(1 + rng_() % 40);
        if (!it->second.outstanding_since) it->second.outstanding_since = now_;
      }
    }
    while (!a.proxy_queue.empty() && a.proxy_queue.front().first <= now_) {
      a.proxy = a.proxy_queue.front().second;
      a.proxy_at = now_;
      a.board_dirty = true;
      n.kernel = a.proxy;  // the kernel holds it from now on, whatever becomes of the agent
      a.proxy_queue.pop_front();
    }
    // Subscribers connect, acknowledge or reject.
    for (auto& s : n.subs) {
      auto it = a.hub.find(s.name);
      bool up = s.wants && !s.gone;
      if (!up) {
        if (it != a.hub.end() && it->second.connected) {
          a.board_dirty = true;
          it->second.connected = false;
          it->second.disconnected_at = now_;
          it->second.outstanding_since.reset();
        }
        continue;
      }
      if (!a.snap) continue;
      if (it == a.hub.end() || !it->second.connected) {
        // A (re)connection. An identity the hub knows starts from what it acknowledged last;
        // a new one from the current state, which it is about to be sent anyway.
        if (it == a.hub.end()) {
          // A subscriber the hub never met counts from the state current when it joined: it
          // has been told nothing older (feed/hub.h).
          HubEntry e;
          e.acked = a.snap;
          it = a.hub.emplace(s.name, e).first;
        }
        // The grace runs from when it was first waited on: a reconnecting stream carries its
        // ghost's wait (feed/hub.h), so reconnecting again and again holds nothing forever.
        a.board_dirty = true;
        it->second.connected = true;
        it->second.outstanding_since = it->second.disconnected_at.value_or(now_);
        it->second.disconnected_at.reset();
        s.sent = a.snap;
        s.ack_due = now_ + milliseconds(1 + rng_() % 40);
      }
      if (s.sent && s.ack_due <= now_ && !s.nacking && s.acked != s.sent) {
        s.acked = s.sent;
        s.forgotten = false;
        a.board_dirty = true;
        it->second.acked = s.sent;
        it->second.outstanding_since.reset();
        it->second.lapsed = false;
      }
    }
    // DNS: clients on this node ask for the headless service now and then.
    if (o_.dns && a.dns && pick(100) < 20) answer_dns(i);
    if (o_.dns && a.dns && now_ >= a.answers_due) publish_answers(i);

    // The local watermark: when the board moved, or an answer's expiry came. (A board not made
    // again since the watermark looked is the one it looked at.)
    const bool board_moves = a.board_dirty || now_ >= a.board_due;
    if ((board_moves || a.board_unmarked) && !same_board(board(i), a.last_board))
      a.marks_due = now_;
    a.board_unmarked = false;
    if (now_ >= a.marks_due) {
      const auto& entries = board(i);
      a.last_board.clear();
      for (const auto& e : entries) a.last_board.push_back(mark_of(e));
      TimePoint wake = now_ + 1h;
      auto m = a.marks.update(entries, n.name, now_, &wake);
      a.marks_due = wake;
      a.local_fallback = std::move(m.fallback);
      a.agg->set_local(m.routing, m.dns, std::move(m.holdouts));
      a.cluster_woken = a.drain_woken = true;
    }
    // The cluster loop.
    if (a.cluster_woken || now_ >= a.cluster_due) {
      a.cluster_woken = false;
      for (auto& s : a.agg->poll(now_)) send(i, std::move(s));
      // Whatever changes the aggregator after this (a message, the local watermark, members)
      // wakes the loop again, so its deadline holds until then.
      a.cluster_due = a.agg->next_deadline();
      // The drain loop wakes when the cluster watermark or the excluded list moved since the
      // cluster loop last looked (drain/cluster.cc's on_change), a message's doing included.
      if (a.agg->cluster_watermark() != a.seen_cluster || a.agg->excluded() != a.seen_excluded) {
        a.seen_cluster = a.agg->cluster_watermark();
        a.seen_excluded = a.agg->excluded();
        a.drain_woken = true;
      }
    }
    // Deleted Nodes held as members go once their agent has been silent past the bound.
    auto expiry = a.deleted.next_expiry();
    if (a.drain_woken || (expiry && now_ >= *expiry)) {
      // As the coordinator: a node the cluster excludes ran an agent.
      if (o_.members_service && a.snap && learn_agents(n.agents_seen, a.agg->excluded())) {
        a.from_nodes = members_of(*a.snap, kAgentsService, &n.agents_seen);
        set_members(i);
      }
      a.deleted.excluded(a.agg->excluded(), now_);
      if (a.deleted.take_changed()) set_members(i);
    }
    bool late_due = a.late_due != TimePoint{} && now_ >= a.late_due;
    // With nothing draining and nobody waiting, evaluate() has nothing to do; the late watch
    // is still read while it watches an address (the coordinator's pass does it every
    // kLatePoll: a window ends when another pod is seen holding the address).
    if (a.machine->drains().empty() && a.waiters.empty()) {
      if (late_due) observe_late(i);
      return;
    }
    auto deadline = a.machine->next_deadline();
    if (!a.drain_woken && !late_due && !(deadline && now_ >= *deadline)) return;
    a.drain_woken = false;
    ClusterFacts facts = a.agg->facts();
    Machine::Inputs in;
    in.now = now_;
    in.consumers = board(i);
    in.cluster = &facts;
    in.local_fallback = a.local_fallback;
    in.late = observe_late(i);
    a.machine->evaluate(in);
    settle_waiters(i);
  }

  // As the coordinator's pass (observe_late): this node's drains to the late watch, the new
  // connections its kernel saw since the last read (the unregistered routers'), and the late
  // senders of each drain for the machine.
  std::map<DrainKey, Machine::Inputs::Late> observe_late(size_t i) {
    Agent& a = nodes_[i].agent;
    a.late->update(late_watch_pods(a.machine->drains()), nodes_[i].name, a.snap.get(), now_);
    const TimePoint upto = now_ - kFlowLag;
    std::vector<SeenFlow> flows;
    if (upto > a.late_read) {
      for (const auto& p : pods_) {
        if (!p.exists || p.node != i || p.router_until == TimePoint{}) continue;
        for (TimePoint t = first_router_flow(p, a.late_read + milliseconds(1));
             t <= std::min(upto, p.router_until); t += kRouterEvery)
          flows.push_back({*model::IpAddr::parse(kRouterAddress), *model::IpAddr::parse(p.ip), t});
      }
      a.late_read = upto;
    }
    std::sort(flows.begin(), flows.end(), [](const auto& x, const auto& y) { return x.at < y.at; });
    a.late->observe(flows, a.snap.get());
    a.late_due = a.late->addresses().empty() ? TimePoint{} : now_ + kLatePoll;
    // Records whose window ended are dropped, as the coordinator's take_finished does.
    a.late->take_finished(now_);
    return late_inputs(*a.late, a.machine->drains());
  }
  // The first of an unregistered router's connections to `p` at or after `t` (they come every
  // kRouterEvery from the pod's termination).
  static TimePoint first_router_flow(const PodRec& p, TimePoint t) {
    if (t <= p.terminated_at) return p.terminated_at;
    auto k = (t - p.terminated_at + kRouterEvery - std::chrono::nanoseconds(1)) / kRouterEvery;
    return p.terminated_at + k * kRouterEvery;
  }
  // The routers' and silent pods' draws come from their own generator: the other faults of a
  // seed are drawn as they were before these existed.
  bool router_chance(double p) {
    if (p <= 0) return false;
    return static_cast<double>(router_rng_()) * 0x1p-64 < p;
  }

  // The zone's answer for the headless service at the agent's DNS state.
  const std::vector<model::IpAddr>& zone_answer(Agent& a) {
    if (a.answer_for != a.dns) {
      a.answer = oracle_.dns_answer(*a.dns, "db.demo.svc.cluster.local");
      a.answer_for = a.dns;
    }
    return a.answer;
  }

  // A client asks node i's DNS for the headless service and caches exactly the addresses of
  // the zone's answer (the DNS sink's zone, built from its applied snapshot).
  void answer_dns(size_t i) {
    Agent& a = nodes_[i].agent;
    const auto& answer = zone_answer(a);
    for (const auto& address : answer) {
      TimePoint until = now_ + ttl_;
      dns_cache_.push_back({address, until, i});
      auto& u = a.served[address];
      u = std::max(u, until);
    }
    ++report_.faults["dns queries"];
  }

  // The DNS sink applied a new state: records that left the zone keep the expiry of their last
  // answer; then it publishes, before the board hears of the state.
  void dns_applied(size_t i) {
    Agent& a = nodes_[i].agent;
    std::vector<model::IpAddr> now_in = zone_answer(a);
    for (const auto& address : a.in_zone) {
      if (std::find(now_in.begin(), now_in.end(), address) != now_in.end()) continue;
      auto it = a.served.find(address);
      if (it == a.served.end()) continue;
      auto& d = a.departed[address];
      d = std::max(d, it->second);
    }
    a.in_zone = std::move(now_in);
    publish_answers(i);
  }

  void publish_answers(size_t i) {
    Agent& a = nodes_[i].agent;
    a.answers_due = now_ + kAnswersTick;
    // Forgotten once long expired (ZoneBuilder::harvest).
    auto old = [&](const auto& e) { return e.second + 2 * max_ttl_ < now_; };
    std::erase_if(a.served, old);
    std::erase_if(a.departed, old);
    // What it would publish, made in a reused list (most looks find it unchanged).
    auto& next = answers_scratch_;
    next.assign(a.departed.begin(), a.departed.end());
    auto candidate = [&](const model::IpAddr& address) {
      auto it = a.served.find(address);
      if (it != a.served.end()) next.emplace_back(address, it->second);
    };
    for (const auto& st : a.dns->services)
      for (const auto& e : st->endpoints)
        if (e.conditions.terminating || !e.conditions.ready) candidate(e.address);
    for (const auto& p : a.dns->pods)
      if (p->terminating)
        for (const auto& address : p->pod_ips) candidate(address);
    // One entry an address, its latest expiry.
    std::sort(next.begin(), next.end());
    size_t out = 0;
    for (size_t k = 0; k < next.size(); ++k) {
      if (out > 0 && next[out - 1].first == next[k].first)
        next[out - 1].second = std::max(next[out - 1].second, next[k].second);
      else
        next[out++] = next[k];
    }
    next.resize(out);
    if (std::equal(next.begin(), next.end(), a.answers->until.begin(), a.answers->until.end(),
                   [](const auto& x, const auto& y) {
                     return x.first == y.first && x.second == y.second;
                   }))
      return;
    auto fresh = std::make_shared<pipeline::AnswerExpiry>();
    fresh->until.insert(next.begin(), next.end());
    fresh->as_of = now_;
    a.answers = std::move(fresh);
    a.board_dirty = true;
  }

  // ---- peers asked directly (AwaitRemoval) ------------------------------------------------

  // The drains a snapshot started or moved that the cluster watermark does not confirm (a
  // Service-only change: Drain::ask_peers) ask each pending peer, as the coordinator does; the
  // call lasts until the peer's own board says removed (drain::local_removal, what the peer
  // server answers from) or the deadline the coordinator gives it.
  void ask_peers(size_t i, const std::vector<DrainKey>& started) {
    Agent& a = nodes_[i].agent;
    for (const auto& key : started) {
      auto it = a.machine->drains().find(key);
      if (it == a.machine->drains().end()) continue;
      const Drain& d = it->second;
      if (d.revision > 0 && !d.ask_peers) continue;  // the cluster watermark's to confirm
      TimePoint deadline = o_.policy == PeerPolicy::kWait
                               ? (d.reconfirm ? d.budget_end : d.removal_deadline)
                               : std::max(d.start, d.peers_since) + kPeerTimeout;
      for (const auto& [node, p] : d.peers) {
        if (p.state != PeerState::State::kPending) continue;
        size_t to = index_of(node);
        if (to == SIZE_MAX) continue;
        asks_.push_back({i, to, a.incarnation, key.ip, deadline, d.revision});
        ++report_.faults["peers asked directly"];
      }
    }
  }

  void answer_asks() {
    for (auto it = asks_.begin(); it != asks_.end();) {
      Agent& from = nodes_[it->from].agent;
      if (!from.alive || from.incarnation != it->incarnation) {
        it = asks_.erase(it);  // the asking process is gone, and its call with it
        continue;
      }
      if (!running(it->from)) {
        ++it;
        continue;
      }
      const std::string& peer = nodes_[it->to].name;
      if (now_ >= it->deadline) {
        from.machine->peer_answered(it->ip, peer, false, "deadline exceeded", now_);
        from.drain_woken = true;
        it = asks_.erase(it);
        continue;
      }
      bool reachable = running(it->to) && nodes_[it->to].agent.snap &&
                       !cut_.count({std::min(it->from, it->to), std::max(it->from, it->to)});
      if (reachable && local_removal(board(it->to), it->ip, peer, now_, it->revision).removed) {
        from.machine->peer_answered(it->ip, peer, true, "", now_);
        from.drain_woken = true;
        it = asks_.erase(it);
        continue;
      }
      ++it;
    }
  }

  // ---- the kubelet --------------------------------------------------------------------------

  void call_prestops(size_t i) {
    Agent& a = nodes_[i].agent;
    if (!prestops_pending_ || !running(i) || !a.snap) return;
    for (auto& p : pods_) {
      if (!p.exists || !p.terminating || p.settled || p.node != i || a.waiters.count(p.name))
        continue;
      a.waiters[p.name] = a.machine->add_waiter({"demo", p.name}, "uid-" + p.name, now_);
      a.drain_woken = true;
    }
  }

  void settle_waiters(size_t i) {
    Agent& a = nodes_[i].agent;
    for (auto it = a.waiters.begin(); it != a.waiters.end();) {
      auto v = a.machine->verdict(it->second);
      if (!v) {
        ++it;
        continue;
      }
      PodRec* pod = find_pod(it->first);
      if (pod && !pod->settled) {
        pod->settled = true;
        if (v->release) released(i, *pod, v->reason);
        pod->exists = false;  // the application exits; the pod and its endpoint go
        freed_.push_back(pod->ip);
        std::string svc = pod->service;
        add_pod(std::move(svc), pick_in_api(), true);
        publish();
      }
      a.machine->remove_waiter(it->second);
      it = a.waiters.erase(it);
    }
  }

  // `why`: the verdict the pod's prestop was given — what the pod and its operator read, so
  // what is checked: "…, confirmed", and "has no endpoints: nothing to remove", claim that
  // nothing routes to it.
  void released(size_t i, const PodRec& pod, const std::string& why) {
    const Drain* d = nullptr;
    auto ip = *model::IpAddr::parse(pod.ip);
    // The pod's drain (a drain belongs to one pod), for the names of who may still route.
    for (const auto& [key, drain] : nodes_[i].agent.machine->drains())
      if (drain.ip == ip && drain.pod_uid == "uid-" + pod.name) d = &drain;
    bool confirmed = why.find("), confirmed") != std::string::npos ||
                     why.find("has no endpoints") != std::string::npos;
    ++report_.drains;
    (confirmed ? report_.releases_confirmed : report_.releases_unconfirmed)++;
    outcomes_[pod.ip] = confirmed ? "confirmed" : "unconfirmed";
    released_after_[pod.ip] = std::chrono::duration_cast<milliseconds>(now_ - pod.terminated_at);
    if (d)
      for (const auto& u : d->unconfirmed)
        unconfirmed_[pod.ip].push_back(u.node + "/" + u.consumer + ": " + u.reason);
    std::string who;
    for (const auto& u : unconfirmed_[pod.ip]) who += " [" + u + "]";
    if (tracing_) {
      who +=
          " {view " + std::to_string(nodes_[i].agent.snap ? nodes_[i].agent.snap->generation : 0);
      for (const auto& e : board(i)) {
        who += " " + e.consumer + "@" + std::to_string(e.generation()) +
               (e.snapshot && model::routes_to(e.view, *e.snapshot, *model::IpAddr::parse(pod.ip),
                                               {nodes_[i].name, {}})
                    ? "(routes)"
                    : "");
        for (const auto& h : e.holdouts)
          who += " holdout " + h.client + "@" +
                 std::to_string(h.snapshot ? h.snapshot->generation : 0);
      }
      for (const auto& [name, e] : nodes_[i].agent.hub)
        who += " hub " + name + "@" + std::to_string(e.acked ? e.acked->generation : 0) +
               (e.connected ? " up" : " down");
      who += "}";
    }
    trace("release " + pod.name + " " + pod.ip + " by " + nodes_[i].name + ": " +
          (confirmed ? "confirmed" : "unconfirmed") + who);
    if (pod.liveness && (!confirmed || now_ - pod.terminated_at > o_.liveness)) {
      std::string why =
          confirmed ? "confirmed after " + fmt_ms(released_after_[pod.ip]) : "unconfirmed:";
      for (const auto& u : unconfirmed_[pod.ip]) why += " [" + u + "]";
      report_.liveness.push_back({"fault-free drain of " + pod.name + " " + why, elapsed()});
    }
    if (d && pod.router_until != TimePoint{}) check_router(pod, *d, confirmed);
    if (!confirmed) return;
    check_release(i, pod, ip);
  }

  // An unregistered router's connections, read from the world's schedule (not from the late
  // watch): one that reached the pod's node at or after its drain's removal and that the
  // node's connection tracking handed over before the release makes a "confirmed" release
  // false. Under silent, the release comes no sooner than the quiet time (Machine's default,
  // 1 s) after the last of them — so never while the router still sends — unless the pod's
  // budget ended (its grace of 10 s less the 2 s margin, counted from its termination: the
  // agent's budget starts no sooner).
  void check_router(const PodRec& pod, const Drain& d, bool confirmed) {
    if (!d.removed) return;
    const TimePoint seen_by = std::min(now_ - kFlowLag, pod.router_until);
    const TimePoint first = first_router_flow(pod, *d.removed);
    if (first > seen_by) return;
    if (confirmed) {
      report_.safety.push_back(
          {"released " + pod.name + " " + pod.ip +
               " confirmed while an unregistered router sent to it after its removal (from " +
               fmt_ms(std::chrono::duration_cast<milliseconds>(first - start_)) + ")",
           elapsed()});
      return;
    }
    ++report_.late_unconfirmed;
    if (!pod.silent) return;
    TimePoint last = first;
    while (last + kRouterEvery <= seen_by) last += kRouterEvery;
    if (now_ >= pod.terminated_at + 8s) {
      if (now_ < last + 1000ms) ++report_.silent_at_budget;
      return;
    }
    if (now_ < last + 1000ms)
      report_.safety.push_back(
          {"released " + pod.name + " " + pod.ip + " (release-after silent) " +
               fmt_ms(std::chrono::duration_cast<milliseconds>(now_ - last)) +
               " after an unregistered router's last connection, within the quiet time",
           elapsed()});
  }

  // The invariant: nothing routes to a pod released as confirmed — who routes read by the
  // oracle from what each consumer holds. The cases excused, each counted in the Report:
  //  - a state newer than any the releasing agent had seen (the API moved every other endpoint
  //    out after the agent's view, and the terminating fallback routes to the pod there; no
  //    agent can confirm a state it has not seen — see bench/results/drain-truth.md):
  //    fallback_after_view;
  //  - a node that is not among the releasing agent's members: one whose Node its view does
  //    not list (created again since): node_after_view; one deleted whose agent it has seen
  //    excluded for silence past the bound (drain/members.h DeletedNodes), or deleted before
  //    the agent ever listed it: node_deleted_routes, when it routes;
  //  - an EDS subscriber that holds the pod DRAINING beside few healthy hosts: taken by
  //    endpointd's contract, not Envoy's default panic threshold: eds_panic_assumed_off;
  //  - a subscriber the node's hub has forgotten (feed/hub.h: a lapsed ghost, kForgetAfter
  //    after it went) that still routes by its last config: no longer a known subscriber
  //    (DESIGN.md), until it acknowledges again: forgotten_subscriber_routes.
  void check_release(size_t i, const PodRec& pod, const model::IpAddr& ip) {
    const model::Snapshot* agent_snap = nodes_[i].agent.snap.get();
    auto in_view = [&](const std::string& node) {
      return agent_snap && agent_snap->find_node(node) != nullptr;
    };
    const uint64_t view = agent_snap ? agent_snap->generation : 0;
    std::string what;
    auto judge = [&](const model::SnapshotPtr& st, bool routes, const std::string& who) {
      if (!routes) return;
      if (st->generation > view) {
        ++report_.fallback_after_view;
        return;
      }
      what += " " + who + " (revision " + std::to_string(st->generation) + ")";
    };
    for (auto& n : nodes_) {
      const bool kernel = n.kernel && kernel_targets(n).count(ip) > 0;
      std::vector<Oracle::FeedHold> held;
      for (const auto& s : n.subs) {
        held.push_back(s.acked ? oracle_.feed_holds(*s.acked, ip) : Oracle::FeedHold{});
        const auto& h = held.back();
        if (h.eds && !h.upstream) ++report_.feed_eds_only;
        if (h.upstream && !h.eds) ++report_.feed_upstream_only;
      }
      // A deleted Node stays a member of the releasing agent (held until its agent is silent
      // past the bound, drain/members.h): judged like any other. One it let go of, or one
      // (created again) its view does not list yet: counted apart.
      // A node the releasing agent's view lists but that is no member (with members from the
      // agents' Service: one it never saw run an agent) ran one all along here: judged.
      if (!nodes_[i].agent.members.count(n.name) && !in_view(n.name)) {
        if (!n.in_api) {
          report_.node_deleted_routes += kernel;
          for (const auto& h : held) report_.node_deleted_routes += h.routes();
        } else {
          ++report_.node_after_view;
        }
        continue;
      }
      judge(n.kernel, kernel, "kernel of " + n.name);
      for (size_t k = 0; k < n.subs.size(); ++k) {
        if (n.subs[k].forgotten && held[k].routes()) {
          ++report_.forgotten_subscriber_routes;
          continue;
        }
        if (held[k].eds_panic) ++report_.eds_panic_assumed_off;
        judge(n.subs[k].acked, held[k].routes(), "subscriber " + n.subs[k].name);
      }
    }
    bool deleted_counted = false;
    for (const auto& c : dns_cache_) {
      if (c.address != ip || c.until <= now_) continue;
      // An answer given by a node whose Node is not in the API (deleted, not created again
      // yet) or that the releasing agent's view does not list: the same as that node's kernel
      // (above) — a Node's deletion ends its membership.
      const NodeRec& by = nodes_[c.node];
      if (!nodes_[i].agent.members.count(by.name) && !in_view(by.name)) {
        if (!by.in_api) {
          if (!deleted_counted) ++report_.node_deleted_routes;
          deleted_counted = true;
        } else {
          ++report_.node_after_view;
        }
        continue;
      }
      what += " a DNS answer of " + by.name + " cached for " +
              fmt_ms(std::chrono::duration_cast<milliseconds>(c.until - now_));
      break;
    }
    if (!what.empty())
      report_.safety.push_back({"released " + pod.name + " " + pod.ip + " as confirmed by " +
                                    nodes_[i].name + " while routed by:" + what,
                                elapsed()});
  }

  // What a node's kernel DNATs to, read by the oracle once per state it holds.
  const std::set<model::IpAddr>& kernel_targets(NodeRec& n) {
    if (n.targets_of != n.kernel) {
      n.targets = oracle_.kernel_targets(*n.kernel, n.name);
      n.targets_of = n.kernel;
    }
    return n.targets;
  }

  PodRec* find_pod(const std::string& name) {
    for (auto& p : pods_)
      if (p.name == name) return &p;
    return nullptr;
  }

  // ---- the network --------------------------------------------------------------------------

  void send(size_t from, Aggregator::Send s) {
    size_t to = index_of(s.to);
    if (to == SIZE_MAX) return;
    if (cut_.count({std::min(from, to), std::max(from, to)})) return;
    const bool faulty = in_fault_phase();
    if (faulty && chance(o_.faults.loss)) return;
    int copies = faulty && chance(o_.faults.duplicate) ? 2 : 1;
    for (int c = 0; c < copies; ++c) {
      milliseconds lat(
          1 + static_cast<int64_t>(
                  rng_() % static_cast<uint64_t>(faulty ? o_.faults.latency_max.count() : 5)));
      TimePoint at = now_ + lat;
      auto& last = link_last_[{from, to}];
      if (!(faulty && o_.faults.reorder)) at = std::max(at, last);
      last = std::max(last, at);
      const uint64_t seq = seq_++;
      net_.emplace(std::make_pair(at, seq), Packet{at, seq, from, to, s.message});
    }
  }

  // Messages due by now, in the order they arrive (time, then sending order).
  void deliver() {
    for (auto it = net_.begin(); it != net_.end() && it->first.first <= now_;) {
      const Packet& p = it->second;
      Agent& a = nodes_[p.to].agent;
      if (!a.alive) {  // the connection is gone with the process
        it = net_.erase(it);
        continue;
      }
      if (a.paused_until > now_) {  // it waits in the socket
        ++it;
        continue;
      }
      a.agg->receive(p.message, now_);
      a.cluster_woken = true;
      it = net_.erase(it);
    }
  }

  size_t index_of(const std::string& name) const {
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].name == name) return i;
    return SIZE_MAX;
  }

  // ---- time and faults ----------------------------------------------------------------------

  // A draw in [0, 1): the value std::uniform_real_distribution<double>(0, 1) gives for the same
  // draw of the engine (libstdc++'s generate_canonical: one 64-bit draw over 2^64, kept below
  // 1), without the long-double logarithms it takes on every call.
  bool chance(double p) {
    if (p <= 0) return false;
    double u = static_cast<double>(rng_()) * 0x1p-64;
    if (u >= 1.0) u = std::nextafter(1.0, 0.0);
    return u < p;
  }
  size_t pick(size_t n) { return static_cast<size_t>(rng_() % n); }
  size_t pick_in_api() {
    std::vector<size_t> in;
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].in_api) in.push_back(i);
    return in.empty() ? 0 : in[pick(in.size())];
  }
  milliseconds upto(milliseconds m) {
    return milliseconds(100 + rng_() % static_cast<uint64_t>(m.count()));
  }
  bool in_fault_phase() const { return faults_on_ && now_ < start_ + o_.fault_phase; }
  milliseconds elapsed() const { return std::chrono::duration_cast<milliseconds>(now_ - start_); }
  void trace(const std::string& s) {
    if (tracing_) report_.log.push_back(fmt_ms(elapsed()) + " " + s);
  }
  double per_tick(double per_s) const {
    return per_s * std::chrono::duration<double>(o_.tick).count();
  }

  void inject() {
    const Faults& f = o_.faults;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      Agent& a = nodes_[i].agent;
      if (a.alive && chance(per_tick(f.kill_per_s))) {
        kill(i);
        a.down_until = now_ + upto(f.down_max);
        ++report_.faults["agent stopped"];
      }
      if (a.alive && a.paused_until <= now_ && chance(per_tick(f.pause_per_s))) {
        a.paused_until = now_ + upto(f.pause_max);
        ++report_.faults["agent paused"];
      }
      if (a.alive && chance(per_tick(f.watch_lag_per_s))) {
        a.lag_until = now_ + upto(f.watch_lag_max);
        ++report_.faults["watch behind"];
      }
      if (a.alive && chance(per_tick(f.program_slow_per_s))) {
        a.slow_until = now_ + 2000ms;
        ++report_.faults["slow programming"];
      }
      for (auto& s : nodes_[i].subs) {
        if (s.gone) continue;
        if (s.wants && chance(per_tick(f.disconnect_per_s))) {
          s.wants = false;
          s.back_at = now_ + upto(f.disconnected_max);
          ++report_.faults["subscriber disconnected"];
        }
        if (!s.nacking && chance(per_tick(f.nack_per_s))) {
          s.nacking = true;
          a.board_dirty = true;  // a holdout's reason
          s.nack_until = now_ + upto(f.nacking_max);
          ++report_.faults["subscriber nacking"];
        }
        if (chance(per_tick(f.gone_per_s))) {
          s.gone = true;
          ++report_.faults["subscriber gone"];
        }
      }
      if (chance(per_tick(f.node_churn_per_s)) && nodes_[i].in_api) {
        nodes_[i].in_api = false;
        churned_[i] = now_ + upto(3000ms);
        publish();
        ++report_.faults["node deleted and created again"];
      }
    }
    if (chance(per_tick(f.ttl_reload_per_s))) {
      set_ttl(milliseconds(1000 + rng_() % 2000));
      ++report_.faults["ttl reload"];
    }
    if (chance(per_tick(f.partition_per_s)) && nodes_.size() > 1) {
      // A random side of the nodes cut from the rest, or a random set of links.
      std::vector<std::pair<size_t, size_t>> links;
      if (pick(2)) {
        std::vector<bool> side(nodes_.size());
        for (size_t k = 0; k < side.size(); ++k) side[k] = pick(2);
        side[pick(side.size())] = true;
        side[pick(side.size())] = false;  // both sides non-empty (unless it drew one node twice)
        for (size_t a = 0; a < nodes_.size(); ++a)
          for (size_t b = a + 1; b < nodes_.size(); ++b)
            if (side[a] != side[b]) links.emplace_back(a, b);
      } else {
        for (size_t a = 0; a < nodes_.size(); ++a)
          for (size_t b = a + 1; b < nodes_.size(); ++b)
            if (pick(10) < 3) links.emplace_back(a, b);
      }
      TimePoint until = now_ + upto(f.partition_max);
      for (const auto& l : links) {
        auto& u = cut_[l];
        if (u < until) u = until;
      }
      if (!links.empty()) ++report_.faults["links cut"];
    }
    if (chance(per_tick(f.fallback_per_s))) {
      std::string svc = pick(2) ? "web" : "db";
      if (!fallback_.count(svc)) {
        fallback_[svc] = now_ + upto(2500ms);
        publish();
        ++report_.faults["fallback"];
      }
    }
    if (chance(per_tick(f.spec_change_per_s)) && !local_until_.count("web")) {
      local_until_["web"] = now_ + upto(f.spec_change_max);
      publish();
      ++report_.faults["service spec changed"];
    }
    // (Loss, duplication, latency and reordering apply to every message of the fault phase.)
  }

  void recover_due() {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      NodeRec& n = nodes_[i];
      if (o_.members_service && n.agents_service_at != TimePoint{} && n.agents_service_at <= now_) {
        n.agents_service_at = TimePoint{};
        if (n.in_agents_service != n.agent.alive) {
          n.in_agents_service = n.agent.alive;
          trace(std::string(n.agent.alive ? "agents' Service lists " : "agents' Service drops ") +
                n.name);
          publish();
        }
      }
      Agent& a = nodes_[i].agent;
      if (!a.alive && a.down_until <= now_ && auto_restart_) restart(i);
      for (auto& s : nodes_[i].subs) {
        if (!s.wants && s.back_at <= now_) s.wants = true;
        if (s.nacking && s.nack_until <= now_) {
          s.nacking = false;
          a.board_dirty = true;
        }
      }
    }
    for (auto it = churned_.begin(); it != churned_.end();) {
      if (it->second <= now_) {
        nodes_[it->first].in_api = true;
        publish();
        it = churned_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto* until : {&fallback_, &local_until_}) {
      for (auto it = until->begin(); it != until->end();) {
        if (it->second <= now_) {
          it = until->erase(it);
          publish();
        } else {
          ++it;
        }
      }
    }
    std::erase_if(cut_, [&](const auto& c) { return c.second <= now_; });
  }

  // The end of the fault phase: everything comes back.
  void heal() {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (!nodes_[i].agent.alive) restart(i);
      nodes_[i].agent.paused_until = now_;
      nodes_[i].agent.lag_until = now_;
      nodes_[i].agent.slow_until = now_;
      for (auto& s : nodes_[i].subs) {
        s.gone = false;
        s.wants = true;
        s.nacking = false;
      }
      nodes_[i].agent.board_dirty = true;
    }
    for (auto& [i, _] : churned_) nodes_[i].in_api = true;
    churned_.clear();
    fallback_.clear();
    local_until_.clear();
    cut_.clear();
    publish();
  }

  void terminate_random(bool liveness) {
    std::vector<size_t> cand;
    for (size_t k = 0; k < pods_.size(); ++k) {
      const PodRec& p = pods_[k];
      if (p.exists && !p.terminating && nodes_[p.node].in_api &&
          (!liveness || (p.service == "web" && !p.silent)))
        cand.push_back(k);
    }
    if (cand.empty()) return;
    size_t k = cand[pick(cand.size())];
    if (liveness) {
      // A rolling update's order (maxSurge): the new pod is ready before the old one
      // terminates. Without it a service can be left with no ready endpoint, its terminating
      // ones then route by the fallback, and no drain of them can be confirmed — rightly, so
      // it would say nothing about the protocol's liveness.
      std::string svc = pods_[k].service;
      add_pod(std::move(svc), pick_in_api());
    }
    terminate_pod(pods_[k], liveness);
  }

  void terminate_pod(PodRec& p, bool liveness) {
    p.terminating = true;
    prestops_pending_ = true;
    p.terminated_at = now_;
    p.liveness = liveness;
    trace("terminate " + p.name + " " + p.ip + " on " + nodes_[p.node].name);
    if (!liveness && in_fault_phase() && router_chance(o_.faults.router_share)) {
      p.router_until = now_ + milliseconds(router_rng_() %
                                           static_cast<uint64_t>(o_.faults.router_max.count() + 1));
      ++report_.faults["unregistered router"];
      trace("an unregistered router sends to " + p.name + " until +" +
            fmt_ms(std::chrono::duration_cast<milliseconds>(p.router_until - now_)));
    }
    publish();
  }

  void tick() {
    if (in_fault_phase()) inject();
    recover_due();
    deliver();
    answer_asks();
    for (size_t i = 0; i < nodes_.size(); ++i) {
      call_prestops(i);
      if (running(i)) step_agent(i);
    }
    // The kubelet's grace period: a pod not released by then is killed.
    std::vector<std::string> replace;
    for (auto& p : pods_) {
      if (p.exists && p.terminating && !p.settled && now_ - p.terminated_at >= 10s) {
        p.settled = true;
        p.exists = false;
        freed_.push_back(p.ip);
        if (p.liveness)
          report_.liveness.push_back(
              {"fault-free drain of " + p.name + " never released", elapsed()});
        replace.push_back(p.service);
      }
    }
    for (auto& svc : replace) {
      add_pod(std::move(svc), pick_in_api(), true);
      publish();
    }
    std::erase_if(dns_cache_, [&](const auto& e) { return e.until <= now_; });
    // Pods gone are looked up by name only (settle_waiters), and find none: keeping them made
    // every tick of a long horizon walk every pod it ever had.
    std::erase_if(pods_, [](const PodRec& p) { return !p.exists; });
    prestops_pending_ = std::any_of(pods_.begin(), pods_.end(),
                                    [](const PodRec& p) { return p.terminating && !p.settled; });
    now_ += o_.tick;
  }

  void advance(milliseconds d) {
    TimePoint end = now_ + d;
    while (now_ < end) tick();
  }

  Report run_all(bool trace_on) {
    tracing_ = trace_on;
    faults_on_ = true;
    auto_restart_ = true;
    start_ = now_;
    report_.long_horizon = o_.fault_phase >= std::chrono::minutes(10);
    if (o_.members_service) ++report_.faults["seeds with members from the agents' Service"];
    milliseconds next_term = o_.terminate_every;
    while (now_ < start_ + o_.fault_phase) {
      if (elapsed() >= next_term) {
        terminate_random(false);
        next_term += o_.terminate_every;
      }
      tick();
    }
    heal();
    // Drains still under way from the fault phase finish first (their budgets).
    advance(o_.settle);
    for (size_t k = 0; k < o_.liveness_drains; ++k) {
      terminate_random(true);
      advance(o_.liveness + 1500ms);
    }
    if (tracing_) {
      for (const auto& n : nodes_) {
        const Aggregator& g = *n.agent.agg;
        std::string ex;
        for (const auto& e : g.excluded()) ex += " " + e;
        std::string sus;
        for (const auto& [e, _] : g.suspects()) sus += " " + e;
        const std::string* parent = g.tree().parent(n.name);
        trace("agent " + n.name + ": view " +
              std::to_string(n.agent.snap ? n.agent.snap->generation : 0) + " proxy " +
              std::to_string(n.agent.proxy ? n.agent.proxy->generation : 0) + " cluster " +
              std::to_string(g.cluster_watermark()) + " root " + g.tree().root() + " parent " +
              (parent ? *parent : "-") + " coverage_current " +
              (g.coverage_current() ? "yes" : "no") + " excluded" + ex + " suspects" + sus +
              " mismatches " + std::to_string(g.stats().coverage_mismatches) + " epoch " +
              std::to_string(g.epoch() >> 16) + ":" + std::to_string(g.epoch() & 0xffff));
      }
    }
    return report_;
  }

  // ---- scripted faults ----------------------------------------------------------------------

  void kill(size_t i) {
    Agent& a = nodes_[i].agent;
    a.alive = false;
    a.waiters.clear();  // the prestop calls' connections broke: the kubelet calls again
    for (auto& [name, e] : a.hub)
      if (e.connected) {
        e.connected = false;
        e.disconnected_at = now_;
      }
    a.board_dirty = true;
    trace("kill agent " + nodes_[i].name);
    // A crash restarts the container in its pod, whose endpoint stays in the agents' Service
    // (not ready: the EndpointSlice controller lists a pod until it is deleted). In a fifth of
    // the stops the pod itself is replaced (a DaemonSet rollout, an eviction): its endpoint
    // goes a while later and comes back with the new pod.
    if (chance(kPodReplacedShare)) {
      nodes_[i].agents_service_at = now_ + upto(2000ms);
      trace("pod of agent " + nodes_[i].name + " replaced");
    }
  }
  void restart(size_t i) {
    start_agent(i);
    trace("restart agent " + nodes_[i].name);
    nodes_[i].agents_service_at = now_ + upto(1000ms);
  }
  void set_ttl(milliseconds ttl) {
    ttl_ = ttl;
    max_ttl_ = std::max(max_ttl_, ttl);  // the DNS sink keeps the larger (dns/sink.cc)
    for (auto& n : nodes_) n.agent.board_dirty = true;
  }

  Options o_;
  std::mt19937_64 rng_;
  std::mt19937_64 router_rng_;
  Report report_;
  std::vector<NodeRec> nodes_;
  std::vector<PodRec> pods_;
  size_t next_pod_ = 0;
  uint64_t rev_ = 100;
  std::deque<std::pair<TimePoint, model::SnapshotPtr>> history_;
  std::map<std::string, TimePoint> fallback_;
  std::map<std::string, TimePoint> local_until_;  // services whose spec says Local until then
  uint64_t slice_rev_ = 0;
  std::map<size_t, TimePoint> churned_;
  // DNS answers in clients' caches: the address, until when, and the node whose DNS gave it.
  struct CachedAnswer {
    model::IpAddr address;
    TimePoint until;
    size_t node = 0;
  };
  std::vector<CachedAnswer> dns_cache_;
  std::vector<std::pair<model::IpAddr, TimePoint>> answers_scratch_;  // publish_answers'
  milliseconds ttl_{0}, max_ttl_{0};
  std::map<std::pair<TimePoint, uint64_t>, Packet> net_;  // by arrival, then sending order
  struct Ask {
    size_t from, to;
    uint64_t incarnation;
    model::IpAddr ip;
    TimePoint deadline;
    uint64_t revision;  // the removal's, sent with the question
  };
  std::vector<Ask> asks_;
  uint64_t incarnations_ = 0;
  std::map<std::pair<size_t, size_t>, TimePoint> link_last_;
  std::map<std::pair<size_t, size_t>, TimePoint> cut_;  // links cut until then
  std::vector<std::string> freed_;                      // addresses of pods gone, for reuse
  Oracle oracle_;
  uint64_t seq_ = 0;
  TimePoint now_ = TimePoint{} + 1h;
  TimePoint start_ = TimePoint{} + 1h;
  bool faults_on_ = false, auto_restart_ = false, tracing_ = false;
  bool prestops_pending_ = false;  // a terminating pod not settled (the kubelet calls prestop)
  std::map<std::string, std::string> outcomes_;
  std::map<std::string, milliseconds> released_after_;
  std::map<std::string, std::vector<std::string>> unconfirmed_;
  friend class Scenario;
};

// The share of seeds with a long horizon (options_for_seed).
constexpr double kLongShare = 0.02;

Options options_for_seed(uint64_t seed) {
  std::mt19937_64 r(seed * 0x9e3779b97f4a7c15ULL + 1);
  auto u = [&] { return std::uniform_real_distribution<double>(0, 1)(r); };
  Options o;
  o.nodes = 2 + r() % 4;
  o.subscribers_per_node = r() % 3;
  o.dns = u() < 0.7;
  o.policy = u() < 0.5 ? PeerPolicy::kProceed : PeerPolicy::kWait;
  o.aggregator.fan_in = 2;
  o.aggregator.silence = 1500ms;
  o.aggregator.heartbeat = 500ms;
  o.aggregator.probe = 300ms;
  Faults& f = o.faults;
  // Each kind of fault is on in about half of the seeds, at a rate that makes it happen a few
  // times in the fault phase.
  auto maybe = [&](double rate) { return u() < 0.5 ? rate * (0.5 + u()) : 0.0; };
  f.kill_per_s = maybe(0.04);
  f.pause_per_s = maybe(0.05);
  f.loss = maybe(0.05);
  f.duplicate = maybe(0.05);
  f.latency_max = milliseconds(5 + r() % 200);
  f.reorder = u() < 0.3;
  f.disconnect_per_s = maybe(0.05);
  f.nack_per_s = maybe(0.03);
  f.gone_per_s = maybe(0.01);
  f.ttl_reload_per_s = o.dns ? maybe(0.1) : 0;
  f.node_churn_per_s = maybe(0.01);
  f.watch_lag_per_s = maybe(0.05);
  f.program_slow_per_s = maybe(0.05);
  f.fallback_per_s = maybe(0.08);
  // Drawn after the others, so a seed's earlier choices stay what they were.
  f.partition_per_s = maybe(0.04);
  o.ip_reuse = u() < 0.5 ? 0.2 + 0.6 * u() : 0.0;
  f.spec_change_per_s = maybe(0.04);
  o.members_service = u() < 0.5;
  // A long horizon in a few seeds: 15 minutes of faults at a fifth of the rates, pods
  // terminating less often, so that rules counted in minutes act.
  if (u() < kLongShare) {
    o.fault_phase = std::chrono::minutes(15);
    o.terminate_every = 4000ms;
    for (double* rate :
         {&f.kill_per_s, &f.pause_per_s, &f.disconnect_per_s, &f.nack_per_s, &f.gone_per_s,
          &f.ttl_reload_per_s, &f.node_churn_per_s, &f.watch_lag_per_s, &f.program_slow_per_s,
          &f.fallback_per_s, &f.partition_per_s, &f.spec_change_per_s})
      *rate /= 5;
  }
  // Drawn last: unregistered routers in half the seeds, at up to a third of the terminations;
  // silent pods in half, up to half of the pods.
  f.router_share = u() < 0.5 ? 0.05 + 0.3 * u() : 0.0;
  o.silent_share = u() < 0.5 ? 0.5 * u() : 0.0;
  return o;
}

Report run(uint64_t seed, const Options& opts, bool trace) {
  World w(opts, seed);
  return w.run_all(trace);
}

Report run(uint64_t seed) {
  return run(seed, options_for_seed(seed));
}

// ---- scenarios ------------------------------------------------------------------------------

Scenario::Scenario(Options opts, uint64_t seed)
    : world_(std::make_unique<World>(std::move(opts), seed)) {
  world_->faults_on_ = false;
  world_->tracing_ = true;
  world_->start_ = world_->now_;
}
Scenario::~Scenario() = default;

void Scenario::advance(milliseconds d) {
  world_->advance(d);
}
std::string Scenario::terminate(const std::string& service, size_t node) {
  for (auto& p : world_->pods_) {
    if (p.exists && !p.terminating && p.service == service && p.node == node) {
      world_->terminate_pod(p, false);
      return p.ip;
    }
  }
  // None there yet: one is made and started first.
  world_->add_pod(service, node);
  world_->publish();
  world_->advance(500ms);
  PodRec& p = world_->pods_.back();
  world_->terminate_pod(p, false);
  return p.ip;
}
void Scenario::kill(size_t node) {
  world_->kill(node);
}
void Scenario::router(const std::string& ip, milliseconds d) {
  for (auto& p : world_->pods_)
    if (p.exists && p.ip == ip) p.router_until = world_->now_ + d;
}
void Scenario::restart(size_t node) {
  world_->restart(node);
}
void Scenario::disconnect(size_t node, size_t sub) {
  world_->nodes_[node].subs[sub].wants = false;
  world_->nodes_[node].subs[sub].back_at = TimePoint::max();
}
void Scenario::reconnect(size_t node, size_t sub) {
  world_->nodes_[node].subs[sub].wants = true;
}
void Scenario::nack(size_t node, size_t sub, bool on) {
  world_->nodes_[node].subs[sub].nacking = on;
  world_->nodes_[node].agent.board_dirty = true;
  world_->nodes_[node].subs[sub].nack_until = TimePoint::max();
}
void Scenario::set_ttl(milliseconds ttl) {
  world_->set_ttl(ttl);
}
void Scenario::query_dns(size_t node) {
  world_->answer_dns(node);
}
void Scenario::remove_node(size_t node) {
  world_->nodes_[node].in_api = false;
  world_->publish();
}
void Scenario::add_node(size_t node) {
  world_->nodes_[node].in_api = true;
  world_->publish();
}
void Scenario::fallback(const std::string& service, bool on) {
  if (on)
    world_->fallback_[service] = TimePoint::max();
  else
    world_->fallback_.erase(service);
  world_->publish();
}
void Scenario::partition(size_t a, size_t b, bool on) {
  auto k = std::make_pair(std::min(a, b), std::max(a, b));
  if (on)
    world_->cut_[k] = TimePoint::max();
  else
    world_->cut_.erase(k);
}
size_t Scenario::root() const {
  return world_->index_of(world_->nodes_[0].agent.agg->tree().root());
}
std::string Scenario::outcome(const std::string& ip) const {
  auto it = world_->outcomes_.find(ip);
  return it == world_->outcomes_.end() ? std::string() : it->second;
}
std::vector<std::string> Scenario::unconfirmed(const std::string& ip) const {
  auto it = world_->unconfirmed_.find(ip);
  return it == world_->unconfirmed_.end() ? std::vector<std::string>{} : it->second;
}
milliseconds Scenario::released_after(const std::string& ip) const {
  auto it = world_->released_after_.find(ip);
  return it == world_->released_after_.end() ? milliseconds(-1) : it->second;
}
const Report& Scenario::report() const {
  return world_->report_;
}

}  // namespace endpointd::drain::sim
