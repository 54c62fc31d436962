// The drain state machine: per terminating endpoint of this node, stop-accepting → removed →
// drained → released, with a timestamp for each stage. Pure: time, acknowledgements, peer
// answers and conntrack counts come in as values, so it is tested without threads or root.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "drain/aggregate.h"
#include "drain/flows.h"
#include "drain/members.h"
#include "model/result.h"
#include "model/snapshot.h"
#include "pipeline/ack_board.h"

namespace endpointd::drain {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using std::chrono::milliseconds;

// The pod annotation that chooses when the prestop call returns: "removed" (the application
// drains its own connections after SIGTERM) or "drained" (after conntrack shows no live flow).
inline constexpr const char* kReleaseAfterAnnotation = "endpointd.io/release-after";

enum class Stage { kWaitingTerminating, kStopAccepting, kRemoved, kDrained, kReleased };
std::string_view to_string(Stage s);
enum class ReleaseAfter { kRemoved, kDrained, kSilent };
// What a peer that did not confirm by its deadline means: proceed (and count it), or keep
// waiting until the removal deadline of the grace budget.
enum class PeerPolicy { kProceed, kWait };

struct Options {
  std::string node_name;
  // The application's own shutdown after release: max(min_margin, grace × margin_fraction)
  // is kept out of the budget.
  milliseconds min_margin{2000};
  double margin_fraction = 0.2;
  // Stage 2's own bound inside the budget (0: the whole budget).
  milliseconds removal_timeout{0};
  milliseconds peer_timeout{5000};
  PeerPolicy peer_policy = PeerPolicy::kProceed;
  // How long a prestop call waits for the API to show its pod terminating.
  milliseconds terminating_wait{10000};
  // With conntrack unavailable, stage 3 waits this long (within the budget) and proceeds.
  milliseconds conntrack_unavailable_wait{2000};
  // Without a drain action the application's only cue to drain is SIGTERM, which the kubelet
  // sends when the prestop returns: waiting for its keep-alive connections first would wait
  // out the budget. So the default releases after removal; a drain action (the client's flag
  // or the pod's endpointd.io/drain-action) releases after the drain that action starts.
  ReleaseAfter default_release_after = ReleaseAfter::kRemoved;
  // kSilent: released once no new connection has reached the pod for this long after its
  // removal was confirmed (observed on this node, drain/late.h), or at its budget's end.
  milliseconds quiet{1000};
  size_t history = 64;  // finished drains kept for /debug/state
  // The API's clock: a pod's deletionTimestamp is when its grace period runs out (the API
  // server sets it to the deletion's time plus the grace period), whichever agent sees it and
  // whenever (a restarted agent too). The budget ends a margin before it, clamped: never past
  // the grace period from now (a timestamp further ahead is a skewed clock), and never less
  // than api_floor (one already past: an agent restarted late, or a clock ahead).
  std::function<std::chrono::system_clock::time_point()> wall_clock = [] {
    return std::chrono::system_clock::now();
  };
  milliseconds api_floor{1000};
  // The peers a drain waits for (drain/members.h): every Node; with this Service, its agents
  // are reached at their endpoints' addresses.
  std::optional<model::ServiceKey> members_service;
};

struct PeerState {
  enum class State { kPending, kConfirmed, kFailed };
  State state = State::kPending;
  std::string address;  // "ip:port"
  std::string last_error;
  std::optional<TimePoint> answered;
};

// One thing that may still route to a released endpoint: the release is then "unconfirmed"
// and says who and why (DESIGN.md, "What confirmed means").
struct Unconfirmed {
  std::string node;      // the node whose kernel, DNS or client may still route
  std::string consumer;  // "agent" (the node's agent did not confirm), "proxy", "dns",
                         // "feed", or "feed/<subscriber>" for a holdout
  std::string reason;
  bool operator==(const Unconfirmed&) const = default;
};

// A drain is for one pod: its address and its UID (DESIGN.md, "A drain is for one pod"). A
// reused address (a new pod given a released pod's IP) or a shared one (hostNetwork pods share
// their node's address) is another drain, never answered by this one. The UID is the
// endpoint's targetRef.uid (else the pod of this node at the address; empty when neither says).
struct DrainKey {
  model::IpAddr ip;
  std::string uid;
  friend auto operator<=>(const DrainKey&, const DrainKey&) = default;
  friend bool operator==(const DrainKey&, const DrainKey&) = default;
};

struct Drain {
  model::IpAddr ip;
  std::string fallback_client;  // LocalMarks::fallback_client(ip), made once when first needed
  model::ObjectKey pod;         // empty when no pod on this node has the address
  std::string pod_uid;
  // The address is shared: the pod is hostNetwork (its node's address, and every other
  // hostNetwork pod's there). Removed then means: no consumer routes to the address in a
  // service where the endpoint names this pod (README, "Who confirms a removal").
  bool shared_address = false;
  DrainKey key() const { return {ip, pod_uid}; }
  ReleaseAfter release_after = ReleaseAfter::kDrained;
  Stage stage = Stage::kWaitingTerminating;
  TimePoint start{};  // when this agent first knew the endpoint was going away
  // The EndpointSlice position of the snapshot that showed the endpoint going away: the
  // cluster watermark confirms every peer once it reaches it (0: unknown, ask each peer).
  uint64_t revision = 0;
  // The watermark that confirms the peers: the removal's revision, or the newest update of the
  // endpoint's service this agent saw while the endpoint was out and not yet released (states
  // between two of its snapshots may have routed to it by the fallback; see on_snapshot).
  uint64_t confirm_revision = 0;
  uint64_t confirm_at() const { return std::max(revision, confirm_revision); }
  // The generation of that snapshot: a consumer counts as removed only once it applied it or
  // a newer one (an older state may not route to it only because the pod was not there yet,
  // while a client already holds a newer one that does).
  uint64_t generation = 0;
  TimePoint removal_deadline{};
  TimePoint budget_end{};
  bool budget_from_api = false;  // budget_end from the pod's deletionTimestamp
  std::optional<TimePoint> stop_accepting, removed, drained, released;
  std::map<std::string, TimePoint> consumers_confirmed;
  std::map<std::string, PeerState> peers;  // by node name
  std::optional<FlowCount> flows;
  std::optional<TimePoint> conntrack_failed_since;
  // The newest new connection after the removal was confirmed (Inputs::late): under kSilent
  // the release waits for `quiet` after it.
  std::optional<TimePoint> late_last;
  std::vector<std::string> notes;  // every forced step and degraded input, in order
  bool removal_forced = false, drain_forced = false;
  std::optional<TimePoint> last_confirmation;  // the newest confirmation stage 2/3 waited for
  std::optional<TimePoint> prestop_called;     // when the pod's prestop call arrived
  std::string action;                          // the drain action (spec), empty: none
  std::optional<TimePoint> action_started, action_done;
  // DNS could have handed the address out (it was in a headless service's answers): its
  // removal also waits for the DNS watermark. Otherwise no DNS answer ever carried it.
  bool needs_dns = false;
  // Everything that may still route to it; empty at release: the release is "confirmed".
  std::vector<Unconfirmed> unconfirmed;
  // Other nodes' holdouts older than the removal in the cluster facts that confirmed a peer:
  // they count at the release even when later facts no longer list them (a parent with older
  // news can send an older watermark and list, while the peers stay confirmed). Bounded.
  std::vector<Holdout> confirmed_with;
  // The endpoint became routable again after stop-accepting (kube-proxy's terminating fallback:
  // every other endpoint of a service unready): `revision` moves to the update that took it
  // out again, and the release waits for the removal to be confirmed anew.
  bool reconfirm = false;
  bool routed = false;  // routable somewhere in the newest snapshot
  // A Service-only change (a port, a traffic policy) touched its service while it was out: the
  // cluster watermark counts EndpointSlice events, so it cannot say every node applied that
  // change. From then on each peer is asked directly (AwaitRemoval: "does your state route to
  // it?") instead of confirmed by the watermark.
  bool ask_peers = false;
  // When the peers' confirmations last started over: the drain's start, or the update that
  // took the endpoint out again (after the fallback) or changed its service while it was out
  // and not yet released. Under proceed, peers have peer_timeout from here.
  TimePoint peers_since{};
  TimePoint peer_deadline{};
  // Since when the local DNS consumer's state has not answered it (needs_dns only).
  std::optional<TimePoint>
      dns_out_since;  // under proceed: the peer timeout, plus the DNS TTL if needs_dns
  std::string outcome() const { return unconfirmed.empty() ? "confirmed" : "unconfirmed"; }
};

// What a prestop call is told.
struct Verdict {
  bool release = false;  // true: exit 0
  std::string reason;
};

struct Counters {
  uint64_t removal_deadlines = 0;
  uint64_t drain_deadlines = 0;
  uint64_t peers_unconfirmed = 0;
  uint64_t conntrack_unavailable = 0;
  uint64_t no_endpoints = 0;
  uint64_t never_terminating = 0;
  // deletionTimestamps clamped: further ahead than the grace period, or already past.
  uint64_t deletion_clamped = 0;
  uint64_t not_terminating_in_api = 0;
  uint64_t released = 0;
  uint64_t released_confirmed = 0, released_unconfirmed = 0;  // drains, by outcome
  uint64_t routed_again = 0;     // endpoints routable again after stop-accepting
  uint64_t action_failures = 0;  // drain actions that failed, hung or could not run
  uint64_t bad_actions = 0;      // drain actions that do not parse (flag or annotation)
  // Terminating endpoints of this node whose targetRef names no pod UID (bad input: the drain
  // falls back to the pod of this node at the address).
  uint64_t no_pod_uid = 0;
  // An address claimed by two pods at once, neither hostNetwork (bad input: each drain is
  // released unconfirmed, naming the other pod).
  uint64_t address_conflicts = 0;
  // A new pod at the address of a drain of another pod (pod IP reuse): a new drain.
  uint64_t address_reused = 0;
};

struct Transition {
  model::IpAddr ip;
  std::string uid;  // the drain's pod UID (DrainKey)
  Stage to;
  TimePoint at;
  std::chrono::nanoseconds stage_duration{};  // time spent in the stage just left
};

class Machine {
 public:
  explicit Machine(Options opts);

  const Options& options() const { return opts_; }

  // A new snapshot: starts drains for this node's terminating endpoints (stop-accepting) and
  // notices endpoints that left every service. Returns the drains that need peer calls (the
  // peers are listed in their `peers`).
  std::vector<DrainKey> on_snapshot(model::SnapshotPtr snap, TimePoint now);
  // The members as the coordinator keeps them (drain/members.h); unset: members_of(snapshot).
  // A member new to a drain under way (it joined, or a restart's deleted Node is held) is
  // added to its peers.
  void set_members(Members m);

  void peer_answered(const model::IpAddr& ip, const std::string& node, bool confirmed,
                     const std::string& error, TimePoint now);

  // Registers a prestop call for a pod (identified by the server) and returns its id.
  // `action`: the client's --drain-action (empty: the pod's annotation, if any).
  uint64_t add_waiter(const model::ObjectKey& pod, const std::string& uid, TimePoint now,
                      std::string action = {});
  void remove_waiter(uint64_t id);
  std::optional<Verdict> verdict(uint64_t id) const;
  // The drain action the waiter's client should run now (every endpoint of the pod removed
  // everywhere), marked as started; at most once per call. `deadline`: when the drain budget
  // ends, which bounds the action.
  std::optional<std::string> take_due_action(uint64_t id, TimePoint now, TimePoint* deadline);
  // What running it gave: on an error the pod releases after removal (SIGTERM is then the
  // application's drain), with the error in the verdict and the drain's notes.
  void action_finished(uint64_t id, const Result<std::string>& outcome, TimePoint now);

  // Addresses whose live flows stage 3 needs now.
  std::vector<model::IpAddr> need_flow_counts() const;

  struct Inputs {
    TimePoint now;
    std::vector<pipeline::AckBoard::Entry> consumers;
    // Results for the addresses of need_flow_counts().
    std::map<model::IpAddr, Result<FlowCount>> flows;
    // The cluster watermark as this agent knows it (null: none; drains ask peers one by one).
    const ClusterFacts* cluster = nullptr;
    // Terminating endpoints some state this node's consumers may hold (from the oldest applied
    // on) routes to by the fallback (LocalMarks): not removed here while they do.
    std::set<model::IpAddr> local_fallback;
    // Drains that new connections reached after their removal was confirmed (drain/late.h):
    // who sent them, and when the newest arrived. Such a release is unconfirmed ("late
    // traffic"); under kSilent the release also waits for them to stop.
    struct Late {
      std::string senders;
      TimePoint last{};
    };
    std::map<DrainKey, Late> late;
  };
  // Advances every drain and waiter as far as the inputs allow. Returns the transitions.
  std::vector<Transition> evaluate(const Inputs& in);
  // The earliest deadline that would change something without any new input (a DNS answer's
  // expiry that the last evaluation waited for included).
  std::optional<TimePoint> next_deadline() const;

  const std::map<DrainKey, Drain>& drains() const { return drains_; }
  // The drain at `ip` of the newest pod there (a pod whose address was reused has a drain of
  // its own; this is the one of the pod the address belongs to now). Throws when there is none.
  const Drain& drain(const model::IpAddr& ip) const;
  const std::vector<Drain>& finished() const { return finished_; }
  const Counters& counters() const { return counters_; }
  model::SnapshotPtr snapshot() const { return snap_; }

 private:
  struct Waiter {
    model::ObjectKey pod;
    std::string uid;
    TimePoint called;
    std::optional<Verdict> verdict;
    std::string client_action;
    bool action_resolved = false;
    std::string action;       // valid spec to run, empty: none
    std::string action_note;  // why there is none (a bad spec), or what running it gave
    enum class ActionState { kNone, kDue, kRunning, kDone } action_state = ActionState::kNone;
    bool action_failed = false;
    bool terminating_seen = false;  // the API showed its pod terminating
  };
  const model::Pod* pod_for(const model::IpAddr& ip) const;
  // The pod of this node with `uid` (empty: the pod at the address).
  const model::Pod* pod_of(const DrainKey& k) const;
  // The UID of the pod an endpoint of this node names (its targetRef), else the pod's of this
  // node at the address.
  std::string uid_of(const model::MergedEndpoint& e) const;
  Drain& ensure(const DrainKey& k, TimePoint now, bool* created);
  // Whether an endpoint of `d`'s pod is in a service of snap_.
  bool present(const Drain& d) const;
  void set_budget(Drain& d, TimePoint now);
  std::vector<model::IpAddr> pod_endpoints(const model::Pod& pod) const;
  bool local_removed(Drain& d, const Inputs& in);
  bool peers_done(Drain& d, const Inputs& in);
  // Peers the cluster watermark now confirms (or, for those it does not count, why not).
  void judge_peers(Drain& d, const Inputs& in);
  // Removal settled (confirmed or forced): what may still route is written down.
  void settle_removal(Drain& d, const Inputs& in);
  void unconfirm(Drain& d, Unconfirmed u);
  // Under kSilent: when the quiet time after the removal (or the newest late connection) ends.
  TimePoint quiet_end(const Drain& d) const;
  // Whether any node may still pick `ip` for new connections in snap_ (the feed's rule, the
  // widest, and this node's own dataplane scopes).
  bool routed_anywhere(const Drain& d) const;
  void advance(Drain& d, const Inputs& in, std::vector<Transition>& out);
  void move(Drain& d, Stage to, TimePoint at, std::vector<Transition>& out);
  void settle_waiter(Waiter& w, const Inputs& in, std::vector<Transition>& out);

  // terminating_ and nodeless_ for the service `key` of snap_.
  void index_service(const model::ServiceKey& key);

  Members current_members() const;
  // Adds the current members a drain in stop-accepting (or reconfirming) does not wait for yet.
  void add_joined_members();
  Options opts_;
  std::optional<Members> members_;
  model::SnapshotPtr snap_;
  // Per service of snap_: its terminating endpoints on this node, kept from each snapshot's
  // difference from the last (a change costs what it changed, not the cluster's size), and the
  // services with an endpoint without a nodeName (whose locality follows this node's pods).
  std::map<model::ServiceKey, std::vector<DrainKey>> terminating_;
  std::set<model::ServiceKey> nodeless_;
  // Addresses that left a headless service's endpoints, and when: a new pod given such an
  // address within a DNS TTL (pod IP reuse) may still receive traffic from a DNS answer that
  // carried the old pod's, so its drain waits for the DNS watermark too.
  std::map<model::IpAddr, TimePoint> left_dns_;
  // The DNS consumer's TTL as the board last said (unset: no DNS consumer seen; an hour, the
  // longest TTL, is assumed then).
  std::optional<milliseconds> dns_ttl_;
  bool recently_in_dns(const model::IpAddr& ip, TimePoint now) const;
  std::map<DrainKey, Drain> drains_;
  std::vector<Drain> finished_;
  std::map<uint64_t, Waiter> waiters_;
  uint64_t next_waiter_ = 1;
  Counters counters_;
  // When the last evaluation's answer changes by time alone: a DNS answer it counted as
  // routing expires, or the hold after a DNS consumer first saw the address out ends.
  std::optional<TimePoint> recheck_at_;
  void recheck_at(TimePoint t) {
    if (!recheck_at_ || t < *recheck_at_) recheck_at_ = t;
  }
};

// The release rule of a pod from its annotation (unknown values: `fallback`).
ReleaseAfter release_after_of(const model::Pod& pod, ReleaseAfter fallback);

}  // namespace endpointd::drain
