// Stale subscribers over a real gRPC feed on loopback: a watch client that stops acknowledging
// holds the feed's applied generation only for stale_after, then drains proceed without it;
// once it acknowledges the newest version it counts again.
#include <gtest/gtest.h>

#include <chrono>

#include "endpointd/v1/feed.grpc.pb.h"
#include "envoy/service/discovery/v3/discovery.grpc.pb.h"
#include "feed/resources.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

using std::chrono::milliseconds;
using testing::eventually;
using testing::FeedFixture;
using testing::service;
using testing::snapshot;

class Client {
 public:
  Client(const std::shared_ptr<grpc::Channel>& ch, const std::string& name)
      : stub_(v1::UpstreamFeed::NewStub(ch)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream_ = stub_->Watch(&ctx_);
    v1::WatchRequest r;
    r.mutable_subscribe()->set_client_name(name);
    auto* s = r.mutable_subscribe()->add_selectors();
    s->set_namespace_("default");
    s->set_name("web");
    EXPECT_TRUE(stream_->Write(r));
  }
  ~Client() {
    ctx_.TryCancel();
    stream_->Finish().ok();
  }
  uint64_t read() {
    v1::WatchResponse r;
    EXPECT_TRUE(stream_->Read(&r));
    return r.version();
  }
  void ack(uint64_t v) {
    v1::WatchRequest r;
    r.mutable_ack()->set_version(v);
    EXPECT_TRUE(stream_->Write(r));
  }

 private:
  std::unique_ptr<v1::UpstreamFeed::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WatchRequest, v1::WatchResponse>> stream_;
};

class Stale : public FeedFixture {
 protected:
  static constexpr milliseconds kStaleAfter{2000};

  void SetUp() override {
    FeedOptions o;
    o.stale_after = kStaleAfter;
    start(o);
  }
  // The /debug/state row of the subscriber named `client`.
  SubscriberInfo row(const std::string& client) {
    for (auto& i : sink_->subscribers())
      if (i.client == client) return i;
    ADD_FAILURE() << "no subscriber " << client;
    return {};
  }
  // web with `n` endpoints, at generation g.
  void publish_web(uint64_t g, int n) {
    std::vector<testing::Ep> eps;
    for (int i = 1; i <= n; ++i) eps.push_back({.ip = "10.0.0." + std::to_string(i)});
    publish(snapshot(g, {service("default", "web", eps)}));
  }
};

TEST_F(Stale, ANeverAckingClientHoldsTheAppliedGenerationOnlyForStaleAfter) {
  publish_web(1, 3);
  Client silent(channel_, "silent"), good(channel_, "good");
  ASSERT_EQ(silent.read(), 1u);
  ASSERT_EQ(good.read(), 1u);
  silent.ack(1);  // it worked once
  good.ack(1);
  ASSERT_TRUE(eventually([&] { return row("silent").acked_generation == 1; }));

  // An endpoint goes away; only one client acknowledges.
  const auto published = std::chrono::steady_clock::now();
  publish_web(2, 2);
  ASSERT_EQ(silent.read(), 2u);
  ASSERT_EQ(good.read(), 2u);
  good.ack(2);
  ASSERT_TRUE(eventually([&] { return row("good").acked_generation == 2; }));
  EXPECT_EQ(board_generation(), 1u);  // the silent one holds it, for now
  EXPECT_FALSE(row("silent").stale);

  ASSERT_TRUE(eventually([&] { return board_generation() == 2; }, std::chrono::seconds(10)));
  const auto took = std::chrono::steady_clock::now() - published;
  EXPECT_GE(took, kStaleAfter);
  EXPECT_LT(took, kStaleAfter + milliseconds(1000));
  EXPECT_EQ(sink_->applied_generation(), 2u);
  EXPECT_TRUE(row("silent").stale);
  EXPECT_FALSE(row("good").stale);
  EXPECT_EQ(sink_->stale_subscribers(), 1u);
  EXPECT_EQ(metric("endpointd_feed_stale_subscribers_total"), 1);
  EXPECT_EQ(metric("endpointd_feed_subscribers_stale"), 1);

  // Stale, but still connected and still sent updates.
  publish_web(3, 1);
  ASSERT_EQ(silent.read(), 3u);
  ASSERT_EQ(good.read(), 3u);
  good.ack(3);
  EXPECT_TRUE(eventually([&] { return board_generation() == 3; }));

  // It catches up: counted again, and the next change waits for it.
  silent.ack(3);
  ASSERT_TRUE(eventually([&] { return !row("silent").stale; }));
  EXPECT_EQ(metric("endpointd_feed_subscribers_stale"), 0);
  EXPECT_EQ(metric("endpointd_feed_stale_subscribers_total"), 1);
  publish_web(4, 2);
  ASSERT_EQ(silent.read(), 4u);
  ASSERT_EQ(good.read(), 4u);
  good.ack(4);
  ASSERT_TRUE(eventually([&] { return row("good").acked_generation == 4; }));
  EXPECT_EQ(board_generation(), 3u);
  silent.ack(4);
  EXPECT_TRUE(eventually([&] { return board_generation() == 4; }));
  EXPECT_EQ(metric("endpointd_feed_stale_subscribers_total"), 1);
}

TEST_F(Stale, AClientThatLeavesWhileStaleIsNoLongerCounted) {
  publish_web(1, 2);
  {
    Client silent(channel_, "silent");
    ASSERT_EQ(silent.read(), 1u);
    publish_web(2, 1);
    ASSERT_EQ(silent.read(), 2u);
    ASSERT_TRUE(eventually([&] { return sink_->stale_subscribers() == 1; },
                           kStaleAfter + milliseconds(1000)));
    // The hub counts it stale under its lock and reports the generation it frees to the
    // board just after; a reader can look in between.
    EXPECT_TRUE(eventually([&] { return board_generation() == 2u; }));
  }
  EXPECT_TRUE(eventually([&] { return sink_->subscribers().empty(); }));
  EXPECT_EQ(sink_->stale_subscribers(), 0u);
  EXPECT_EQ(metric("endpointd_feed_subscribers_stale"), 0);
  EXPECT_EQ(metric("endpointd_feed_stale_subscribers_total"), 1);
}

TEST_F(Stale, AnXdsClientThatNeverAcksEndpointsIsStaleByItsNodeId) {
  namespace disc = envoy::service::discovery::v3;
  publish_web(1, 3);
  auto stub = disc::AggregatedDiscoveryService::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto ads = stub->StreamAggregatedResources(&ctx);
  disc::DiscoveryRequest req;
  req.set_type_url(std::string(kEndpointType));
  req.mutable_node()->set_id("envoy-silent");
  req.add_resource_names("outbound|80||web.default.svc.cluster.local");
  ASSERT_TRUE(ads->Write(req));
  disc::DiscoveryResponse resp;
  ASSERT_TRUE(ads->Read(&resp));
  EXPECT_EQ(resp.version_info(), "1");
  auto ack_of = [&](const disc::DiscoveryResponse& r) {
    disc::DiscoveryRequest a = req;
    a.set_version_info(r.version_info());
    a.set_response_nonce(r.nonce());
    return a;
  };
  ASSERT_TRUE(ads->Write(ack_of(resp)));  // it worked once
  ASSERT_TRUE(eventually([&] { return row("envoy-silent").acked_version == 1; }));
  Client good(channel_, "good");
  ASSERT_EQ(good.read(), 1u);

  const auto published = std::chrono::steady_clock::now();
  publish_web(2, 2);
  ASSERT_TRUE(ads->Read(&resp));  // sent, never ACKed
  EXPECT_EQ(resp.version_info(), "2");
  ASSERT_EQ(good.read(), 2u);
  good.ack(2);
  ASSERT_TRUE(eventually([&] { return board_generation() == 2; }, std::chrono::seconds(10)));
  const auto took = std::chrono::steady_clock::now() - published;
  EXPECT_GE(took, kStaleAfter);
  EXPECT_LT(took, kStaleAfter + milliseconds(1000));
  SubscriberInfo r = row("envoy-silent");
  EXPECT_TRUE(r.stale);
  EXPECT_EQ(r.api, "ads");
  EXPECT_EQ(metric("endpointd_feed_stale_subscribers_total"), 1);

  // The ACK of the newest response brings it back.
  ASSERT_TRUE(ads->Write(ack_of(resp)));
  EXPECT_TRUE(eventually([&] { return !row("envoy-silent").stale; }));
  EXPECT_EQ(metric("endpointd_feed_subscribers_stale"), 0);
  ctx.TryCancel();
  ads->Finish().ok();
}

}  // namespace
}  // namespace endpointd::feed
