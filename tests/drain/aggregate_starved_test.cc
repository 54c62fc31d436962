// The cluster watermark on a starved machine, simulated: 200 Aggregators on a virtual clock,
// 20 % of them stopped (the root and its children among them), the others paused at random for
// up to a few seconds at a time (as 200 agents sharing two cores are), every message delayed
// (in order per link). A rolling update follows; every change must be confirmed by the cluster
// watermark on the node that drains it within the liveness deadline, never by waiting it out.
#include "drain/aggregate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <set>

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using TimePoint = Aggregator::TimePoint;
using std::chrono::milliseconds;

struct Jitter {
  milliseconds tick{20};
  milliseconds latency_max{50};
  double pause_per_second = 0.05;  // chance an agent is paused, per agent and second
  milliseconds pause_max{3000};
};

class StarvedSim {
 public:
  StarvedSim(size_t n, AggregatorOptions opts, Jitter j, uint32_t seed)
      : j_(j), rng_(seed), paused_until_(n), stopped_(n), local_(n), pending_(n), inbox_(n) {
    for (size_t i = 0; i < n; ++i) {
      members_.push_back("node-" + std::to_string(i));
      index_[members_.back()] = i;
      agents_.emplace_back(members_.back(), opts);
    }
    for (auto& a : agents_) a.set_members(members_, now_);
  }

  Aggregator& at(const std::string& n) { return agents_[index_.at(n)]; }
  const std::vector<std::string>& members() const { return members_; }
  TimePoint now() const { return now_; }
  void stop(const std::string& n) { stopped_[index_.at(n)] = true; }
  // The agent applies `w` when it next runs.
  void apply(const std::string& n, uint64_t w) { pending_[index_.at(n)] = w; }
  uint64_t sent() const { return sent_; }  // messages sent so far

  void step() {
    std::uniform_real_distribution<double> u(0, 1);
    const double p = j_.pause_per_second * std::chrono::duration<double>(j_.tick).count();
    for (size_t i = 0; i < agents_.size(); ++i) {
      if (stopped_[i] || paused_until_[i] > now_ || u(rng_) >= p) continue;
      std::uniform_int_distribution<int64_t> d(100, j_.pause_max.count());
      paused_until_[i] = now_ + milliseconds(d(rng_));
    }
    for (size_t i = 0; i < agents_.size(); ++i) {
      if (stopped_[i]) {
        inbox_[i].clear();
        continue;
      }
      if (paused_until_[i] > now_) continue;
      // What is due, in order of arrival (in order per link: a link's times never go back).
      auto& in = inbox_[i];
      while (!in.empty() && in.begin()->first.first <= now_) {
        auto node = in.extract(in.begin());
        if (!stopped_[node.mapped().first]) agents_[i].receive(node.mapped().second, now_);
      }
      if (pending_[i]) {
        local_[i] = pending_[i];
        agents_[i].set_local(pending_[i]);
        pending_[i] = 0;
      }
      for (auto& s : agents_[i].poll(now_)) {
        size_t to = index_.at(s.to);
        if (stopped_[to]) continue;
        std::uniform_int_distribution<int64_t> d(1, j_.latency_max.count());
        TimePoint t = now_ + milliseconds(d(rng_));
        auto& last = link_last_[{i, to}];
        t = std::max(t, last);
        last = t;
        ++sent_;
        inbox_[to].emplace(std::make_pair(t, seq_++), std::make_pair(i, std::move(s.message)));
      }
      check_safety(agents_[i]);
    }
    now_ += j_.tick;
  }

  // A root never publishes above the local watermark of a member it has not excluded.
  void check_safety(const Aggregator& a) {
    uint64_t& last = published_[a.self()];
    if (!a.is_root() || a.cluster_watermark() == last) return;
    last = a.cluster_watermark();
    uint64_t min = UINT64_MAX;
    for (const auto& m : a.members())
      if (!a.excluded().count(m)) min = std::min(min, local_[index_.at(m)]);
    ASSERT_LE(a.cluster_watermark(), min) << "root " << a.self();
  }

 private:
  Jitter j_;
  std::mt19937 rng_;
  std::vector<std::string> members_;
  std::map<std::string, size_t> index_;
  std::vector<Aggregator> agents_;
  std::vector<TimePoint> paused_until_;
  std::vector<bool> stopped_;
  std::vector<uint64_t> local_, pending_;
  // Per receiver: (due, sequence) -> (sender, message).
  std::vector<std::multimap<std::pair<TimePoint, uint64_t>, std::pair<size_t, Message>>> inbox_;
  std::map<std::pair<size_t, size_t>, TimePoint> link_last_;
  uint64_t seq_ = 0;
  uint64_t sent_ = 0;
  std::map<std::string, uint64_t> published_;
  TimePoint now_ = TimePoint{} + 1h;
};

// The bench's settings at 200 agents: liveness 10 s (heartbeat a third, probe a fifth).
AggregatorOptions bench_options() {
  AggregatorOptions o;
  o.fan_in = 8;
  o.silence = 10000ms;
  o.heartbeat = 3333ms;
  o.probe = 2000ms;
  return o;
}

struct Outcome {
  int confirmed = 0, late = 0;  // late: past the liveness deadline
  milliseconds worst{0};
  uint64_t quiet_messages = 0;  // sent in the 40 s after the stop
  int all_excluded_ms = -1;  // from the stop until every running agent excludes every stopped one
  std::set<std::string> live_excluded;  // running agents some running agent ever excluded
};

// The bench's scenario (bench/drain-scale/run --agents 200 --stop 0.2): 30 s to settle, then
// the root, its children and random others stopped (40 in all), a quiet window of 40 s, then
// 80 changes 500 ms apart, each drained on a random running node.
Outcome rollout_with_a_fifth_stopped(uint32_t seed, Jitter j) {
  const size_t n = 200;
  StarvedSim sim(n, bench_options(), j, seed);
  for (const auto& m : sim.members()) sim.apply(m, 100);
  const int tick = static_cast<int>(Jitter{}.tick.count());
  for (int i = 0; i < 30000 / tick; ++i) sim.step();

  Tree t = sim.at("node-0").tree();
  std::set<std::string> stop{t.root()};
  for (const auto& c : t.children(t.root())) stop.insert(c);
  std::mt19937 rng(seed);
  while (stop.size() < n / 5) stop.insert(sim.members()[rng() % n]);
  for (const auto& s : stop) sim.stop(s);
  std::vector<std::string> live;
  for (const auto& m : sim.members())
    if (!stop.count(m)) live.push_back(m);

  Outcome out;
  int elapsed = 0;
  auto step = [&] {
    sim.step();
    elapsed += tick;
    if (elapsed % 200 != 0) return;
    bool all = true;
    for (const auto& m : live) {
      const auto& ex = sim.at(m).excluded();
      if (ex != stop) all = false;
      for (const auto& e : ex)
        if (!stop.count(e)) out.live_excluded.insert(e);
    }
    if (all && out.all_excluded_ms < 0) out.all_excluded_ms = elapsed;
  };
  uint64_t sent0 = sim.sent();
  for (int i = 0; i < 40000 / tick; ++i) step();
  out.quiet_messages = sim.sent() - sent0;

  struct Drain {
    std::string node;
    uint64_t revision;
    TimePoint at;
    bool done = false;
  };
  std::vector<Drain> drains;
  uint64_t rev = 100;
  const int changes = 80;
  for (int i = 0; i < (changes * 500 + 20000) / tick; ++i) {
    if (i % (500 / tick) == 0 && static_cast<int>(drains.size()) < changes) {
      ++rev;
      for (const auto& m : live) sim.apply(m, rev);
      drains.push_back({live[rng() % live.size()], rev, sim.now()});
    }
    step();
    for (auto& d : drains) {
      if (d.done || sim.at(d.node).cluster_watermark() < d.revision) continue;
      d.done = true;
      auto took = std::chrono::duration_cast<milliseconds>(sim.now() - d.at);
      out.worst = std::max(out.worst, took);
      if (took > bench_options().silence) ++out.late;
      ++out.confirmed;
    }
  }
  return out;
}

// Seeds 1-20 with this code: no running agent ever excluded, no drain past the deadline (worst
// 4.7-8.6 s), every stopped agent excluded 11.4-33.8 s after the stop (22.4-43.6 s without the
// ring: a stopped agent whose tree neighbours were stopped too waited for a round of
// exclusions to get a running parent, one deadline per round). With the code before the
// probe of suspects and the parents asked ahead: a running agent excluded in 14 of 20 (a parent
// only paused when a new child first reported stayed suspected by it for good, was reported
// silent and excluded although it ran, and its readmission set the watermark back to 0),
// drains past the deadline in 8 of 20 (up to 16.5 s; seeds 7 and 11: 13 and 12 of 80), every
// stopped agent excluded after 37.8-58.4 s (a stopped root with stopped children cost one probe
// deadline per stopped agent in the way).
TEST(AggregatorStarved, AFifthStoppedOnlyTheyExcludedEveryDrainWithinTheLivenessDeadline) {
  for (uint32_t seed : {7u, 11u}) {
    Outcome o = rollout_with_a_fifth_stopped(seed, Jitter{});
    EXPECT_EQ(o.confirmed, 80) << "seed " << seed;
    // Within the liveness deadline plus 1 s (issue 14), never by waiting out the peer deadline.
    EXPECT_LE(o.worst, bench_options().silence + 1000ms) << "seed " << seed;
    EXPECT_TRUE(o.live_excluded.empty())
        << "seed " << seed << ": a running agent was excluded, e.g. " << *o.live_excluded.begin();
    // Each stopped agent is watched by its tree neighbours and by the member before it on the
    // ring: found after one deadline (10 s) unless all of those are stopped too, then after the
    // next round.
    EXPECT_GE(o.all_excluded_ms, 0) << "seed " << seed;
    EXPECT_LE(o.all_excluded_ms, 40000) << "seed " << seed;
    std::printf(
        "seed %u: %d confirmed (%d past the deadline), worst %lld ms, every stopped agent excluded "
        "after %d ms, %llu messages in the 40 s after the stop\n",
        seed, o.confirmed, o.late, static_cast<long long>(o.worst.count()), o.all_excluded_ms,
        static_cast<unsigned long long>(o.quiet_messages));
  }
}

}  // namespace
}  // namespace endpointd::drain
