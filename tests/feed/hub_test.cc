// The ack arithmetic: AckTracker and the hub's applied(g), without gRPC.
#include <gtest/gtest.h>

#include <memory>

#include "feed/hub.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

using testing::service;
using testing::snapshot;

TEST(AckTracker, StartsAtTheSnapshotItJoinedAt) {
  auto s1 = snapshot(1, {});
  AckTracker t(s1);
  EXPECT_EQ(t.acked()->generation, 1u);
  EXPECT_TRUE(t.caught_up());
}

TEST(AckTracker, AckMovesToTheSentSnapshotAndIgnoresBogusVersions) {
  AckTracker t(snapshot(1, {}));
  auto s2 = snapshot(2, {});
  t.sent(s2);
  EXPECT_EQ(t.acked()->generation, 1u);
  EXPECT_FALSE(t.ack(7));  // never sent
  EXPECT_EQ(t.acked()->generation, 1u);
  EXPECT_TRUE(t.ack(2));
  EXPECT_EQ(t.acked()->generation, 2u);
  EXPECT_TRUE(t.ack(2));  // a repeated ack is harmless
}

TEST(AckTracker, UnchangedSnapshotsRideOnTheOutstandingResponse) {
  AckTracker t(snapshot(1, {}));
  t.sent(snapshot(2, {}));
  t.unchanged(snapshot(3, {}));          // nothing this client sees changed in 3
  EXPECT_EQ(t.acked()->generation, 1u);  // but 2 is not acknowledged yet
  ASSERT_TRUE(t.ack(2));
  EXPECT_EQ(t.acked()->generation, 3u);
  t.unchanged(snapshot(4, {}));  // caught up: moves at once
  EXPECT_EQ(t.acked()->generation, 4u);
}

TEST(AckTracker, AnAckCoversOlderResponses) {
  AckTracker t(snapshot(1, {}));
  t.sent(snapshot(2, {}));
  t.sent(snapshot(3, {}));
  ASSERT_TRUE(t.ack(3));
  EXPECT_EQ(t.acked()->generation, 3u);
  EXPECT_TRUE(t.caught_up());
  EXPECT_TRUE(t.ack(2));  // late ack of an older one: no move back
  EXPECT_EQ(t.acked()->generation, 3u);
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
