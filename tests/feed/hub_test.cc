// The ack arithmetic: AckTracker and the hub's applied(g), without gRPC.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "feed/hub.h"
#include "feed/metrics.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

using std::chrono::milliseconds;
using testing::service;
using testing::snapshot;

const Clock::time_point kT0 = Clock::time_point() + std::chrono::hours(1);

TEST(AckTracker, StartsAtTheSnapshotItJoinedAt) {
  auto s1 = snapshot(1, {});
  AckTracker t(s1);
  EXPECT_EQ(t.acked()->generation, 1u);
  EXPECT_TRUE(t.caught_up());
}

TEST(AckTracker, AckMovesToTheSentSnapshotAndIgnoresBogusVersions) {
  AckTracker t(snapshot(1, {}));
  auto s2 = snapshot(2, {});
  t.sent(s2, kT0);
  EXPECT_EQ(t.acked()->generation, 1u);
  EXPECT_FALSE(t.ack(7));  // never sent
  EXPECT_EQ(t.acked()->generation, 1u);
  EXPECT_TRUE(t.ack(2));
  EXPECT_EQ(t.acked()->generation, 2u);
  EXPECT_TRUE(t.ack(2));  // a repeated ack is harmless
}

TEST(AckTracker, UnchangedSnapshotsRideOnTheOutstandingResponse) {
  AckTracker t(snapshot(1, {}));
  t.sent(snapshot(2, {}), kT0);
  t.unchanged(snapshot(3, {}));          // nothing this client sees changed in 3
  EXPECT_EQ(t.acked()->generation, 1u);  // but 2 is not acknowledged yet
  ASSERT_TRUE(t.ack(2));
  EXPECT_EQ(t.acked()->generation, 3u);
  t.unchanged(snapshot(4, {}));  // caught up: moves at once
  EXPECT_EQ(t.acked()->generation, 4u);
}

TEST(AckTracker, AnAckCoversOlderResponses) {
  AckTracker t(snapshot(1, {}));
  t.sent(snapshot(2, {}), kT0);
  t.sent(snapshot(3, {}), kT0);
  ASSERT_TRUE(t.ack(3));
  EXPECT_EQ(t.acked()->generation, 3u);
  EXPECT_TRUE(t.caught_up());
  EXPECT_TRUE(t.ack(2));  // late ack of an older one: no move back
  EXPECT_EQ(t.acked()->generation, 3u);
}

TEST(AckTracker, OutstandingSinceIsTheOldestUnacknowledgedSend) {
  AckTracker t(snapshot(1, {}));
  EXPECT_EQ(t.outstanding_since(), std::nullopt);
  t.sent(snapshot(2, {}), kT0);
  t.sent(snapshot(3, {}), kT0 + milliseconds(300));
  EXPECT_EQ(t.outstanding_since(), kT0);
  ASSERT_TRUE(t.ack(2));
  EXPECT_EQ(t.outstanding_since(), kT0 + milliseconds(300));
  ASSERT_TRUE(t.ack(3));
  EXPECT_EQ(t.outstanding_since(), std::nullopt);
}

TEST(AckTracker, AClientThatNeverAcksAgesPastTheResponsesItForgets) {
  AckTracker t(snapshot(1, {}));
  for (uint64_t g = 2; g < 2 + 3 * AckTracker::kMaxInFlight; ++g)
    t.sent(snapshot(g, {}), kT0 + milliseconds(100 * g));
  // The first response was sent at kT0 + 200 ms and nothing was acknowledged since.
  EXPECT_EQ(t.outstanding_since(), kT0 + milliseconds(200));
}

class FakeSubscriber : public Subscriber {
 public:
  explicit FakeSubscriber(model::SnapshotPtr a) : acked_(std::move(a)) {}
  void notify(const model::SnapshotPtr&) override {}
  model::SnapshotPtr acked() const override { return acked_; }
  SubscriberInfo info() const override { return {}; }
  model::SnapshotPtr acked_;
};

TEST(Hub, AppliedIsTheOldestAckAndASubscriberThatLeavesStopsCounting) {
  std::vector<uint64_t> reported;
  Hub hub(10, [&](const model::SnapshotPtr& s) { reported.push_back(s->generation); });
  auto s1 = snapshot(1, {});
  hub.publish(s1);
  EXPECT_EQ(reported, (std::vector<uint64_t>{1}));  // nobody to wait for
  FakeSubscriber a(s1), b(s1);
  ASSERT_TRUE(hub.add(&a));
  ASSERT_TRUE(hub.add(&b));
  auto s2 = snapshot(2, {});
  hub.publish(s2);
  EXPECT_EQ(hub.applied()->generation, 1u);
  a.acked_ = s2;
  hub.acks_changed(&a);
  EXPECT_EQ(hub.applied()->generation, 1u);
  hub.remove(&b);
  EXPECT_EQ(hub.applied()->generation, 2u);
  EXPECT_EQ(reported, (std::vector<uint64_t>{1, 2}));
  hub.remove(&a);
}

TEST(Hub, AppliedFollowsTheOldestOfManySubscribersAsTheyAckOneByOne) {
  Hub hub(100);
  auto s1 = snapshot(1, {});
  hub.publish(s1);
  std::vector<std::unique_ptr<FakeSubscriber>> subs;
  for (int i = 0; i < 50; ++i) {
    subs.push_back(std::make_unique<FakeSubscriber>(s1));
    ASSERT_TRUE(hub.add(subs.back().get()));
  }
  auto s2 = snapshot(2, {}), s3 = snapshot(3, {});
  hub.publish(s2);
  hub.publish(s3);
  // Half move to 3, then the others to 2: applied waits for the last one at 1.
  for (int i = 0; i < 25; ++i) {
    subs[i]->acked_ = s3;
    hub.acks_changed(subs[i].get());
  }
  for (int i = 25; i < 50; ++i) {
    EXPECT_EQ(hub.applied()->generation, 1u) << i;
    subs[i]->acked_ = s2;
    hub.acks_changed(subs[i].get());
  }
  EXPECT_EQ(hub.applied()->generation, 2u);
  // The ones at 2 leave or catch up: 3.
  for (int i = 25; i < 40; ++i) hub.remove(subs[i].get());
  EXPECT_EQ(hub.applied()->generation, 2u);
  for (int i = 40; i < 50; ++i) {
    subs[i]->acked_ = s3;
    hub.acks_changed(subs[i].get());
  }
  EXPECT_EQ(hub.applied()->generation, 3u);
  // An ack from a stranger (never added, or gone) counts for nothing.
  FakeSubscriber stranger(s1);
  hub.acks_changed(&stranger);
  hub.acks_changed(subs[30].get());
  EXPECT_EQ(hub.applied()->generation, 3u);
  EXPECT_EQ(hub.subscribers(), 35u);
  for (int i = 0; i < 25; ++i) hub.remove(subs[i].get());
  for (int i = 40; i < 50; ++i) hub.remove(subs[i].get());
  EXPECT_EQ(hub.subscribers(), 0u);
}

// A subscriber over a real AckTracker, driven by the test as its stream would be.
class TrackedSubscriber : public Subscriber {
 public:
  TrackedSubscriber(model::SnapshotPtr joined, uint64_t id) : tracker(std::move(joined)), id(id) {}
  void notify(const model::SnapshotPtr&) override {}
  model::SnapshotPtr acked() const override { return tracker.acked(); }
  std::optional<Clock::time_point> outstanding_since() const override {
    return tracker.outstanding_since();
  }
  SubscriberInfo info() const override {
    SubscriberInfo i;
    i.id = id;
    i.api = "watch";
    i.client = "test-" + std::to_string(id);
    return i;
  }
  AckTracker tracker;
  uint64_t id;
};

// A hub on a clock the test moves, with stale_after 5 s.
struct StaleHub {
  StaleHub(milliseconds stale_after = milliseconds(5000)) : metrics(nullptr) {
    HubOptions o;
    o.max_subscribers = 100;
    o.stale_after = stale_after;
    o.clock = [this] { return now; };
    o.metrics = &metrics;
    hub = std::make_unique<Hub>(
        o, [this](const model::SnapshotPtr& s) { reported.push_back(s->generation); });
  }
  // Publishes `snap` and sends it to each of `subs` (as their streams would) at `now`.
  void publish_to(const model::SnapshotPtr& snap, std::vector<TrackedSubscriber*> subs) {
    for (auto* s : subs) s->tracker.sent(snap, now);
    hub->publish(snap);
  }
  void ack(TrackedSubscriber& s, uint64_t version) {
    ASSERT_TRUE(s.tracker.ack(version));
    hub->acks_changed(&s);
  }
  bool stale(uint64_t id) {
    for (const auto& i : hub->infos())
      if (i.id == id) return i.stale;
    ADD_FAILURE() << "no subscriber " << id;
    return false;
  }
  uint64_t applied() { return hub->applied()->generation; }

  Clock::time_point now = kT0;
  Metrics metrics;
  std::vector<uint64_t> reported;
  std::unique_ptr<Hub> hub;
};

TEST(HubStale, ASubscriberThatNeverAcksIsExcludedAfterTheBoundAndCountsAgainOnceCaughtUp) {
  StaleHub h;
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber silent(s1, 1), good(s1, 2);
  ASSERT_TRUE(h.hub->add(&silent));
  ASSERT_TRUE(h.hub->add(&good));

  auto s2 = snapshot(2, {});
  h.publish_to(s2, {&silent, &good});
  h.now += milliseconds(20);
  h.ack(good, 2);
  EXPECT_EQ(h.applied(), 1u);  // the silent one holds it

  // Just short of the bound: still waited for; the check says when to look again.
  h.now = kT0 + milliseconds(4999);
  EXPECT_EQ(h.hub->check_stale(), kT0 + milliseconds(5000));
  EXPECT_EQ(h.applied(), 1u);
  EXPECT_EQ(h.metrics.stale_total(), 0u);
  EXPECT_FALSE(h.stale(1));

  // At the bound: stale, and applied(g) moves past it without any ack or snapshot.
  h.now = kT0 + milliseconds(5000);
  EXPECT_EQ(h.hub->check_stale(), std::nullopt);  // nobody else is waiting
  EXPECT_EQ(h.applied(), 2u);
  EXPECT_EQ(h.reported, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(h.metrics.stale_total(), 1u);
  EXPECT_EQ(h.metrics.stale_now(), 1);
  EXPECT_EQ(h.hub->stale_subscribers(), 1u);
  EXPECT_TRUE(h.stale(1));
  EXPECT_FALSE(h.stale(2));
  // Checking again changes nothing and counts nothing.
  h.hub->check_stale();
  EXPECT_EQ(h.metrics.stale_total(), 1u);

  // While stale it still gets updates; the others alone decide applied(g).
  auto s3 = snapshot(3, {});
  h.publish_to(s3, {&silent, &good});
  EXPECT_EQ(h.applied(), 2u);
  h.ack(good, 3);
  EXPECT_EQ(h.applied(), 3u);
  h.now = kT0 + milliseconds(6000);
  auto s4 = snapshot(4, {});
  h.publish_to(s4, {&silent, &good});
  h.ack(good, 4);
  EXPECT_EQ(h.applied(), 4u);

  // An ack that leaves a response outstanding for longer than the bound is no catching up.
  h.now = kT0 + milliseconds(11500);
  h.ack(silent, 3);
  EXPECT_TRUE(h.stale(1));
  // Acknowledging the newest version it was sent brings it back.
  h.ack(silent, 4);
  EXPECT_FALSE(h.stale(1));
  EXPECT_EQ(h.metrics.stale_now(), 0);
  EXPECT_EQ(h.metrics.stale_total(), 1u);
  EXPECT_EQ(h.hub->stale_subscribers(), 0u);

  // And it counts again: the next snapshot waits for it.
  auto s5 = snapshot(5, {});
  h.publish_to(s5, {&silent, &good});
  h.ack(good, 5);
  EXPECT_EQ(h.applied(), 4u);
  h.now += milliseconds(4000);
  h.hub->check_stale();
  EXPECT_EQ(h.applied(), 4u);
  h.ack(silent, 5);
  EXPECT_EQ(h.applied(), 5u);
  EXPECT_EQ(h.metrics.stale_total(), 1u);
  EXPECT_EQ(h.reported, (std::vector<uint64_t>{1, 2, 3, 4, 5}));

  h.hub->remove(&silent);
  h.hub->remove(&good);
}

TEST(HubStale, ASlowAckWithinTheBoundIsNeverStale) {
  StaleHub h;
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber slow(s1, 1);
  ASSERT_TRUE(h.hub->add(&slow));
  // A snapshot every 3 s, each acknowledged 4.9 s after it was sent, so the next one is
  // always on its way already: something is always outstanding, but never for 5 s.
  auto s2 = snapshot(2, {});
  h.publish_to(s2, {&slow});
  for (uint64_t g = 3; g < 30; ++g) {
    h.now += milliseconds(g == 3 ? 3000 : 1100);
    h.publish_to(snapshot(g, {}), {&slow});
    h.hub->check_stale();
    h.now += milliseconds(1900);
    h.hub->check_stale();
    EXPECT_EQ(h.applied(), g - 2);
    h.ack(slow, g - 1);
    EXPECT_EQ(h.applied(), g - 1);
    ASSERT_FALSE(h.stale(1)) << g;
  }
  EXPECT_EQ(h.metrics.stale_total(), 0u);
  h.hub->remove(&slow);
}

TEST(HubStale, AStaleSubscriberThatLeavesIsNoLongerCountedAsStale) {
  StaleHub h;
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber silent(s1, 1);
  ASSERT_TRUE(h.hub->add(&silent));
  h.publish_to(snapshot(2, {}), {&silent});
  h.now += milliseconds(6000);
  h.hub->check_stale();
  EXPECT_EQ(h.applied(), 2u);
  EXPECT_EQ(h.metrics.stale_now(), 1);
  h.hub->remove(&silent);
  EXPECT_EQ(h.metrics.stale_now(), 0);
  EXPECT_EQ(h.hub->stale_subscribers(), 0u);
  EXPECT_EQ(h.metrics.stale_total(), 1u);
}

TEST(HubStale, ZeroMeansNeverStale) {
  StaleHub h(milliseconds(0));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber silent(s1, 1);
  ASSERT_TRUE(h.hub->add(&silent));
  h.publish_to(snapshot(2, {}), {&silent});
  h.now += std::chrono::hours(1);
  EXPECT_EQ(h.hub->check_stale(), std::nullopt);
  EXPECT_EQ(h.applied(), 1u);
  EXPECT_EQ(h.metrics.stale_total(), 0u);
  h.hub->remove(&silent);
}

TEST(Hub, RefusesSubscribersBeyondTheLimit) {
  Hub hub(1);
  FakeSubscriber a(nullptr), b(nullptr);
  EXPECT_TRUE(hub.add(&a));
  EXPECT_FALSE(hub.add(&b));
  hub.remove(&a);
  EXPECT_TRUE(hub.add(&b));
  hub.remove(&b);
}

TEST(Hub, UnsyncedSnapshotsAreNotServed) {
  Hub hub(1);
  auto s = std::make_shared<model::Snapshot>();
  s->generation = 3;
  hub.publish(s);
  EXPECT_EQ(hub.current(), nullptr);
}

}  // namespace
}  // namespace endpointd::feed
