// One agent's part of the cluster watermark, pure (time and messages come in as values, so a
// whole cluster of them is simulated in one test without threads or sockets).
//
// Up: every agent sends its parent the minimum watermark over its subtree, with the subtree's
// coverage, when that changes (coalesced into the next poll) and at least every heartbeat.
// Down: every agent with children sends them the cluster watermark and the excluded list as it
// knows them, on change and at least every heartbeat, so a live parent is never silent.
// The root publishes a minimum only when the coverage it received is exactly the tree's: an
// agent nobody counted (a stale layout, a report lost on the way) blocks the watermark rather
// than letting it pass. A report that is stale can only be lower than the truth (watermarks only
// grow), so staleness delays confirmation and never hastens it.
//
// Liveness: silence is only what this agent saw itself: a child whose reports stopped for
// `silence`, or a parent (or a probed new parent) that sent nothing for `silence`. A child that
// gets this agent's down reports and answers (an up report, or "not your child" while layouts
// differ), so one that answers nothing for `silence` is silent too. A silent agent is reported up;
// the root excludes it and sends the exclusion down; every agent lays the tree out again without
// it, so its children reattach elsewhere and only the silent agent is left out. A child whose
// parent is silent suspects it at once (and reports it up), so the children of a dead interior
// agent do not wait for the root's word that they cannot receive. A suspect is asked again every
// heartbeat (a probe it answers with a down report): one that was only slow (a paused process, a
// saturated machine) is heard from, suspected no more and never reported, instead of being
// reported after `silence` because, no longer a parent, it had no reason to speak. Besides the
// tree, every agent asks the next member in the layout's order (a ring) every heartbeat and
// reports it silent after `silence` without an answer: an agent whose tree neighbours are all
// stopped too (a stopped root with stopped children, a stopped leaf under a stopped parent) is
// still seen by someone from the start, instead of only after its neighbours are excluded and
// the layout moves it under a running parent, one deadline per round. An excluded
// agent that is heard from again is reported as returning, and the root takes it back. Members come
// from the Node list (Ready, not being deleted); a node that joins mid-drain enters with watermark
// 0 and holds the watermark until its consumers applied a state (its kernel may hold rules from
// before).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "drain/watermark.h"

namespace endpointd::drain {

// A client of some node's consumer that stopped holding that node's watermark back (a feed
// subscriber disconnected or silent past its grace) while its last accepted state was at
// `revision`: a drain whose update is newer cannot be confirmed while it may still route.
struct Holdout {
  std::string node;
  std::string client;  // "feed/<subscriber>"
  uint64_t revision = 0;
  std::string reason;
  bool operator==(const Holdout&) const = default;
};
// At most this many holdouts travel in a report (the oldest revisions first: they matter to
// the most drains); more are summed into one entry with client "+N more".
inline constexpr size_t kMaxHoldouts = 64;

// A report's holdouts: sorted by (revision, node, client), one per (node, client), at most
// kMaxHoldouts with what is cut counted in a last "+N more" entry at the lowest cut revision.
// Immutable and shared: reports, their copies and the facts drains read pass one list around
// instead of copying its strings at every hop and every evaluation.
class HoldoutList {
 public:
  HoldoutList() = default;
  // Any list (from the board, from the wire): put in the order and bound above.
  static HoldoutList of(std::vector<Holdout> raw);
  // The lists together, in the same order and bound. A list merged with empty ones is
  // returned as it is, shared.
  static HoldoutList merge(const std::vector<const HoldoutList*>& lists);

  bool empty() const { return !list_ || list_->empty(); }
  size_t size() const { return list_ ? list_->size() : 0; }
  std::vector<Holdout>::const_iterator begin() const { return items().begin(); }
  std::vector<Holdout>::const_iterator end() const { return items().end(); }
  const Holdout& operator[](size_t i) const { return items()[i]; }
  const std::vector<Holdout>& items() const;
  bool operator==(const HoldoutList& o) const { return list_ == o.list_ || items() == o.items(); }
  // The very same list (not only an equal one).
  bool is(const HoldoutList& o) const { return list_ == o.list_; }

 private:
  explicit HoldoutList(std::shared_ptr<const std::vector<Holdout>> l) : list_(std::move(l)) {}
  std::shared_ptr<const std::vector<Holdout>> list_;
};

struct UpReport {
  std::string from;
  uint64_t watermark = 0;  // minimum over `covered`; 0: some covered agent has applied nothing
  // The DNS watermark: every DNS answer any covered agent gave from a state older than it has
  // expired from clients' caches (an agent without DNS reports its `watermark`). Never above
  // `watermark`.
  uint64_t dns_watermark = 0;
  HoldoutList holdouts;
  Coverage covered;
  std::vector<std::string> silent;     // agents below `from` that missed their deadline
  std::vector<std::string> returning;  // excluded agents heard from again
  bool leaving = false;  // `from` reports to another parent from now on: forget it, it is alive
  // `from` suspects this agent (a parent that did not answer it in time) and asks whether it
  // is there: answered with a down report, counted nowhere.
  bool probe = false;
  // The sender's exclusion decision (see DownReport::epoch). The list goes with it when the
  // sender leaves, or holds a newer decision than its parent sent it, so that an agent that
  // was excluded while it was not running (and may believe it is the root) learns it, and so
  // that the newest decision reaches every agent over whatever link there is.
  uint64_t epoch = 0;
  std::vector<std::string> excluded;
  // `excluded` is the sender's decision at `epoch` (possibly empty), not an omitted list: an
  // empty decision newer than a restarted root's must reach it too.
  bool decision = false;
};

struct DownReport {
  std::string from;
  uint64_t watermark = 0;  // the cluster watermark, as the root last published it
  std::vector<std::string> excluded;
  // Which decision `excluded` is: a root numbers each change past every number it has seen
  // (high bits) and adds its own hash (low 16 bits) to break ties. Every agent takes the
  // newest decision it hears of from its parent, its children, or an agent it asked (a probe's
  // answer): two roots that excluded each other while they could not talk (a mass stop, a
  // partition) converge on one list, so on one tree. A number past kMaxEpochCounter, or more
  // than kMaxEpochStep past the receiver's own, is refused (a new process takes any under the
  // cap); from anyone but the receiver's parent, one more than kMaxEpochStep past the number it
  // held at the start of the current `silence` window too, and a decision that excludes the
  // receiver or one of its ancestors (taken from two members offering the same one, or from an
  // agent a new process asked). An agent whose parent has not taken its newer decision for a
  // `silence` window takes the parent's. Another member's unasked down report is never taken,
  // watermark nor decision. Two lists
  // under one number (a root that restarted at 0 and decided again before it heard its old
  // number) are ordered by the list's digest, so they converge too.
  uint64_t epoch = 0;
  // Whom `watermark` covers: the agents the root's minimum counted (its members less the
  // excluded). An agent counts the watermark for a node only when this is exactly its own
  // members less its excluded: a watermark made before a membership change covers nobody new.
  Coverage covered;
  uint64_t dns_watermark = 0;  // the DNS watermark over the same agents
  HoldoutList holdouts;        // every covered agent's holdouts
  // The sender's own watermarks (its consumers' alone): what the root checks a sampled
  // agent's answer against.
  uint64_t own = 0;
  uint64_t own_dns = 0;
};

using Message = std::variant<UpReport, DownReport>;

// What drains read of the cluster watermark, as one agent knows it: a copy, so the drain
// machine never reaches into the aggregator (or its thread).
struct ClusterFacts {
  uint64_t routing = 0;           // every counted node's consumers applied every event up to it
  uint64_t dns = 0;               // and every DNS answer they gave from an older state expired
  bool coverage_current = false;  // the published minimum covers exactly members − excluded
  std::shared_ptr<const std::set<std::string>> members;  // null: none known yet
  std::set<std::string> excluded;
  HoldoutList holdouts;
  // Why the watermark does not count `node` (nullopt: it does): the one rule for every kind
  // of missing peer — excluded for silence, departed from the members, or a minimum made
  // before the last membership change.
  std::optional<std::string> uncounted(const std::string& node) const;
};

struct AggregatorOptions {
  size_t fan_in = 32;
  std::chrono::milliseconds silence{3000};
  std::chrono::milliseconds heartbeat{1000};
  // How long a new parent has to answer a first report before the next one in the layout is
  // tried. Only the layout moves on after it: a parent is reported silent (and so may be
  // excluded) only after `silence`.
  std::chrono::milliseconds probe{300};
};

class Aggregator {
 public:
  using Clock = std::chrono::steady_clock;
  using TimePoint = Clock::time_point;

  Aggregator(std::string self, AggregatorOptions opts);

  // The Node list's live members (self included, or this agent takes no part).
  void set_members(const std::vector<std::string>& members, TimePoint now);
  // This agent's own watermark: its consumers applied every EndpointSlice event up to it;
  // its DNS watermark (≤ watermark); the clients of its consumers that stopped holding it.
  void set_local(uint64_t watermark);
  void set_local(uint64_t watermark, uint64_t dns_watermark, HoldoutList holdouts);

  void receive(const Message& m, TimePoint now);

  struct Send {
    std::string to;
    Message message;
  };
  // What to send now: changes, heartbeats due, and the silences that are now past deadline.
  std::vector<Send> poll(TimePoint now);
  // The next time poll() has something to do without new input.
  TimePoint next_deadline() const;

  // The newest cluster watermark this agent knows: every live agent's consumers applied every
  // EndpointSlice event up to it.
  uint64_t cluster_watermark() const { return cluster_; }
  uint64_t cluster_dns_watermark() const { return cluster_dns_; }
  const HoldoutList& cluster_holdouts() const { return cluster_holdouts_; }
  // Whether the cluster watermark counts `node`: the coverage it was published with is this
  // agent's members less its excluded, and `node` is one of those. A node it does not count is
  // unknown: never confirmed by the watermark, whatever its value.
  bool counts(std::string_view node) const;
  // Whether the published coverage is this agent's members less its excluded.
  bool coverage_current() const;
  // A copy for drains (the member list shared, not copied, until it changes).
  ClusterFacts facts() const;
  bool is_root() const { return tree_.root() == self_; }
  const std::set<std::string>& members() const { return *members_; }
  const std::set<std::string>& excluded() const { return excluded_; }
  uint64_t epoch() const { return epoch_; }  // of excluded()
  // The bounds on a decision's number (its high bits: the count of decisions): never past the
  // cap, so a root's next number never wraps; never more than the step past this agent's own.
  static constexpr uint64_t kMaxEpochCounter = uint64_t{1} << 40;
  static constexpr uint64_t kMaxEpochStep = uint64_t{1} << 20;
  // Parents this agent found silent itself (or that did not answer a probe), and since when.
  const std::map<std::string, TimePoint>& suspects() const { return suspects_; }
  const Tree& tree() const { return tree_; }
  const std::set<std::string>& lapsed() const { return lapsed_; }
  const std::string& self() const { return self_; }

  struct Stats {
    uint64_t up_sent = 0, down_sent = 0, relayouts = 0;
    uint64_t coverage_mismatches = 0;  // root: polls whose coverage was not the tree's
    uint64_t ignored = 0;              // messages from non-members
    // A child's report below its previous one over the same agents (a restart, or a peer that
    // lies): taken as reported, since the lower value can only delay a confirmation.
    uint64_t backwards = 0;
    // A cluster watermark from a parent above this agent's own local watermark although it
    // counts this agent (so it cannot be above it): clamped to the local watermark.
    uint64_t clamped_ahead = 0;
    // Decisions refused: a number past the cap, or too far past this agent's own; or, from
    // anyone but its parent, more than a step past the number it held when the current
    // `silence` window began (those are also counted in refused_epoch_rate).
    uint64_t refused_epoch = 0;
    uint64_t refused_epoch_rate = 0;
    // Down reports with a higher watermark from an agent that is not this one's parent (and
    // that it did not ask): never taken.
    uint64_t not_parent = 0;
    // Up reports not counted: their coverage is not the sender's subtree in this agent's
    // layout (the sender is not its child, or claims agents that are not below it). Layouts
    // differ for a moment while a member joins, leaves or is suspected; a report that claims
    // what its sender cannot vouch for is refused the same way.
    uint64_t refused_coverage = 0;
    // Decisions that exclude this agent or one of its ancestors from anyone but its parent (a
    // child passing one up, an agent it asked, its ring neighbour): those come from the root,
    // down the tree, or not at all.
    uint64_t refused_decision = 0;
    // Up reports refused whole: a DNS watermark above the routing one.
    uint64_t malformed = 0;
    // The root's direct samples of one agent's own watermark, and those below the minimum
    // the root had published counting it (an agent on the way up lied, or it restarted): the
    // published minimum is held at the sampled agent's own until the tree agrees with it.
    uint64_t samples = 0;
    uint64_t sample_below = 0;
    // Times this agent took its parent's decision after holding another one that the parent
    // did not take for a `silence` window.
    uint64_t yielded = 0;
  };
  const Stats& stats() const { return stats_; }

  // Reports that were wrong on their face, as they were received, for the log.
  struct Anomaly {
    // "backwards", "ahead", "epoch" (past the cap, the step, or a step per window from anyone
    // but the parent), "not-parent", "coverage", "decision" (an exclusion of this agent's line
    // from anyone but its parent), "malformed" or "sample-below"
    const char* kind;
    std::string from;
    uint64_t reported = 0, kept = 0;
  };
  std::vector<Anomaly> take_anomalies() { return std::exchange(anomalies_, {}); }

 private:
  struct ChildReport {
    UpReport report;
    TimePoint at;
  };
  void relayout(TimePoint now);
  // A probe to `to`: "are you there?", answered with a down report.
  void ask(const std::string& to, std::vector<Send>& out);
  void ask_ahead(TimePoint now, std::vector<Send>& out);
  UpReport aggregate(TimePoint now);
  // Where a decision comes from. kParent: a down report from this agent's parent in its layout,
  // the one sender whose decision may exclude this agent's own line and whose numbers are not
  // bounded per window (only per step). kAsked: an answer of an agent it asked (a suspect, a
  // next parent, the ring, the root's sample). kBelow: an up report (any member may send one).
  enum class Source { kParent, kAsked, kBelow };
  // Takes a newer exclusion decision; false when `epoch` is not newer than the one held, or it
  // is refused.
  bool adopt(const std::vector<std::string>& excluded, uint64_t epoch, const std::string& from,
             Source source, TimePoint now);
  // Holds `ex` at `epoch` from now on (what adopt takes, or the parent's word that this agent
  // yields to).
  void take_decision(std::set<std::string> ex, uint64_t epoch);
  // A cluster watermark from a parent, clamped to what this agent applied when it is counted.
  uint64_t bounded_cluster(const std::string& from, uint64_t watermark);
  // Whether a report from `from` over `covered` counts in this agent's minimum: `from` is its
  // child in its layout and `covered` is exactly that child's subtree.
  bool counts_report(const std::string& from, const Coverage& covered) const;
  // The root: asks one agent directly for its own watermark, every heartbeat.
  void sample(TimePoint now, std::vector<Send>& out);
  // The root: an answer of the agent it sampled.
  void take_sample(const DownReport& d);
  void note(const char* kind, const std::string& from, uint64_t reported, uint64_t kept);

  std::string self_;
  AggregatorOptions opts_;
  // Shared with the facts handed out (replaced, never changed in place): a look at them copies
  // a pointer, not 5,000 names.
  std::shared_ptr<const std::set<std::string>> members_ =
      std::make_shared<const std::set<std::string>>();
  std::set<std::string> excluded_;  // as the root decided (the root: as it decides)
  // Made again whenever members_ or excluded_ change (recount), not at every look: at 5,000
  // members a walk of the list at each publish of the view and each root poll was most of the
  // cluster thread's CPU.
  Coverage live_coverage_;  // members_ less excluded_: what a current watermark covers
  Coverage root_want_;      // the same with self_ counted even if excluded: what the root waits for
  void recount();
  std::map<std::string, TimePoint> suspects_;  // parent -> silent since
  Tree tree_;
  std::string parent_;  // empty: root or not a member
  std::vector<std::string> children_;
  std::map<std::string, Coverage, std::less<>> child_cover_;  // each child's subtree
  TimePoint parent_since_{};            // when parent_ became the parent, or last heard from it
  bool parent_answered_ = false;        // the parent has spoken since it became the parent
  std::set<std::string> down_sent_to_;  // recipients of the last down report
  std::map<std::string, TimePoint> child_since_;
  std::map<std::string, ChildReport, std::less<>> reports_;
  std::set<std::string> returning_;  // excluded agents this agent heard from
  std::set<std::string> lapsed_;     // agents whose reports stopped: reported silent
  std::set<std::string> leave_;      // agents to tell, at the next poll, that this one is not
                                     // their child (a former parent, a parent by another layout)
  std::set<std::string> answer_;     // agents that probed this one: a down report at the next poll
  TimePoint last_suspect_probe_at_{};
  std::map<std::string, TimePoint> asked_;  // the next parents, asked ahead and not heard from
  std::string ring_next_;                   // the member this one watches besides the tree
  TimePoint ring_heard_{};
  TimePoint last_ring_probe_at_{};
  uint64_t local_ = 0;
  uint64_t local_dns_ = 0;
  HoldoutList local_holdouts_;
  // The last merge of the subtree's holdouts and the lists it was made of: reports that did
  // not change bring the same lists, and the merge is not made again.
  std::vector<HoldoutList> merged_from_;
  HoldoutList merged_;
  uint64_t cluster_ = 0;
  uint64_t cluster_dns_ = 0;
  Coverage cluster_covered_;  // whom cluster_ covers, as the root published it
  HoldoutList cluster_holdouts_;
  // Publishes a minimum (the root) or takes one from a down report.
  void take_cluster(const DownReport& d);
  DownReport down_report() const;
  std::optional<UpReport> last_up_;
  TimePoint last_up_at_{};
  std::optional<DownReport> last_down_;
  TimePoint last_down_at_{};
  static constexpr size_t kProbesPerHeartbeat = 2;
  // The root's direct sample: whom it asked, when, and the minimum it had published (over
  // coverage that counted that agent) when it asked.
  struct Sample {
    std::string node;
    TimePoint at{};
    uint64_t published = 0, published_dns = 0;
  };
  std::optional<Sample> sample_;
  TimePoint last_sample_at_{};
  uint64_t sample_turn_ = 0;
  // Set when a sampled agent's own watermark was below the published minimum: the root
  // publishes no more than it until a sample of that agent shows the tree's minimum at or
  // below its own again.
  struct Ceiling {
    std::string node;
    uint64_t watermark = 0, dns = 0;
  };
  std::optional<Ceiling> ceiling_;
  uint64_t agg_watermark_ = 0, agg_dns_ = 0;  // the root's last minimum, before any ceiling
  uint64_t epoch_ = 0;                        // of excluded_
  // The window in which everyone but the parent together may move epoch_ by one step: since
  // when, and the decision count held when it began.
  bool window_open_ = false;
  TimePoint window_start_{};
  uint64_t window_base_ = 0;
  // The last decision refused because one member other than the parent offered it and it
  // excludes this agent's own line: the same decision from a second member is taken.
  struct LineOffer {
    uint64_t epoch = 0, digest = 0;
    std::string from;
  };
  std::optional<LineOffer> line_offer_;
  // This process has held a current coverage (its parent's watermark under its own decision,
  // or as the root its own minimum over the tree) at least once.
  bool ever_current_ = false;
  // Since when the parent (parent_behind_from_) has spoken under another decision than this
  // agent's.
  std::optional<TimePoint> parent_behind_since_;
  std::string parent_behind_from_;
  uint64_t parent_epoch_ = 0;              // the decision the parent last sent
  std::set<std::string> parent_excluded_;  // and its list
  TimePoint last_probe_at_{};
  size_t probe_next_ = 0;
  bool layout_dirty_ = true;
  std::optional<TimePoint> last_poll_;
  Stats stats_;
  std::vector<Anomaly> anomalies_;  // bounded: kMaxAnomalies until taken
  static constexpr size_t kMaxAnomalies = 64;
};

}  // namespace endpointd::drain
