// The ack arithmetic: AckTracker and the hub's applied(g), without gRPC.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

TEST(AckTracker, AnAckOfAVersionNeverSentIsRefusedAndMovesNothing) {
  AckTracker t(snapshot(1, {}));
  EXPECT_FALSE(t.ack(1));  // nothing was sent on this stream
  t.sent(snapshot(2, {}), kT0);
  t.sent(snapshot(4, {}), kT0);  // 3 was coalesced away: never sent
  EXPECT_FALSE(t.ack(3));
  EXPECT_FALSE(t.ack(5));
  EXPECT_FALSE(t.ack(0));
  EXPECT_EQ(t.acked()->generation, 1u);
  EXPECT_FALSE(t.caught_up());
  ASSERT_TRUE(t.ack(4));
  EXPECT_EQ(t.acked()->generation, 4u);
  EXPECT_TRUE(t.ack(2));   // late, of a version sent: harmless
  EXPECT_FALSE(t.ack(3));  // still never sent
  EXPECT_EQ(t.acked()->generation, 4u);
}

TEST(AckTracker, TheAckOfAVersionSentTwiceCoversBoth) {
  AckTracker t(snapshot(1, {}));
  auto s2 = snapshot(2, {});
  t.sent(s2, kT0);
  t.sent(s2, kT0 + milliseconds(10));  // an xDS subscription change resends version 2
  ASSERT_TRUE(t.ack(2));
  EXPECT_TRUE(t.caught_up());
  EXPECT_EQ(t.outstanding_since(), std::nullopt);
}

TEST(AckTracker, AResumedClientRoutesByItsOldStateUntilItAcksHere) {
  auto s1 = snapshot(1, {}), s3 = snapshot(3, {});
  AckTracker t(s3);  // joined at 3
  ASSERT_TRUE(t.resume(s1, kT0));
  EXPECT_EQ(t.acked()->generation, 1u);
  EXPECT_FALSE(t.caught_up());
  EXPECT_EQ(t.outstanding_since(), kT0);
  t.unchanged(snapshot(4, {}));  // nothing sent: it still routes by 1
  EXPECT_EQ(t.acked()->generation, 1u);
  t.sent(snapshot(4, {}), kT0 + milliseconds(100));
  EXPECT_EQ(t.outstanding_since(), kT0);  // waited on since the resumption's start
  ASSERT_TRUE(t.ack(4));
  EXPECT_EQ(t.acked()->generation, 4u);
  EXPECT_TRUE(t.caught_up());
  // Acknowledged here: an older state is no longer what it routes by.
  EXPECT_FALSE(t.resume(s1, kT0));
  EXPECT_EQ(t.acked()->generation, 4u);
}

TEST(AckTracker, AClientResumedFromNothingHasNothingAckedUntilItAcksHere) {
  auto s1 = snapshot(1, {}), s2 = snapshot(2, {}), s3 = snapshot(3, {});
  AckTracker t(s2);
  ASSERT_TRUE(t.resume(nullptr, kT0));
  EXPECT_EQ(t.acked(), nullptr);
  EXPECT_FALSE(t.caught_up());
  EXPECT_EQ(t.outstanding_since(), kT0);
  t.unchanged(s3);
  EXPECT_EQ(t.acked(), nullptr);
  // An earlier stream's state does not bring it back from nothing either.
  ASSERT_TRUE(t.resume(s1, kT0 + milliseconds(5)));
  EXPECT_EQ(t.acked(), nullptr);
  t.sent(s3, kT0 + milliseconds(10));
  EXPECT_EQ(t.acked(), nullptr);
  ASSERT_TRUE(t.ack(3));
  EXPECT_EQ(t.acked(), s3);
  EXPECT_TRUE(t.caught_up());
  EXPECT_FALSE(t.resume(nullptr, kT0));  // acknowledged here: newer than anything before
  EXPECT_EQ(t.acked(), s3);
}

TEST(AckTracker, NackingLastsUntilAnAck) {
  AckTracker t(snapshot(1, {}));
  t.sent(snapshot(2, {}), kT0);
  EXPECT_FALSE(t.nacking());
  t.nacked();
  EXPECT_TRUE(t.nacking());
  EXPECT_FALSE(t.ack(7));
  EXPECT_TRUE(t.nacking());
  t.sent(snapshot(3, {}), kT0);
  ASSERT_TRUE(t.ack(3));
  EXPECT_FALSE(t.nacking());
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
  bool resume(const model::SnapshotPtr&, Clock::time_point) override { return false; }
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

// A subscriber over a real AckTracker, driven by the test as its stream would be. `client` is
// what its info() says; the hub learns it as an identity only through Hub::identify.
class TrackedSubscriber : public Subscriber {
 public:
  TrackedSubscriber(model::SnapshotPtr joined, uint64_t id, std::string client = "")
      : tracker(std::move(joined)), id(id), client(std::move(client)) {}
  void notify(const model::SnapshotPtr&) override {}
  model::SnapshotPtr acked() const override { return tracker.acked(); }
  std::optional<Clock::time_point> outstanding_since() const override {
    return tracker.outstanding_since();
  }
  bool nacking() const override { return tracker.nacking(); }
  bool resume(const model::SnapshotPtr& last, Clock::time_point since) override {
    return tracker.resume(last, since);
  }
  SubscriberInfo info() const override {
    SubscriberInfo i;
    i.id = id;
    i.api = "watch";
    i.peer = "ipv4:127.0.0.1:" + std::to_string(40000 + id);
    i.client = client.empty() ? "test-" + std::to_string(id) : client;
    i.acked_generation = tracker.acked() ? tracker.acked()->generation : 0;
    return i;
  }
  AckTracker tracker;
  uint64_t id;
  std::string client;
};

// A hub on a clock the test moves, with a grace of 5 s, its applied(g) and holdouts on a real
// acknowledgement board as the feed sink puts them there.
struct StaleHub {
  StaleHub(milliseconds grace = milliseconds(5000), std::string state_file = "")
      : metrics(nullptr) {
    board.add("feed", model::RouteView::kFeed);
    HubOptions o;
    o.max_subscribers = 100;
    o.grace = grace;
    o.state_file = std::move(state_file);
    o.clock = [this] { return now; };
    o.metrics = &metrics;
    o.holdouts = [this](std::vector<Holdout> h) { board.set_holdouts("feed", std::move(h)); };
    hub = std::make_unique<Hub>(o, [this](const model::SnapshotPtr& s) {
      reported.push_back(s->generation);
      board.applied("feed", s);
    });
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
  // Whether the stream `id` no longer holds applied(g).
  bool stale(uint64_t id) {
    for (const auto& i : hub->infos())
      if (i.id == id && i.connected) return !i.holding;
    ADD_FAILURE() << "no subscriber " << id;
    return false;
  }
  uint64_t applied() { return hub->applied()->generation; }
  pipeline::AckBoard::Entry feed_entry() {
    for (auto& e : board.entries())
      if (e.consumer == "feed") return e;
    ADD_FAILURE() << "no feed entry on the board";
    return {};
  }
  std::vector<Holdout> board_holdouts() { return feed_entry().holdouts; }
  // The ghost row of `client` in infos(); nullopt when there is none.
  std::optional<SubscriberInfo> ghost(const std::string& client) {
    for (const auto& i : hub->infos())
      if (!i.connected && i.client == client) return i;
    return std::nullopt;
  }

  Clock::time_point now = kT0;
  Metrics metrics;
  pipeline::AckBoard board;
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
  EXPECT_EQ(h.hub->check_graces(), kT0 + milliseconds(5000));
  EXPECT_EQ(h.applied(), 1u);
  EXPECT_EQ(h.metrics.stale_total(), 0u);
  EXPECT_FALSE(h.stale(1));

  // At the bound: stale, and applied(g) moves past it without any ack or snapshot.
  h.now = kT0 + milliseconds(5000);
  EXPECT_EQ(h.hub->check_graces(), std::nullopt);  // nobody else is waiting
  EXPECT_EQ(h.applied(), 2u);
  EXPECT_EQ(h.reported, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(h.metrics.stale_total(), 1u);
  EXPECT_EQ(h.metrics.stale_now(), 1);
  EXPECT_EQ(h.hub->lapsed_streams(), 1u);
  EXPECT_TRUE(h.stale(1));
  EXPECT_FALSE(h.stale(2));
  // A holdout on the board, named by its stream as it gave no name, at what it acknowledged.
  auto held = h.board_holdouts();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].client, "stream 1 ipv4:127.0.0.1:40001");
  EXPECT_EQ(held[0].snapshot->generation, 1u);
  EXPECT_EQ(held[0].reason, "unacknowledged");
  EXPECT_EQ(held[0].since, kT0 + milliseconds(5000));
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kUnacknowledged), 1u);
  EXPECT_EQ(h.metrics.holdouts_now(), 1);
  // Checking again changes nothing and counts nothing.
  h.hub->check_graces();
  EXPECT_EQ(h.metrics.stale_total(), 1u);
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kUnacknowledged), 1u);

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

  // An ack that leaves a response outstanding for longer than the bound is no catching up;
  // its holdout follows what it acknowledged.
  h.now = kT0 + milliseconds(11500);
  h.ack(silent, 3);
  EXPECT_TRUE(h.stale(1));
  held = h.board_holdouts();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].snapshot->generation, 3u);
  // Acknowledging the newest version it was sent brings it back, and off the board.
  h.ack(silent, 4);
  EXPECT_FALSE(h.stale(1));
  EXPECT_EQ(h.metrics.stale_now(), 0);
  EXPECT_EQ(h.metrics.stale_total(), 1u);
  EXPECT_EQ(h.hub->lapsed_streams(), 0u);
  EXPECT_TRUE(h.board_holdouts().empty());
  EXPECT_EQ(h.metrics.holdouts_now(), 0);

  // And it counts again: the next snapshot waits for it.
  auto s5 = snapshot(5, {});
  h.publish_to(s5, {&silent, &good});
  h.ack(good, 5);
  EXPECT_EQ(h.applied(), 4u);
  h.now += milliseconds(4000);
  h.hub->check_graces();
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
    h.hub->check_graces();
    h.now += milliseconds(1900);
    h.hub->check_graces();
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
  h.hub->check_graces();
  EXPECT_EQ(h.applied(), 2u);
  EXPECT_EQ(h.metrics.stale_now(), 1);
  EXPECT_EQ(h.board_holdouts().size(), 1u);
  h.hub->remove(&silent);
  EXPECT_EQ(h.metrics.stale_now(), 0);
  EXPECT_EQ(h.hub->lapsed_streams(), 0u);
  EXPECT_EQ(h.metrics.stale_total(), 1u);
  // Without a name it can never be recognised again: no ghost, and no holdout (as before
  // ghosts existed).
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_TRUE(h.board_holdouts().empty());
}

TEST(HubStale, ZeroMeansNeverStale) {
  StaleHub h(milliseconds(0));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber silent(s1, 1);
  ASSERT_TRUE(h.hub->add(&silent));
  h.publish_to(snapshot(2, {}), {&silent});
  h.now += std::chrono::hours(1);
  EXPECT_EQ(h.hub->check_graces(), std::nullopt);
  EXPECT_EQ(h.applied(), 1u);
  EXPECT_EQ(h.metrics.stale_total(), 0u);
  h.hub->remove(&silent);
}

// Subscribers are identities: the ghost a named stream leaves when it goes away.

TEST(HubGhost, ANamedSubscriberThatLeavesBeforeAckingHoldsUntilItComesBackAndAcks) {
  StaleHub h(milliseconds(10000));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber envoy(s1, 1, "envoy-a"), good(s1, 2);
  ASSERT_TRUE(h.hub->add(&envoy));
  h.hub->identify(&envoy, "envoy-a");
  ASSERT_TRUE(h.hub->add(&good));

  // The removal is sent; envoy goes away before acknowledging it.
  auto s2 = snapshot(2, {});
  h.publish_to(s2, {&envoy, &good});
  h.ack(good, 2);
  h.now += milliseconds(500);
  h.hub->remove(&envoy);
  EXPECT_EQ(h.applied(), 1u);  // a stream without a name would have stopped holding here
  EXPECT_EQ(h.hub->subscribers(), 1u);
  EXPECT_EQ(h.hub->ghosts(), 1u);
  EXPECT_EQ(h.metrics.ghosts_holding_now(), 1);
  auto row = h.ghost("envoy-a");
  ASSERT_TRUE(row);
  EXPECT_TRUE(row->holding);
  EXPECT_EQ(row->acked_generation, 1u);
  EXPECT_EQ(row->id, 1u);
  EXPECT_TRUE(h.board_holdouts().empty());  // it holds: no holdout

  // Changes go on meanwhile; the ghost still holds.
  auto s3 = snapshot(3, {});
  h.publish_to(s3, {&good});
  h.ack(good, 3);
  EXPECT_EQ(h.applied(), 1u);
  h.now += milliseconds(2000);
  EXPECT_EQ(h.hub->check_graces(), kT0 + milliseconds(10000));  // its grace from the send
  EXPECT_EQ(h.applied(), 1u);

  // It reconnects: the new stream joins at the current snapshot, and once it names itself it
  // starts from what the ghost held.
  TrackedSubscriber back(h.hub->current(), 3, "envoy-a");
  ASSERT_TRUE(h.hub->add(&back));
  EXPECT_EQ(h.applied(), 1u);
  h.hub->identify(&back, "envoy-a");
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_EQ(h.metrics.ghosts_holding_now(), 0);
  EXPECT_EQ(back.acked()->generation, 1u);
  EXPECT_FALSE(h.ghost("envoy-a"));
  // A snapshot that changes nothing it sees does not move it: it acknowledged nothing yet.
  back.tracker.unchanged(s3);
  h.hub->acks_changed(&back);
  EXPECT_EQ(h.applied(), 1u);
  // Sent the current state: held until it acknowledges it.
  back.tracker.sent(s3, h.now);
  h.hub->acks_changed(&back);
  EXPECT_EQ(h.applied(), 1u);
  h.ack(back, 3);
  EXPECT_EQ(h.applied(), 3u);
  EXPECT_EQ(h.reported, (std::vector<uint64_t>{1, 3}));
  EXPECT_TRUE(h.board_holdouts().empty());
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kDisconnected), 0u);
  h.hub->remove(&back);
  h.hub->remove(&good);
}

TEST(HubGhost, AProxyThatReconnectsBeforeItsOldStreamEndsIsHeldAtWhatTheOldOneAcked) {
  StaleHub h(milliseconds(10000));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber old_stream(s1, 1, "envoy-a");
  ASSERT_TRUE(h.hub->add(&old_stream));
  h.hub->identify(&old_stream, "envoy-a");
  auto s2 = snapshot(2, {});
  h.publish_to(s2, {&old_stream});

  // Envoy opened a new stream while the old one lingers (its end not yet noticed).
  TrackedSubscriber fresh(h.hub->current(), 2, "envoy-a");
  ASSERT_TRUE(h.hub->add(&fresh));
  h.hub->identify(&fresh, "envoy-a");  // no ghost: the old stream is still there
  EXPECT_EQ(fresh.acked()->generation, 2u);
  fresh.tracker.sent(s2, h.now);
  EXPECT_EQ(h.applied(), 1u);  // held by the old stream

  // The old stream ends: the new one routes by what the old one acknowledged until it acks.
  h.hub->remove(&old_stream);
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_EQ(fresh.acked()->generation, 1u);
  EXPECT_EQ(h.applied(), 1u);
  h.ack(fresh, 2);
  EXPECT_EQ(h.applied(), 2u);

  // Had the new stream acknowledged first, the old one's state would be superseded.
  auto s3 = snapshot(3, {});
  h.publish_to(s3, {&fresh});
  TrackedSubscriber third(h.hub->current(), 3, "envoy-a");
  ASSERT_TRUE(h.hub->add(&third));
  h.hub->identify(&third, "envoy-a");
  third.tracker.sent(s3, h.now);
  h.ack(third, 3);
  h.hub->remove(&fresh);  // it never acknowledged 3
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_EQ(h.applied(), 3u);
  h.hub->remove(&third);
}

TEST(HubGhost, AGhostPastItsGraceIsAHoldoutOnTheBoardUntilItComesBackCaughtUp) {
  StaleHub h(milliseconds(10000));
  // Every state the board went through: (feed's generation, its holdouts).
  std::vector<std::pair<uint64_t, size_t>> seen;
  h.board.on_change([&] {
    auto e = h.feed_entry();
    seen.emplace_back(e.generation(), e.holdouts.size());
  });
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber envoy(s1, 1, "envoy-a"), good(s1, 2);
  ASSERT_TRUE(h.hub->add(&envoy));
  h.hub->identify(&envoy, "envoy-a");
  ASSERT_TRUE(h.hub->add(&good));
  auto s2 = snapshot(2, {});
  h.publish_to(s2, {&envoy, &good});  // at kT0
  h.ack(good, 2);
  h.now = kT0 + milliseconds(1000);
  h.hub->remove(&envoy);

  // The grace runs from the send it never acknowledged.
  h.now = kT0 + milliseconds(9999);
  EXPECT_EQ(h.hub->check_graces(), kT0 + milliseconds(10000));
  EXPECT_EQ(h.applied(), 1u);
  EXPECT_TRUE(h.board_holdouts().empty());

  h.now = kT0 + milliseconds(10000);
  // Next: when its holdout is to be forgotten.
  EXPECT_EQ(h.hub->check_graces(), kT0 + milliseconds(10000) + kForgetAfter);
  EXPECT_EQ(h.applied(), 2u);
  EXPECT_EQ(h.feed_entry().generation(), 2u);
  auto held = h.board_holdouts();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].client, "envoy-a");
  EXPECT_EQ(held[0].snapshot->generation, 1u);
  EXPECT_EQ(held[0].since, kT0 + milliseconds(10000));
  EXPECT_EQ(held[0].reason, "disconnected");
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kDisconnected), 1u);
  EXPECT_EQ(h.metrics.ghosts_holding_now(), 0);
  EXPECT_EQ(h.metrics.holdouts_now(), 1);
  auto row = h.ghost("envoy-a");
  ASSERT_TRUE(row);
  EXPECT_FALSE(row->holding);
  EXPECT_EQ(row->lapsed, "disconnected");
  // The holdout reached the board before the generation it let through.
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), std::make_pair(uint64_t{2}, size_t{1}));
  for (const auto& [g, n] : seen) EXPECT_TRUE(g < 2 || n == 1) << g << " " << n;

  // It comes back: lapsed still (a holdout under its name) until it acknowledges.
  h.now += milliseconds(3000);
  TrackedSubscriber back(h.hub->current(), 3, "envoy-a");
  ASSERT_TRUE(h.hub->add(&back));
  h.hub->identify(&back, "envoy-a");
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_TRUE(h.stale(3));
  held = h.board_holdouts();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].client, "envoy-a");
  EXPECT_EQ(held[0].snapshot->generation, 1u);
  EXPECT_EQ(held[0].reason, "disconnected");
  EXPECT_EQ(h.applied(), 2u);                                            // never back
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kDisconnected), 1u);  // no new lapse
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kUnacknowledged), 0u);
  back.tracker.sent(s2, h.now);
  h.ack(back, 2);
  EXPECT_FALSE(h.stale(3));
  EXPECT_TRUE(h.board_holdouts().empty());
  EXPECT_EQ(h.metrics.holdouts_now(), 0);

  // And it holds again.
  auto s3 = snapshot(3, {});
  h.publish_to(s3, {&back, &good});
  h.ack(good, 3);
  EXPECT_EQ(h.applied(), 2u);
  h.ack(back, 3);
  EXPECT_EQ(h.applied(), 3u);
  h.hub->remove(&back);
  h.hub->remove(&good);
}

TEST(HubGhost, ALapsedGhostIsForgottenTenMinutesLater) {
  StaleHub h(milliseconds(10000));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber envoy(s1, 1, "envoy-a");
  ASSERT_TRUE(h.hub->add(&envoy));
  h.hub->identify(&envoy, "envoy-a");
  h.publish_to(snapshot(2, {}), {&envoy});
  h.hub->remove(&envoy);
  h.now += milliseconds(10000);
  h.hub->check_graces();
  ASSERT_EQ(h.board_holdouts().size(), 1u);
  const Clock::time_point lapsed = h.now;

  h.now = lapsed + kForgetAfter - milliseconds(1);
  EXPECT_EQ(h.hub->check_graces(), lapsed + kForgetAfter);
  EXPECT_EQ(h.board_holdouts().size(), 1u);
  h.now = lapsed + kForgetAfter;
  EXPECT_EQ(h.hub->check_graces(), std::nullopt);
  EXPECT_TRUE(h.board_holdouts().empty());
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_FALSE(h.ghost("envoy-a"));
  EXPECT_EQ(h.metrics.forgotten_total(Metrics::Forget::kExpired), 1u);
  EXPECT_EQ(h.metrics.holdouts_now(), 0);

  // The name is new again: it starts at the current snapshot.
  TrackedSubscriber back(h.hub->current(), 2, "envoy-a");
  ASSERT_TRUE(h.hub->add(&back));
  h.hub->identify(&back, "envoy-a");
  EXPECT_EQ(back.acked()->generation, 2u);
  h.hub->remove(&back);
}

TEST(HubGhost, GhostsAreBoundedAndTheOneGoneLongestIsForgottenFirst) {
  StaleHub h(milliseconds(10000));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);  // not a line per ghost
  for (size_t i = 0; i <= kMaxGhosts; ++i) {
    const std::string name = "proxy-" + std::to_string(i);
    TrackedSubscriber s(s1, i + 1, name);
    ASSERT_TRUE(h.hub->add(&s));
    h.hub->identify(&s, name);
    h.now += milliseconds(1);
    h.hub->remove(&s);
  }
  spdlog::set_level(level);
  EXPECT_EQ(h.hub->ghosts(), kMaxGhosts);
  EXPECT_EQ(h.metrics.forgotten_total(Metrics::Forget::kLimit), 1u);
  EXPECT_FALSE(h.ghost("proxy-0"));
  EXPECT_TRUE(h.ghost("proxy-1"));
  EXPECT_TRUE(h.ghost("proxy-" + std::to_string(kMaxGhosts)));
  EXPECT_EQ(h.metrics.ghosts_holding_now(), static_cast<int64_t>(kMaxGhosts));
}

TEST(HubGhost, ANackingSubscriberHoldsUntilItsGraceThenIsAHoldoutNacking) {
  StaleHub h(milliseconds(10000));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber envoy(s1, 1, "envoy-n"), good(s1, 2);
  ASSERT_TRUE(h.hub->add(&envoy));
  h.hub->identify(&envoy, "envoy-n");
  ASSERT_TRUE(h.hub->add(&good));
  auto s2 = snapshot(2, {});
  h.publish_to(s2, {&envoy, &good});
  h.ack(good, 2);
  h.now += milliseconds(30);
  envoy.tracker.nacked();  // it rejects version 2 and keeps routing by 1

  h.now = kT0 + milliseconds(9999);
  h.hub->check_graces();
  EXPECT_EQ(h.applied(), 1u);
  EXPECT_FALSE(h.stale(1));
  EXPECT_TRUE(h.board_holdouts().empty());

  h.now = kT0 + milliseconds(10000);
  h.hub->check_graces();
  EXPECT_EQ(h.applied(), 2u);
  EXPECT_TRUE(h.stale(1));
  auto held = h.board_holdouts();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].client, "envoy-n");
  EXPECT_EQ(held[0].snapshot->generation, 1u);
  EXPECT_EQ(held[0].reason, "nacking");
  EXPECT_EQ(held[0].since, kT0 + milliseconds(10000));
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kNacking), 1u);
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kUnacknowledged), 0u);
  for (const auto& i : h.hub->infos()) {
    if (i.id == 1) {
      EXPECT_EQ(i.lapsed, "nacking");
    }
  }

  // A version it accepts brings it back.
  auto s3 = snapshot(3, {});
  h.publish_to(s3, {&envoy, &good});
  h.ack(envoy, 3);
  EXPECT_FALSE(h.stale(1));
  EXPECT_FALSE(envoy.tracker.nacking());
  EXPECT_TRUE(h.board_holdouts().empty());
  h.hub->remove(&envoy);
  h.hub->remove(&good);
}

TEST(HubGhost, GraceZeroKeepsNoGhostsAndNoHoldouts) {
  StaleHub h(milliseconds(0));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber envoy(s1, 1, "envoy-a");
  ASSERT_TRUE(h.hub->add(&envoy));
  h.hub->identify(&envoy, "envoy-a");
  h.publish_to(snapshot(2, {}), {&envoy});
  envoy.tracker.nacked();
  h.now += std::chrono::hours(1);
  EXPECT_EQ(h.hub->check_graces(), std::nullopt);
  EXPECT_EQ(h.applied(), 1u);  // held while connected, however long
  h.hub->remove(&envoy);
  EXPECT_EQ(h.applied(), 2u);  // and not a moment after
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_TRUE(h.board_holdouts().empty());
  EXPECT_EQ(h.reported, (std::vector<uint64_t>{1, 2}));

  TrackedSubscriber back(h.hub->current(), 2, "envoy-a");
  ASSERT_TRUE(h.hub->add(&back));
  h.hub->identify(&back, "envoy-a");
  EXPECT_EQ(back.acked()->generation, 2u);
  h.hub->remove(&back);
}

TEST(HubGhost, AnAnonymousStreamHoldsOnlyWhileConnected) {
  StaleHub h(milliseconds(10000));
  auto s1 = snapshot(1, {});
  h.hub->publish(s1);
  TrackedSubscriber anon(s1, 1);
  ASSERT_TRUE(h.hub->add(&anon));
  h.hub->identify(&anon, "");  // an empty name is none
  h.publish_to(snapshot(2, {}), {&anon});
  EXPECT_EQ(h.applied(), 1u);
  h.hub->remove(&anon);
  EXPECT_EQ(h.applied(), 2u);
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_TRUE(h.board_holdouts().empty());

  // A name longer than kMaxIdentityBytes is none either.
  TrackedSubscriber long_name(h.hub->current(), 2);
  ASSERT_TRUE(h.hub->add(&long_name));
  h.hub->identify(&long_name, std::string(kMaxIdentityBytes + 1, 'x'));
  h.publish_to(snapshot(3, {}), {&long_name});
  h.hub->remove(&long_name);
  EXPECT_EQ(h.applied(), 3u);
  EXPECT_EQ(h.hub->ghosts(), 0u);
}

// A directory of its own for a test's state files, removed after.
struct StateDir {
  StateDir() {
    std::string tmpl = ::testing::TempDir() + "/hub_state_XXXXXX";
    if (!mkdtemp(tmpl.data())) ADD_FAILURE() << "mkdtemp";
    path = tmpl;
  }
  ~StateDir() { std::filesystem::remove_all(path); }
  std::string file() const { return path + "/feed-subscribers"; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path))
      out.push_back(e.path().filename().string());
    return out;
  }
  std::string path;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// A snapshot at EndpointSlice revision `rev`.
model::SnapshotPtr at_revision(uint64_t g, uint64_t rev) {
  auto s = std::make_shared<model::Snapshot>(*snapshot(g, {}));
  s->slice_revision = rev;
  return s;
}

// Hub A (the process before a restart) knows envoy-a, caught up at revision 200, and the ghost
// of "envoy b%", which left having acknowledged revision 100; anonymous streams are not
// written. It stops cleanly, which writes the file.
void write_state_of_a_first_process(const std::string& file) {
  StaleHub a(milliseconds(10000), file);
  auto s1 = at_revision(1, 100);
  a.hub->publish(s1);
  TrackedSubscriber envoy(s1, 1, "envoy-a"), b(s1, 2, "envoy b%"), anon(s1, 3);
  for (auto* sub : {&envoy, &b, &anon}) ASSERT_TRUE(a.hub->add(sub));
  a.hub->identify(&envoy, "envoy-a");
  a.hub->identify(&b, "envoy b%");
  auto s2 = at_revision(2, 200);
  a.publish_to(s2, {&envoy, &b, &anon});
  a.ack(envoy, 2);
  a.ack(anon, 2);
  a.hub->remove(&b);  // a ghost at s1
  EXPECT_EQ(a.hub->ghosts(), 1u);
  EXPECT_EQ(a.applied(), 1u);
}  // ~Hub: the last write

TEST(HubRemembered, AStopWritesEveryNamedSubscriberWithItsRevision) {
  StateDir dir;
  write_state_of_a_first_process(dir.file());
  EXPECT_EQ(read_all(dir.file()),
            "endpointd-feed-subscribers 1\n"
            "100 0 envoy%20b%25\n"
            "200 1 envoy-a\n");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"feed-subscribers"}));  // no temporary left
}

TEST(HubRemembered, ARememberedSubscriberHoldsAppliedAtNothingUntilItReconnectsAndAcks) {
  StateDir dir;
  write_state_of_a_first_process(dir.file());

  // The agent restarted: a new hub, a new snapshot numbering.
  StaleHub h(milliseconds(10000), dir.file());
  EXPECT_EQ(h.hub->remembered(), 2u);
  EXPECT_EQ(h.metrics.remembered_total(), 2u);
  EXPECT_EQ(h.hub->ghosts(), 2u);
  auto row = h.ghost("envoy-a");
  ASSERT_TRUE(row);
  EXPECT_TRUE(row->holding);
  auto s1 = at_revision(1, 300);
  h.hub->publish(s1);
  // Held at nothing: no applied(g), and the board's feed entry holds every removal.
  EXPECT_EQ(h.hub->applied(), nullptr);
  EXPECT_EQ(h.feed_entry().snapshot, nullptr);
  EXPECT_TRUE(h.reported.empty());
  EXPECT_EQ(h.hub->check_graces(), kT0 + milliseconds(10000));  // from the start

  // envoy-a is back: it joins at the current snapshot, but once it names itself it routes by
  // what it had before the restart, which this process does not have.
  TrackedSubscriber envoy(h.hub->current(), 1, "envoy-a");
  ASSERT_TRUE(h.hub->add(&envoy));
  h.hub->identify(&envoy, "envoy-a");
  EXPECT_EQ(envoy.acked(), nullptr);
  EXPECT_EQ(h.hub->ghosts(), 1u);
  auto s2 = at_revision(2, 310);
  h.publish_to(s2, {&envoy});
  envoy.tracker.unchanged(s2);  // changes nothing it sees: still nothing acknowledged
  h.hub->acks_changed(&envoy);
  EXPECT_EQ(h.hub->applied(), nullptr);
  h.ack(envoy, 2);
  EXPECT_EQ(envoy.acked(), s2);
  // envoy b% still holds.
  EXPECT_EQ(h.hub->applied(), nullptr);

  TrackedSubscriber b(h.hub->current(), 2, "envoy b%");
  ASSERT_TRUE(h.hub->add(&b));
  h.hub->identify(&b, "envoy b%");
  EXPECT_EQ(h.hub->ghosts(), 0u);
  EXPECT_EQ(h.hub->applied(), nullptr);
  // Its stream goes away before it acknowledges: a ghost at nothing again, still holding.
  h.hub->remove(&b);
  EXPECT_EQ(h.hub->ghosts(), 1u);
  EXPECT_EQ(h.hub->applied(), nullptr);
  TrackedSubscriber b2(h.hub->current(), 3, "envoy b%");
  ASSERT_TRUE(h.hub->add(&b2));
  h.hub->identify(&b2, "envoy b%");
  auto s3 = at_revision(3, 320);
  h.publish_to(s3, {&envoy, &b2});
  h.ack(b2, 3);
  EXPECT_EQ(h.applied(), 2u);  // envoy acknowledged 2 and holds there
  h.ack(envoy, 3);
  EXPECT_EQ(h.applied(), 3u);
  EXPECT_EQ(h.reported, (std::vector<uint64_t>{2, 3}));
  EXPECT_TRUE(h.board_holdouts().empty());
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kDisconnected), 0u);
  h.hub->remove(&envoy);
  h.hub->remove(&b2);
}

TEST(HubRemembered, PastItsGraceARememberedSubscriberIsAHoldoutWithItsRevisionAndNoSnapshot) {
  StateDir dir;
  write_state_of_a_first_process(dir.file());
  StaleHub h(milliseconds(10000), dir.file());
  auto s1 = at_revision(1, 300);
  h.hub->publish(s1);
  TrackedSubscriber envoy(h.hub->current(), 1, "envoy-a");
  ASSERT_TRUE(h.hub->add(&envoy));
  h.hub->identify(&envoy, "envoy-a");  // back, but it never acknowledges

  h.now += milliseconds(9999);
  h.hub->check_graces();
  EXPECT_EQ(h.hub->applied(), nullptr);
  EXPECT_TRUE(h.board_holdouts().empty());
  h.now += milliseconds(1);
  h.hub->check_graces();
  // Both lapse: applied(g) moves, and neither state is known, only its revision.
  EXPECT_EQ(h.applied(), 1u);
  auto holdouts = h.board_holdouts();
  ASSERT_EQ(holdouts.size(), 2u);
  std::sort(holdouts.begin(), holdouts.end(),
            [](const Holdout& x, const Holdout& y) { return x.client < y.client; });
  EXPECT_EQ(holdouts[0].client, "envoy b%");
  EXPECT_EQ(holdouts[0].snapshot, nullptr);
  EXPECT_EQ(holdouts[0].revision, 100u);
  EXPECT_EQ(holdouts[0].reason, "disconnected");
  EXPECT_EQ(holdouts[1].client, "envoy-a");
  EXPECT_EQ(holdouts[1].snapshot, nullptr);
  EXPECT_EQ(holdouts[1].revision, 200u);
  EXPECT_EQ(holdouts[1].reason, "unacknowledged");
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kDisconnected), 1u);
  EXPECT_EQ(h.metrics.lapsed_total(Metrics::Lapse::kUnacknowledged), 1u);

  // What a later write keeps: both, at their remembered revisions (sorted by name).
  ASSERT_TRUE(h.hub->write_state());
  EXPECT_EQ(read_all(dir.file()),
            "endpointd-feed-subscribers 1\n"
            "100 0 envoy%20b%25\n"
            "200 0 envoy-a\n");

  // envoy-a acknowledges at last: it holds again from there and leaves the board.
  auto s2 = at_revision(2, 310);
  h.publish_to(s2, {&envoy});
  h.ack(envoy, 2);
  EXPECT_EQ(h.applied(), 2u);
  holdouts = h.board_holdouts();
  ASSERT_EQ(holdouts.size(), 1u);
  EXPECT_EQ(holdouts[0].client, "envoy b%");
  h.hub->remove(&envoy);
}

TEST(HubRemembered, AFileThatIsCorruptTooLargeOrNamesGarbageIsIgnoredAndCounted) {
  StateDir dir;
  struct Case {
    std::string text;
    Metrics::StateLoad why;
  };
  const std::vector<Case> cases = {
      {"not a state file\n", Metrics::StateLoad::kMalformed},
      {"", Metrics::StateLoad::kMalformed},
      {"endpointd-feed-subscribers 1\n12 1 envoy-a\n12 1 cut-off", Metrics::StateLoad::kMalformed},
      {"endpointd-feed-subscribers 1\nx 1 envoy-a\n", Metrics::StateLoad::kMalformed},
      {"endpointd-feed-subscribers 1\n12 2 envoy-a\n", Metrics::StateLoad::kMalformed},
      {"endpointd-feed-subscribers 1\n12 1 bad%zzname\n", Metrics::StateLoad::kMalformed},
      {"endpointd-feed-subscribers 1\n12 1 \n", Metrics::StateLoad::kMalformed},
      {"endpointd-feed-subscribers 1\n12 1 " + std::string(kMaxIdentityBytes + 1, 'n') + "\n",
       Metrics::StateLoad::kMalformed},
      {"endpointd-feed-subscribers 1\n" + std::string(kMaxStateFileBytes, '#') + "\n",
       Metrics::StateLoad::kTooLarge},
  };
  for (const auto& c : cases) {
    write_all(dir.file(), c.text);
    StaleHub h(milliseconds(10000), dir.file());
    EXPECT_EQ(h.metrics.state_load_errors(c.why), 1u) << c.text.substr(0, 80);
    EXPECT_EQ(h.hub->remembered(), 0u);
    EXPECT_EQ(h.hub->ghosts(), 0u);
    h.hub->publish(snapshot(1, {}));
    EXPECT_EQ(h.applied(), 1u);  // nothing held
  }
  // A directory where the file should be: unreadable, and counted so.
  std::filesystem::remove(dir.file());
  std::filesystem::create_directory(dir.file());
  StaleHub h(milliseconds(10000), dir.file());
  EXPECT_EQ(h.metrics.state_load_errors(Metrics::StateLoad::kUnreadable), 1u);
  EXPECT_EQ(h.hub->ghosts(), 0u);
  // And its writes fail, counted too.
  EXPECT_FALSE(h.hub->write_state());
  EXPECT_EQ(h.metrics.state_write_errors(Metrics::StateWrite::kRename), 1u);
}

TEST(HubRemembered, NoFileYetIsAnEmptyStartAndNoError) {
  StateDir dir;
  StaleHub h(milliseconds(10000), dir.file());
  EXPECT_EQ(h.hub->remembered(), 0u);
  EXPECT_EQ(h.metrics.state_load_errors(Metrics::StateLoad::kUnreadable), 0u);
  EXPECT_EQ(h.metrics.state_load_errors(Metrics::StateLoad::kMalformed), 0u);
  h.hub->publish(snapshot(1, {}));
  EXPECT_EQ(h.applied(), 1u);
}

TEST(HubRemembered, OffByDefaultAndWithGraceZeroNothingIsWritten) {
  EXPECT_TRUE(HubOptions{}.state_file.empty());
  for (auto grace : {milliseconds(10000), milliseconds(0)}) {
    StateDir dir;
    {
      StaleHub h(grace, grace.count() == 0 ? dir.file() : "");
      auto s1 = at_revision(1, 100);
      h.hub->publish(s1);
      TrackedSubscriber envoy(s1, 1, "envoy-a");
      ASSERT_TRUE(h.hub->add(&envoy));
      h.hub->identify(&envoy, "envoy-a");
      EXPECT_FALSE(h.hub->write_state());
      h.hub->remove(&envoy);
    }
    EXPECT_TRUE(dir.entries().empty()) << grace.count();
  }
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
