// The cluster watermark, simulated: a few hundred Aggregators exchanging messages in rounds on a
// virtual clock, some of them stopped (their messages dropped both ways) as SIGSTOP would.
#include "drain/aggregate.h"

#include <gtest/gtest.h>

#include <iostream>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <set>

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using TimePoint = Aggregator::TimePoint;

TEST(Revision, ParsesDecimalPositionsOnly) {
  struct Case {
    const char* in;
    uint64_t want;  // 0: an error
  } cases[] = {
      {"1", 1},
      {"123456789", 123456789},
      {"18446744073709551615", 18446744073709551615ULL},
      {"18446744073709551616", 0},
      {"", 0},
      {"0", 0},
      {"007", 0},
      {"-5", 0},
      {"+5", 0},
      {"12a", 0},
      {" 12", 0},
      {"MTIz", 0},
  };
  for (const auto& c : cases) {
    auto r = parse_revision(c.in);
    if (c.want == 0) {
      ASSERT_FALSE(r) << c.in;
      EXPECT_NE(r.error().find("resourceVersion \"" + std::string(c.in) + "\""), std::string::npos)
          << r.error();
    } else {
      ASSERT_TRUE(r) << c.in << ": " << r.error();
      EXPECT_EQ(*r, c.want);
    }
  }
}

std::vector<std::string> names(size_t n, const std::string& prefix = "node-") {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

TEST(Tree, EveryMemberHasOneParentAndBoundedChildren) {
  for (size_t n : {1, 2, 9, 200, 5000}) {
    for (size_t k : {2, 8, 32}) {
      auto members = names(n);
      Tree t(members, k);
      ASSERT_EQ(t.size(), n);
      size_t roots = 0;
      Coverage all;
      for (const auto& m : members) {
        all.add(m);
        const std::string* p = t.parent(m);
        if (!p) {
          ++roots;
          EXPECT_EQ(t.root(), m);
          continue;
        }
        auto siblings = t.children(*p);
        EXPECT_NE(std::find(siblings.begin(), siblings.end(), m), siblings.end()) << m;
        EXPECT_LE(t.children(m).size(), k);
      }
      EXPECT_EQ(roots, 1u);
      EXPECT_EQ(t.coverage(), all);
      // Depth: the smallest d with 1 + k + ... + k^(d-1) >= n.
      size_t d = 0, cap = 0, width = 1;
      while (cap < n) cap += width, width *= k, ++d;
      EXPECT_EQ(t.depth(), d) << n << " " << k;
    }
  }
  // 5,000 nodes with fan-in 32: at most 33 tree connections per agent, 4 levels.
  Tree big(names(5000), 32);
  EXPECT_EQ(big.depth(), 4u);
}

TEST(Tree, SameLayoutWhateverTheOrderOfTheList) {
  auto members = names(300);
  Tree a(members, 8);
  std::shuffle(members.begin(), members.end(), std::mt19937(7));
  members.push_back(members.front());  // a duplicate counts once
  Tree b(members, 8);
  EXPECT_EQ(a.members(), b.members());
  EXPECT_EQ(a.coverage(), b.coverage());
}

TEST(Coverage, MissingOrDoubleCountedAgentDiffers) {
  Coverage all, missing, twice;
  for (const auto& n : names(50)) all.add(n);
  for (const auto& n : names(49)) missing.add(n);
  twice = all;
  twice.add("node-3");
  EXPECT_NE(all, missing);
  EXPECT_NE(all, twice);
  Coverage other;  // same count, one name swapped
  for (const auto& n : names(49)) other.add(n);
  other.add("node-x");
  EXPECT_NE(all, other);
}

// Rounds of: deliver every queued message (dropped if either end is stopped), then poll every
// running agent. Each round is 10 ms of the virtual clock.
class Sim {
 public:
  Sim(size_t n, AggregatorOptions opts) : members_(names(n)) {
    for (const auto& m : members_) {
      agents_.emplace(m, Aggregator(m, opts));
      local_[m] = 0;
    }
    for (auto& [m, a] : agents_) a.set_members(members_, now_);
  }

  Aggregator& at(const std::string& n) { return agents_.at(n); }
  void set_local(const std::string& n, uint64_t w) {
    local_[n] = w;
    agents_.at(n).set_local(w);
  }
  void stop(const std::string& n) { stopped_.insert(n); }
  void resume(const std::string& n) { stopped_.erase(n); }
  const std::set<std::string>& stopped() const { return stopped_; }
  const std::vector<std::string>& members() const { return members_; }
  TimePoint now() const { return now_; }
  // What a lying agent does to the messages it sends (from, to, message).
  void set_tamper(std::function<void(const std::string&, const std::string&, Message&)> t) {
    tamper_ = std::move(t);
  }
  // A test of a lie that the cluster catches only afterwards turns the per-round check off and
  // checks what it expects itself.
  void check_safety_each_round(bool on) { safety_checked_ = on; }

  void round() {
    std::deque<std::pair<std::string, Message>> inbox;
    inbox.swap(queue_);
    for (auto& [to, m] : inbox) {
      const std::string& from = std::visit([](const auto& r) { return r.from; }, m);
      if (stopped_.count(to) || stopped_.count(from)) continue;
      agents_.at(to).receive(m, now_);
      peers_[to].insert(from);
    }
    for (auto& [name, a] : agents_) {
      if (stopped_.count(name)) continue;
      for (auto& s : a.poll(now_)) {
        if (tamper_) tamper_(name, s.to, s.message);
        ++sent_[name];
        peers_[name].insert(s.to);
        queue_.emplace_back(s.to, std::move(s.message));
      }
      check_safety(a);
    }
    now_ += 10ms;
  }

  // The invariant that makes the watermark safe: a root never publishes a value above the local
  // watermark of an agent it has not excluded.
  // (checked whenever a root publishes a new value, against the members it knows).
  void check_safety(const Aggregator& a) {
    if (!safety_checked_) return;
    uint64_t& last = published_[a.self()];
    if (!a.is_root() || a.cluster_watermark() == last) return;
    last = a.cluster_watermark();
    uint64_t min = UINT64_MAX;
    for (const auto& m : a.members())
      if (!a.excluded().count(m)) min = std::min(min, local_.at(m));
    ASSERT_LE(a.cluster_watermark(), min) << "root " << a.self();
  }

  uint64_t live_min() const {
    uint64_t min = UINT64_MAX;
    for (const auto& m : members_)
      if (!stopped_.count(m)) min = std::min(min, local_.at(m));
    return min;
  }
  // Rounds until every running agent holds `want`, or -1 after `max_rounds`.
  int rounds_until_all(uint64_t want, int max_rounds) {
    for (int r = 0; r <= max_rounds; ++r) {
      bool all = true;
      for (const auto& [n, a] : agents_)
        if (!stopped_.count(n) && a.cluster_watermark() != want) all = false;
      if (all) return r;
      round();
    }
    return -1;
  }
  uint64_t total_sent() const {
    uint64_t t = 0;
    for (const auto& [n, c] : sent_) t += c;
    return t;
  }
  void reset_counts() {
    sent_.clear();
    peers_.clear();
  }
  size_t max_peers() const {
    size_t m = 0;
    for (const auto& [n, p] : peers_) m = std::max(m, p.size());
    return m;
  }

 private:
  std::vector<std::string> members_;
  std::map<std::string, Aggregator> agents_;
  std::map<std::string, uint64_t> local_;
  std::set<std::string> stopped_;
  std::deque<std::pair<std::string, Message>> queue_;
  std::map<std::string, uint64_t> sent_;
  std::map<std::string, uint64_t> published_;
  std::map<std::string, std::set<std::string>> peers_;
  TimePoint now_ = TimePoint{} + 1h;
  std::function<void(const std::string&, const std::string&, Message&)> tamper_;
  bool safety_checked_ = true;
};

AggregatorOptions opts(size_t k) {
  AggregatorOptions o;
  o.fan_in = k;
  o.silence = 500ms;
  o.heartbeat = 200ms;
  o.probe = 100ms;
  return o;
}

TEST(Aggregator, TwoHundredAgentsAgreeOnTheMinimumWithinTwiceTheDepth) {
  const size_t k = 8;
  Sim sim(200, opts(k));
  std::mt19937 rng(1);
  for (const auto& m : sim.members()) sim.set_local(m, 1000 + rng() % 500);
  size_t depth = sim.at("node-0").tree().depth();
  ASSERT_EQ(depth, 4u);  // 1 + 8 + 64 + 512
  int r = sim.rounds_until_all(sim.live_min(), 50);
  ASSERT_GE(r, 0);
  EXPECT_LE(r, static_cast<int>(2 * depth + 2));

  // One cluster change: every agent applies it (its watermark moves past the update). Count
  // what it costs until every agent knows the new minimum, heartbeats left out of the window.
  sim.reset_counts();
  for (const auto& m : sim.members()) sim.set_local(m, 5000);
  r = sim.rounds_until_all(5000, 50);
  ASSERT_GE(r, 0);
  EXPECT_LE(r, static_cast<int>(2 * depth + 2));
  double per_agent = static_cast<double>(sim.total_sent()) / 200;
  EXPECT_LE(per_agent, k + 1.0) << sim.total_sent();
  EXPECT_LE(sim.max_peers(), k + 1);
}

TEST(Aggregator, WatermarkNeverPassesAnAgentThatIsNotExcluded) {
  // Agent node-7 applies nothing new while the rest move on: nobody may publish past it while it
  // is alive, however the reports interleave.
  Sim sim(120, opts(4));
  for (const auto& m : sim.members()) sim.set_local(m, 100);
  ASSERT_GE(sim.rounds_until_all(100, 50), 0);
  for (const auto& m : sim.members())
    if (m != "node-7") sim.set_local(m, 200);
  for (int i = 0; i < 100; ++i) sim.round();  // check_safety runs every round
  EXPECT_EQ(sim.at("node-0").cluster_watermark(), 100u);
  sim.set_local("node-7", 200);
  EXPECT_GE(sim.rounds_until_all(200, 50), 0);
}

TEST(Aggregator, StoppedAgentsInteriorOnesIncludedAreExcludedAndOnlyThey) {
  const size_t n = 200, k = 8;
  Sim sim(n, opts(k));
  for (const auto& m : sim.members()) sim.set_local(m, 100);
  ASSERT_GE(sim.rounds_until_all(100, 50), 0);

  // 20 % stopped: the root, every one of its children (interior), and random others.
  Tree t = sim.at("node-0").tree();
  std::set<std::string> stop{t.root()};
  for (const auto& c : t.children(t.root())) stop.insert(c);
  std::mt19937 rng(3);
  while (stop.size() < n / 5) stop.insert(sim.members()[rng() % n]);
  for (const auto& s : stop) sim.stop(s);
  // The stopped ones never apply the next change; the rest do.
  for (const auto& m : sim.members())
    if (!stop.count(m)) sim.set_local(m, 300);

  // Confirmed after the silence deadline (500 ms here), the probes of the next parents in the
  // layout (100 ms each: the root and all its children are gone, so the agents below try
  // several) and a deadline for the agents first found by a probe. Measured: 2,080 ms.
  int r = sim.rounds_until_all(300, 400);
  ASSERT_GE(r, 0);
  EXPECT_LE(r * 10, 2500) << "ms";
  for (const auto& m : sim.members()) {
    if (stop.count(m)) continue;
    // Only the stopped agents are excluded, as every running agent sees it.
    EXPECT_EQ(sim.at(m).excluded(), stop) << m;
  }

  // They come back: the root probes the excluded and takes back any that answers; a resumed
  // former root learns the newer exclusion decision (numbered) from the agents it sends down
  // reports to, reports to the new root from outside the tree and is taken back; every agent
  // ends on the newest decision, so on one tree.
  for (const auto& s : stop) sim.resume(s);
  int rounds = -1;
  for (int i = 0; i < 600 && rounds < 0; ++i) {
    sim.round();
    bool all = true;
    for (const auto& m : sim.members())
      if (!sim.at(m).excluded().empty()) all = false;
    if (all) rounds = i + 1;
  }
  ASSERT_GE(rounds, 0) << "still excluded somewhere after 6 s";
  EXPECT_LE(rounds * 10, 3000) << "ms to readmit every resumed agent";
  std::set<std::string> roots;
  for (const auto& m : sim.members()) roots.insert(sim.at(m).tree().root());
  EXPECT_EQ(roots.size(), 1u);
  // The watermark waits for the resumed agents (100) until they apply 300 too.
  EXPECT_GE(sim.rounds_until_all(100, 300), 0);
  for (const auto& s : stop) sim.set_local(s, 300);
  EXPECT_GE(sim.rounds_until_all(300, 300), 0);
}

TEST(Aggregator, AJoiningNodeHoldsTheWatermarkUntilItApplied) {
  Sim sim(30, opts(4));
  for (const auto& m : sim.members()) sim.set_local(m, 50);
  ASSERT_GE(sim.rounds_until_all(50, 50), 0);
  // node-29 leaves the Node list (everyone is told), then joins again with nothing applied.
  auto without = sim.members();
  without.pop_back();
  for (const auto& m : without) sim.at(m).set_members(without, sim.now());
  sim.stop("node-29");
  for (const auto& m : without) sim.set_local(m, 60);
  ASSERT_GE(sim.rounds_until_all(60, 100), 0);
  sim.resume("node-29");
  sim.set_local("node-29", 0);
  for (const auto& m : sim.members()) sim.at(m).set_members(sim.members(), sim.now());
  ASSERT_GE(sim.rounds_until_all(0, 50), 0);
  sim.set_local("node-29", 60);
  EXPECT_GE(sim.rounds_until_all(60, 50), 0);
}

TEST(Aggregator, IgnoresNonMembersAndItself) {
  Aggregator a("node-1", opts(4));
  auto now = TimePoint{} + 1h;
  a.set_members(names(5), now);
  UpReport r;
  r.watermark = 999;
  r.from = "intruder";
  a.receive(r, now);
  r.from = "node-1";
  a.receive(r, now);
  EXPECT_EQ(a.stats().ignored, 2u);
}

// Bad input from a peer with a valid certificate: a cluster watermark above what this agent
// applied is clamped to its own (the root's minimum counts it), and counted; a report that
// goes backwards is counted and taken as reported, since the lower value only delays.
TEST(Aggregator, ClampsAClusterWatermarkAboveItsOwnAndCountsBackwardsReports) {
  auto members = names(2);
  Tree tree(members, 4);
  std::string root = tree.root();
  std::string child = members[0] == root ? members[1] : members[0];
  auto now = TimePoint{} + 1h;

  Aggregator c(child, opts(4));
  c.set_members(members, now);
  c.set_local(50);
  c.poll(now);
  DownReport d;
  d.from = root;
  d.watermark = 1000;  // above what the child applied: a lie, or a bug
  c.receive(d, now);
  EXPECT_EQ(c.cluster_watermark(), 50u);
  EXPECT_EQ(c.stats().clamped_ahead, 1u);
  auto a = c.take_anomalies();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_STREQ(a[0].kind, "ahead");
  EXPECT_EQ(a[0].from, root);
  EXPECT_EQ(a[0].reported, 1000u);
  EXPECT_EQ(a[0].kept, 50u);
  d.watermark = 40;  // honest: taken as it is
  c.receive(d, now);
  EXPECT_EQ(c.cluster_watermark(), 40u);
  EXPECT_EQ(c.stats().clamped_ahead, 1u);
  EXPECT_TRUE(c.take_anomalies().empty());

  Aggregator r(root, opts(4));
  r.set_members(members, now);
  r.set_local(200);
  r.poll(now);
  UpReport u;
  u.from = child;
  u.covered.add(child);
  u.watermark = 100;
  r.receive(u, now);
  r.poll(now + 1ms);
  EXPECT_EQ(r.cluster_watermark(), 100u);
  u.watermark = 60;  // backwards over the same agents
  r.receive(u, now + 2ms);
  r.poll(now + 3ms);
  EXPECT_EQ(r.cluster_watermark(), 60u);
  EXPECT_EQ(r.stats().backwards, 1u);
  auto b = r.take_anomalies();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_STREQ(b[0].kind, "backwards");
  EXPECT_EQ(b[0].from, child);
}

// A member with valid credentials that is not the receiver's parent: its down report — a
// huge watermark, everyone else excluded under the next decision — is refused and counted, and
// the receiver keeps the cluster's word. A decision numbered UINT64_MAX (which would wrap the
// root's next number to one every agent ignores) or far past the receiver's is refused even
// from the parent; the cluster keeps deciding afterwards.
TEST(Aggregator, RefusesForgedDownReportsAndEpochsThatWrapOrJump) {
  Sim sim(9, opts(2));
  Tree tree(sim.members(), 2);
  // A leaf, its parent, an attacker that is neither, and one more agent, stopped and started
  // again first so that the cluster has made decisions (a new process takes any number).
  std::string leaf, attacker, other;
  for (const auto& m : sim.members())
    if (tree.children(m).empty() && tree.parent(m)) leaf = m;
  for (const auto& m : sim.members())
    if (m != leaf && m != *tree.parent(leaf)) attacker = m;
  for (const auto& m : sim.members())
    if (m != leaf && m != *tree.parent(leaf) && m != attacker && tree.children(m).empty())
      other = m;
  for (const auto& m : sim.members()) sim.set_local(m, 100);
  sim.stop(other);
  ASSERT_GE(sim.rounds_until_all(100, 400), 0);
  sim.resume(other);
  for (int i = 0; i < 200 && !sim.at(leaf).excluded().empty(); ++i) sim.round();
  ASSERT_GE(sim.rounds_until_all(100, 400), 0);
  Aggregator& a = sim.at(leaf);
  ASSERT_TRUE(a.excluded().empty());
  const uint64_t epoch = a.epoch();
  ASSERT_NE(epoch, 0u);
  // (While layouts differed, a former parent's newer news may have been refused too.)
  const uint64_t not_parent = a.stats().not_parent;
  a.take_anomalies();
  DownReport forged;
  forged.from = attacker;
  forged.watermark = 1'000'000;
  forged.epoch = ((epoch >> 16) + 1) << 16;
  for (const auto& m : sim.members())
    if (m != leaf && m != attacker) forged.excluded.push_back(m);
  forged.covered.add(leaf);
  forged.covered.add(attacker);
  a.receive(forged, sim.now());
  EXPECT_EQ(a.cluster_watermark(), 100u);
  EXPECT_EQ(a.epoch(), epoch);
  EXPECT_TRUE(a.excluded().empty());
  EXPECT_EQ(a.stats().not_parent, not_parent + 1);
  auto seen = a.take_anomalies();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_STREQ(seen[0].kind, "not-parent");
  EXPECT_EQ(seen[0].from, attacker);

  // From the parent itself (a compromised interior agent): a wrapping number and a jump are
  // refused; the watermark it may still send is clamped to the leaf's own (above).
  DownReport wrap;
  wrap.from = *tree.parent(leaf);
  wrap.watermark = 100;
  wrap.epoch = UINT64_MAX;
  wrap.excluded = {attacker};
  a.receive(wrap, sim.now());
  wrap.epoch = ((epoch >> 16) + Aggregator::kMaxEpochStep + 1) << 16;
  a.receive(wrap, sim.now());
  EXPECT_EQ(a.epoch(), epoch);
  EXPECT_TRUE(a.excluded().empty());
  EXPECT_EQ(a.stats().refused_epoch, 2u);
  for (const auto& an : a.take_anomalies()) EXPECT_STREQ(an.kind, "epoch");

  // The cluster still decides: an agent stopped is excluded under the next number, and the
  // watermark moves on without it.
  sim.stop(attacker);
  for (const auto& m : sim.members())
    if (m != attacker) sim.set_local(m, 200);
  ASSERT_GE(sim.rounds_until_all(200, 400), 0);
  EXPECT_TRUE(a.excluded().count(attacker));
  EXPECT_GT(a.epoch(), epoch);
  EXPECT_LT(a.epoch() >> 16, Aggregator::kMaxEpochCounter);
}

// A peer that claims to be the root — even the agent the layout makes root — speaks for the
// cluster to its own children only: to an agent further down, its down report is a non-parent's
// and is not taken (kind "not-parent").
TEST(Aggregator, APeerClaimingToBeTheRootIsNotTakenBelowItsChildren) {
  Sim sim(15, opts(2));
  Tree tree(sim.members(), 2);
  // Not the last in the layout's order: that one watches the root on the ring, and an answer
  // to its own probe is the one other way a decision reaches it.
  std::string grandchild;
  for (const auto& m : tree.members())
    if (grandchild.empty() && tree.ancestors(m).size() >= 2 && m != tree.members().back())
      grandchild = m;
  ASSERT_FALSE(grandchild.empty());
  for (const auto& m : sim.members()) sim.set_local(m, 100);
  ASSERT_GE(sim.rounds_until_all(100, 400), 0);
  Aggregator& a = sim.at(grandchild);
  const uint64_t before = a.stats().not_parent;
  DownReport claim;
  claim.from = tree.root();
  claim.watermark = 100;  // no more than the agent's own: only the sender is wrong
  claim.epoch = a.epoch() + (uint64_t{1} << 16);
  claim.excluded = {*tree.parent(grandchild)};
  claim.covered = tree.coverage();
  a.receive(claim, sim.now());
  EXPECT_EQ(a.stats().not_parent, before + 1);
  EXPECT_TRUE(a.excluded().empty());
  EXPECT_EQ(a.tree().parent(grandchild) ? *a.tree().parent(grandchild) : "",
            *tree.parent(grandchild));
}

// Three agents, the root and its two children; `a` reports first. Returns the root's name and
// its children, in the layout's order.
struct Small {
  std::vector<std::string> members{"node-a", "node-b", "node-c"};
  Tree tree{members, 2};
  std::string root = tree.root();
  std::vector<std::string> kids = tree.children(root);
};

// A member vouches only for agents it hears from: a child's report counts at its parent only
// over exactly its subtree in the parent's layout. Before, the root counted any member's report
// over any coverage, so one member claiming to cover an agent that never reported (a stopped
// one, whose kernel may still route) made the root publish a minimum that counted it.
TEST(Aggregator, AMemberVouchesOnlyForItsOwnSubtree) {
  Small s;
  ASSERT_EQ(s.kids.size(), 2u);
  const std::string& liar = s.kids[0];
  const std::string& silent = s.kids[1];
  Aggregator root(s.root, opts(2));
  TimePoint now = TimePoint{} + 1h;
  root.set_members(s.members, now);
  root.set_local(200);
  root.poll(now);
  UpReport forged;
  forged.from = liar;
  forged.watermark = 200;
  forged.dns_watermark = 200;
  forged.covered.add(liar);
  forged.covered.add(silent);  // never heard from
  root.receive(forged, now);
  EXPECT_EQ(root.stats().refused_coverage, 1u);
  auto seen = root.take_anomalies();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_STREQ(seen[0].kind, "coverage");
  EXPECT_EQ(seen[0].from, liar);
  for (int i = 0; i < 10; ++i) {
    now += 50ms;
    root.poll(now);
    root.receive(forged, now);
  }
  EXPECT_EQ(root.cluster_watermark(), 0u) << "a minimum that counts " << silent;
  EXPECT_FALSE(root.coverage_current());
  // The same agent over its own subtree counts; with the other child's own report the root
  // publishes the true minimum.
  UpReport honest = forged;
  honest.covered = Coverage{};
  honest.covered.add(liar);
  honest.watermark = honest.dns_watermark = 150;
  root.receive(honest, now);
  UpReport other;
  other.from = silent;
  other.watermark = other.dns_watermark = 120;
  other.covered.add(silent);
  root.receive(other, now);
  now += 50ms;
  root.poll(now);
  EXPECT_EQ(root.cluster_watermark(), 120u);
  EXPECT_TRUE(root.coverage_current());
  // Not a child at all (an agent the layout puts elsewhere): not counted either, whatever it
  // covers.
  Aggregator child(liar, opts(2));
  child.set_members(s.members, now);
  child.set_local(200);
  UpReport sideways;
  sideways.from = silent;
  sideways.watermark = sideways.dns_watermark = 200;
  sideways.covered.add(silent);
  child.receive(sideways, now);
  EXPECT_EQ(child.stats().refused_coverage, 1u);
}

// A decision that excludes the receiver or one of its ancestors is the root's to send down the
// tree: passed up (in an up report, which any member may send), it is refused and counted. A
// decision that excludes others still travels up, as a restarted root must learn it.
TEST(Aggregator, RefusesDecisionsFromBelowThatCutItsOwnLine) {
  Small s;
  const std::string& kid = s.kids[0];
  const std::string& other = s.kids[1];
  TimePoint now = TimePoint{} + 1h;
  Aggregator root(s.root, opts(2));
  root.set_members(s.members, now);
  Aggregator leaf(kid, opts(2));
  leaf.set_members(s.members, now);
  UpReport up;
  up.from = kid;
  up.decision = true;
  up.epoch = uint64_t{1} << 16;
  up.excluded = {s.root};  // the root itself: "you are out"
  root.receive(up, now);
  EXPECT_TRUE(root.excluded().empty());
  EXPECT_EQ(root.epoch(), 0u);
  EXPECT_EQ(root.stats().refused_decision, 1u);
  auto seen = root.take_anomalies();
  EXPECT_TRUE(std::any_of(seen.begin(), seen.end(),
                          [](const auto& a) { return std::string(a.kind) == "decision"; }));
  // The leaf's ancestor (the root), passed up to the leaf by the other member: refused.
  UpReport up2 = up;
  up2.from = other;
  leaf.receive(up2, now);
  EXPECT_TRUE(leaf.excluded().empty());
  EXPECT_EQ(leaf.stats().refused_decision, 1u);
  // Excluding someone else: taken (the newest decision spreads over every link).
  up.excluded = {other};
  root.receive(up, now);
  EXPECT_EQ(root.excluded(), std::set<std::string>{other});
  EXPECT_EQ(root.epoch(), uint64_t{1} << 16);
  // The same decision from the parent, down the tree, is taken even when it names the
  // receiver: that is how an agent the root excluded while it was stopped learns it.
  DownReport down;
  down.from = s.root;
  down.epoch = uint64_t{2} << 16;
  down.excluded = {kid};
  leaf.receive(down, now);
  EXPECT_EQ(leaf.excluded(), std::set<std::string>{kid});
}

// The ring neighbour that an agent asks every heartbeat (a member it may not hear from
// otherwise) answers with a plausible next decision that excludes the asker and its parent.
// Taken, it would put the asker outside the tree and make its coverage stale: no drain on it
// confirmed until a later decision, and another one forged at the next heartbeat. Such a
// decision is the root's word down the tree: refused from anyone but the parent, counted
// ("decision"), and the asker's line, coverage and confirmations go on as before.
TEST(Aggregator, TheRingNeighboursDecisionCuttingTheAskersLineIsRefused) {
  Sim sim(15, opts(2));
  Tree tree(sim.members(), 2);
  const auto& order = tree.members();
  // An agent two levels down whose ring neighbour is linked to it by nothing else.
  std::string a, ring;
  for (size_t i = 0; i < order.size() && a.empty(); ++i) {
    const std::string& next = order[(i + 1) % order.size()];
    const auto line = tree.ancestors(order[i]);
    const std::string* its_parent = tree.parent(next);
    if (line.size() < 2 || (its_parent && *its_parent == order[i]) ||
        std::find(line.begin(), line.end(), next) != line.end())
      continue;
    a = order[i];
    ring = next;
  }
  ASSERT_FALSE(a.empty());
  const std::string parent = *tree.parent(a);
  uint64_t w = 100;
  for (const auto& m : sim.members()) sim.set_local(m, w);
  ASSERT_GE(sim.rounds_until_all(w, 400), 0);
  Aggregator& agent = sim.at(a);
  ASSERT_TRUE(agent.coverage_current());
  agent.take_anomalies();
  // node `ring` answers every probe of `a` with the forgery, numbered one past a's decision.
  int forged = 0;
  sim.set_tamper([&](const std::string& from, const std::string& to, Message& m) {
    if (from != ring || to != a) return;
    if (auto* d = std::get_if<DownReport>(&m)) {
      d->epoch = (((agent.epoch() >> 16) + 1) << 16) | (member_hash(ring) >> 48);
      d->excluded = {a, parent};
      ++forged;
    }
  });
  // Ten changes over 4 s (8 silence windows): each one reaches a, every member counted, and
  // never a round in which a's coverage is stale or its line cut.
  for (int change = 0; change < 10; ++change) {
    w += 100;
    for (const auto& m : sim.members()) sim.set_local(m, w);
    int r = 0;
    for (; r < 40 && agent.cluster_watermark() != w; ++r) {
      sim.round();
      ASSERT_TRUE(agent.coverage_current()) << "change " << change << ", round " << r;
      ASSERT_TRUE(agent.excluded().empty()) << "change " << change << ", round " << r;
      ASSERT_EQ(agent.tree().parent(a) ? *agent.tree().parent(a) : "", parent);
    }
    ASSERT_EQ(agent.cluster_watermark(), w) << "change " << change << " not confirmed";
    for (const auto& m : sim.members()) EXPECT_TRUE(agent.counts(m)) << m;
    for (int i = 0; i < 20; ++i) sim.round();  // a heartbeat or two between changes
  }
  ASSERT_GE(forged, 10);
  EXPECT_GE(agent.stats().refused_decision, static_cast<uint64_t>(forged));
  auto seen = agent.take_anomalies();
  EXPECT_TRUE(std::any_of(seen.begin(), seen.end(), [&](const auto& an) {
    return std::string(an.kind) == "decision" && an.from == ring;
  }));
}

// A member that forges decisions excluding no one on the receiver's line (in up reports, which
// any member may send, each one step past the receiver's number) walks its number at most one
// step per `silence` window; the rest are refused and counted ("epoch"), a second member in
// the same window gains nothing more, and the parent's next real decision is still taken.
TEST(Aggregator, ForgedDecisionsMoveTheNumberAtMostAStepPerWindow) {
  Tree tree(names(7), 2);
  std::string a;
  for (const auto& m : tree.members())
    if (a.empty() && tree.ancestors(m).size() == 2) a = m;
  ASSERT_FALSE(a.empty());
  const std::string parent = *tree.parent(a);
  std::vector<std::string> others;
  for (const auto& m : tree.members())
    if (m != a && m != parent) others.push_back(m);
  const auto o = opts(2);  // silence 500 ms
  TimePoint now = TimePoint{} + 1h;
  Aggregator agent(a, o);
  agent.set_members(names(7), now);
  agent.poll(now);
  DownReport real;
  real.from = parent;
  real.epoch = uint64_t{3} << 16;
  agent.receive(real, now);
  ASSERT_EQ(agent.epoch(), real.epoch);
  const uint64_t start = agent.epoch() >> 16;
  const uint64_t step = Aggregator::kMaxEpochStep;

  auto forge = [&](const std::string& from) {
    UpReport up;
    up.from = from;
    up.decision = true;
    up.epoch = ((agent.epoch() >> 16) + step) << 16;  // the most any single report may jump
    agent.receive(up, now);
  };
  // Five windows, five forgeries in each, 100 ms apart.
  const int windows = 5, per_window = 5;
  for (int w = 0; w < windows; ++w) {
    for (int i = 0; i < per_window; ++i) {
      forge(others[0]);
      if (i == 1) forge(others[1]);  // an accomplice (or an honest relay) in the same window
      now += o.silence / per_window;
    }
    EXPECT_EQ(agent.epoch() >> 16, start + (w + 1) * step) << "window " << w;
  }
  // In each window the first forgery is taken; the other four and the accomplice's are not.
  EXPECT_EQ(agent.stats().refused_epoch_rate, static_cast<uint64_t>(windows * per_window));
  EXPECT_EQ(agent.stats().refused_epoch, agent.stats().refused_epoch_rate);
  // (Each report is also not counted in the minimum, "coverage": the sender is no child.)
  auto seen = agent.take_anomalies();
  EXPECT_EQ(std::count_if(seen.begin(), seen.end(),
                          [](const auto& an) { return std::string(an.kind) == "epoch"; }),
            windows * per_window);
  // A forgery spent this window; the parent's next decision (one past the number held, as a
  // root's is) is still taken in it.
  forge(others[0]);
  const uint64_t held = agent.epoch();
  real.epoch = (((held >> 16) + 1) << 16) | 7;
  real.excluded = {others[0]};
  agent.receive(real, now);
  EXPECT_EQ(agent.epoch(), real.epoch);
  EXPECT_EQ(agent.excluded(), std::set<std::string>{others[0]});
}

// The parent's word is the tree's: its decision excluding the receiver's grandparent is taken
// (the same decision from the ring neighbour is refused just before), and in a running cluster
// whose interior agent stops, the agents below it take the exclusion from their parents and
// their watermark moves on without it.
TEST(Aggregator, TheParentsDecisionExcludingAnAncestorIsTaken) {
  Tree tree(names(7), 2);
  std::string a;
  for (const auto& m : tree.members())
    if (a.empty() && tree.ancestors(m).size() == 2) a = m;
  ASSERT_FALSE(a.empty());
  const std::string parent = *tree.parent(a);
  const std::string grandparent = tree.ancestors(a)[1];
  // The one a watches on the ring: the next in the layout's order, here linked to it by
  // nothing else.
  const auto& order = tree.members();
  const auto at = std::find(order.begin(), order.end(), a);
  const std::string ring = std::next(at) == order.end() ? order.front() : *std::next(at);
  ASSERT_NE(ring, parent);
  ASSERT_NE(ring, grandparent);
  ASSERT_NE(tree.parent(ring) ? *tree.parent(ring) : "", a);
  TimePoint now = TimePoint{} + 1h;
  Aggregator agent(a, opts(2));
  agent.set_members(names(7), now);
  agent.poll(now);
  DownReport d;
  d.from = parent;
  d.epoch = uint64_t{1} << 16;
  d.covered = tree.coverage();  // a watermark over every member: its drains confirm
  agent.receive(d, now);
  ASSERT_EQ(agent.epoch(), d.epoch);
  ASSERT_TRUE(agent.coverage_current());
  d.epoch = uint64_t{2} << 16;
  d.excluded = {grandparent};
  DownReport sideways = d;  // its answer to a's probe
  sideways.from = ring;
  agent.receive(sideways, now);
  EXPECT_TRUE(agent.excluded().empty());
  EXPECT_EQ(agent.stats().refused_decision, 1u);
  agent.receive(d, now);
  EXPECT_EQ(agent.epoch(), d.epoch);
  EXPECT_EQ(agent.excluded(), std::set<std::string>{grandparent});
  EXPECT_EQ(agent.stats().refused_decision, 1u);
  agent.poll(now);
  EXPECT_FALSE(agent.tree().contains(grandparent));

  // In a cluster: an interior agent (not the root) with grandchildren stops.
  Sim sim(15, opts(2));
  Tree t(sim.members(), 2);
  std::string interior;
  for (const auto& m : t.members())
    if (interior.empty() && t.ancestors(m).size() == 1) interior = m;
  ASSERT_FALSE(interior.empty());
  std::vector<std::string> below;  // its grandchildren: it is their grandparent
  for (const auto& c : t.children(interior))
    for (const auto& g : t.children(c)) below.push_back(g);
  ASSERT_FALSE(below.empty());
  for (const auto& m : sim.members()) sim.set_local(m, 100);
  ASSERT_GE(sim.rounds_until_all(100, 400), 0);
  sim.stop(interior);
  for (const auto& m : sim.members())
    if (m != interior) sim.set_local(m, 200);
  ASSERT_GE(sim.rounds_until_all(200, 400), 0);
  for (const auto& g : below) {
    EXPECT_EQ(sim.at(g).excluded(), std::set<std::string>{interior}) << g;
    EXPECT_TRUE(sim.at(g).coverage_current()) << g;
  }
}

// The one decision cutting its line that an agent takes from others than its parent: the same
// one from two members. A former root stopped while the cluster excluded it has no parent to
// learn it from; the running agents around it all say so. One of them alone is refused.
TEST(Aggregator, ADecisionCuttingTheLineIsTakenFromTwoMembersNotOne) {
  Small s;
  TimePoint now = TimePoint{} + 1h;
  Aggregator root(s.root, opts(2));
  root.set_members(s.members, now);
  root.poll(now);
  UpReport up;
  up.from = s.kids[0];
  up.decision = true;
  up.leaving = true;  // "not your child": its layout has another root
  up.epoch = uint64_t{5} << 16;
  up.excluded = {s.root};
  root.receive(up, now);
  root.receive(up, now);  // the same member again is still one member
  EXPECT_TRUE(root.excluded().empty());
  EXPECT_EQ(root.stats().refused_decision, 2u);
  up.from = s.kids[1];
  root.receive(up, now);
  EXPECT_EQ(root.excluded(), std::set<std::string>{s.root});
  EXPECT_EQ(root.epoch(), up.epoch);
  EXPECT_EQ(root.stats().refused_decision, 2u);
}

// A decision an agent holds that its parent does not take (passed up with every report) for a
// whole silence window is given up for the parent's: the tree's word is the parent's, and one
// held alone would keep the agent's coverage stale for good.
TEST(Aggregator, AnAgentYieldsToItsParentsDecisionAfterAWindow) {
  Tree tree(names(7), 2);
  std::string a;
  for (const auto& m : tree.members())
    if (a.empty() && tree.ancestors(m).size() == 2) a = m;
  ASSERT_FALSE(a.empty());
  const std::string parent = *tree.parent(a);
  std::string other;  // a leaf elsewhere: excluding it cuts nobody's line but its own
  for (const auto& m : tree.members())
    if (m != a && tree.children(m).empty() && *tree.parent(m) != parent) other = m;
  ASSERT_FALSE(other.empty());
  const auto o = opts(2);
  TimePoint now = TimePoint{} + 1h;
  Aggregator agent(a, o);
  agent.set_members(names(7), now);
  agent.poll(now);
  DownReport d;
  d.from = parent;
  d.epoch = uint64_t{1} << 16;
  d.covered = tree.coverage();
  agent.receive(d, now);
  ASSERT_TRUE(agent.coverage_current());
  UpReport up;
  up.from = other;
  up.decision = true;
  up.epoch = uint64_t{2} << 16;
  up.excluded = {other};
  agent.receive(up, now);
  ASSERT_EQ(agent.epoch(), up.epoch);
  EXPECT_FALSE(agent.coverage_current());
  // The parent keeps its own word, every 100 ms: held against it for the window from the
  // parent's first report under the other decision, then given up.
  for (int i = 0; i < 6; ++i) {
    now += 100ms;
    agent.receive(d, now);
    ASSERT_EQ(agent.epoch(), up.epoch) << i;
  }
  now += 100ms;
  agent.receive(d, now);
  EXPECT_EQ(agent.epoch(), d.epoch);
  EXPECT_TRUE(agent.excluded().empty());
  EXPECT_TRUE(agent.coverage_current());
  EXPECT_EQ(agent.stats().yielded, 1u);
}

// An up report whose DNS watermark passes its routing one is no agent's: refused whole.
TEST(Aggregator, RefusesAReportWhoseDnsWatermarkPassesItsWatermark) {
  Small s;
  TimePoint now = TimePoint{} + 1h;
  Aggregator root(s.root, opts(2));
  root.set_members(s.members, now);
  root.set_local(100);
  for (const auto& k : s.kids) {
    UpReport up;
    up.from = k;
    up.watermark = 100;
    up.dns_watermark = k == s.kids[0] ? 500 : 100;
    up.covered.add(k);
    root.receive(up, now);
  }
  root.poll(now);
  EXPECT_EQ(root.stats().malformed, 1u);
  EXPECT_FALSE(root.coverage_current()) << "the malformed report was counted";
}

// A compromised interior agent can lie about its own subtree: it forwards a minimum above what
// its children applied. The root bounds that by asking one agent directly every heartbeat for
// its own watermark; once a sampled agent below the liar is below what the root published, the
// root publishes no more than that agent's own until the tree agrees with it again.
TEST(Aggregator, TheRootsDirectSampleCatchesAnInteriorAgentsLie) {
  Sim sim(15, opts(2));
  Tree tree(sim.members(), 2);
  const std::string root = tree.root();
  // The liar: a child of the root with the largest subtree.
  std::string liar;
  for (const auto& k : tree.children(root))
    if (liar.empty() || tree.subtree(k).count > tree.subtree(liar).count) liar = k;
  ASSERT_GE(tree.subtree(liar).count, 3u);
  std::set<std::string> below;
  for (const auto& m : sim.members())
    for (const auto& a : tree.ancestors(m))
      if (a == liar) below.insert(m);
  for (const auto& m : sim.members()) sim.set_local(m, 300);
  ASSERT_GE(sim.rounds_until_all(300, 200), 0);
  // Below the liar nothing new is applied; everyone else moves on to 400. The liar says its
  // subtree is at 400 too.
  sim.check_safety_each_round(false);
  sim.set_tamper([&](const std::string& from, const std::string& to, Message& m) {
    if (from != liar || to != root) return;
    if (auto* up = std::get_if<UpReport>(&m)) {
      if (!up->probe) up->watermark = up->dns_watermark = 400;
    }
  });
  for (const auto& m : sim.members())
    if (!below.count(m)) sim.set_local(m, 400);
  Aggregator& r = sim.at(root);
  int rounds = 0;
  while (r.stats().sample_below == 0 && rounds < 3000) {
    sim.round();
    ++rounds;
  }
  ASSERT_GE(r.stats().sample_below, 1u)
      << "never sampled below the liar in " << rounds << " rounds";
  // Caught: from now on the root publishes no more than what the sampled agent applied, for as
  // long as the lie goes on.
  for (int i = 0; i < 300; ++i) {
    sim.round();
    ASSERT_LE(r.cluster_watermark(), 300u) << "round " << i;
  }
  auto seen = r.take_anomalies();
  bool named = false;
  for (const auto& a : seen)
    named = named || (std::string(a.kind) == "sample-below" && below.count(a.from));
  EXPECT_TRUE(named);
  // The lie stops and the subtree catches up: the root's samples agree and the ceiling goes.
  sim.set_tamper(nullptr);
  sim.check_safety_each_round(true);
  for (const auto& m : sim.members()) sim.set_local(m, 500);
  EXPECT_GE(sim.rounds_until_all(500, 400), 0);
  std::cout << "caught after " << rounds << " rounds (" << rounds / 20 << " heartbeats), "
            << r.stats().samples << " samples in all\n";
}

}  // namespace
}  // namespace endpointd::drain
