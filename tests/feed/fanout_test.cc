// FanOut, the parallel for-each of the feed's publish: every index exactly once, on more than
// one thread when the range is big enough, on the caller alone when it is small.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "feed/fanout.h"
#include "feed/hub.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

TEST(FanOut, CallsEveryIndexExactlyOnceForManySizes) {
  FanOut f(3);
  ASSERT_EQ(f.threads(), 3u);
  for (size_t n : {0, 1, 63, 64, 127, 128, 191, 192, 1000, 4097}) {
    std::vector<std::atomic<int>> calls(n);
    f.run(n, [&](size_t i) { calls[i].fetch_add(1); });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(calls[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(FanOut, SharesABigRangeAmongItsThreadsAndKeepsASmallOneOnTheCaller) {
  FanOut f(2);
  std::mutex mu;
  std::set<std::thread::id> seen;
  auto record = [&](size_t) {
    std::lock_guard lock(mu);
    seen.insert(std::this_thread::get_id());
  };
  f.run(FanOut::kMinPerThread - 1, record);
  EXPECT_EQ(seen, std::set<std::thread::id>{std::this_thread::get_id()});
  seen.clear();
  f.run(2 * FanOut::kMinPerThread, record);
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(std::this_thread::get_id()));
}

TEST(FanOut, OneThreadRunsOnTheCallerAndZeroMeansOnePerCoreWithinTheCap) {
  EXPECT_EQ(FanOut(1).threads(), 1u);
  size_t cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(FanOut(0).threads(), std::min(cores, FanOut::kMaxThreads));
  EXPECT_EQ(FanOut(64).threads(), FanOut::kMaxThreads);
}

TEST(FanOut, ManyRoundsBackToBack) {
  FanOut f(4);
  std::atomic<size_t> total{0};
  for (int round = 0; round < 2000; ++round) f.run(300, [&](size_t) { total.fetch_add(1); });
  EXPECT_EQ(total.load(), 2000u * 300u);
}

class CountingSubscriber : public Subscriber {
 public:
  explicit CountingSubscriber(model::SnapshotPtr a) : acked_(std::move(a)) {}
  void notify(const model::SnapshotPtr& s) override {
    notified.fetch_add(1);
    last.store(s->generation);
  }
  model::SnapshotPtr acked() const override { return acked_; }
  bool resume(const model::SnapshotPtr&, Clock::time_point) override { return false; }
  SubscriberInfo info() const override { return {}; }
  model::SnapshotPtr acked_;
  std::atomic<int> notified{0};
  std::atomic<uint64_t> last{0};
};

TEST(FanOut, HubWithFourThreadsNotifiesEverySubscriberOncePerSnapshot) {
  Hub hub(1000, {}, 4);
  auto s1 = testing::snapshot(1, {});
  hub.publish(s1);
  std::vector<std::unique_ptr<CountingSubscriber>> subs;
  for (int i = 0; i < 700; ++i) {
    subs.push_back(std::make_unique<CountingSubscriber>(s1));
    ASSERT_TRUE(hub.add(subs.back().get()));
  }
  for (uint64_t g = 2; g <= 20; ++g) hub.publish(testing::snapshot(g, {}));
  for (const auto& s : subs) {
    EXPECT_EQ(s->notified.load(), 19);
    EXPECT_EQ(s->last.load(), 20u);
  }
  EXPECT_EQ(hub.applied()->generation, 1u);  // nobody acked beyond the first snapshot
}

}  // namespace
}  // namespace endpointd::feed
