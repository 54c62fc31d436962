// Subscribers' graces over a real gRPC feed on loopback: a watch client that stops acknowledging
// holds the feed's applied generation only for its grace, then drains proceed without it (it is
// a holdout on the board); once it acknowledges the newest version it counts again. A named
// client that reconnects is held at what it acknowledged before, until it acknowledges again.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "endpointd/v1/feed.grpc.pb.h"
#include "envoy/service/discovery/v3/discovery.grpc.pb.h"
#include "feed/resources.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

namespace disc = envoy::service::discovery::v3;
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

// An xDS client of web's endpoints under a node id.
class AdsClient {
 public:
  AdsClient(const std::shared_ptr<grpc::Channel>& ch, const std::string& node)
      : stub_(disc::AggregatedDiscoveryService::NewStub(ch)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream_ = stub_->StreamAggregatedResources(&ctx_);
    req_.set_type_url(std::string(kEndpointType));
    req_.mutable_node()->set_id(node);
    req_.add_resource_names("outbound|80||web.default.svc.cluster.local");
    EXPECT_TRUE(stream_->Write(req_));
  }
  ~AdsClient() {
    ctx_.TryCancel();
    stream_->Finish().ok();
  }
  disc::DiscoveryResponse read() {
    disc::DiscoveryResponse r;
    EXPECT_TRUE(stream_->Read(&r));
    return r;
  }
  void ack(const disc::DiscoveryResponse& r) { EXPECT_TRUE(stream_->Write(answer(r))); }
  void nack(const disc::DiscoveryResponse& r) {
    disc::DiscoveryRequest a = answer(r);
    a.set_version_info("");  // the version it keeps
    a.mutable_error_detail()->set_message("rejected by the test");
    EXPECT_TRUE(stream_->Write(a));
  }

 private:
  disc::DiscoveryRequest answer(const disc::DiscoveryResponse& r) {
    disc::DiscoveryRequest a = req_;
    a.clear_node();
    a.set_version_info(r.version_info());
    a.set_response_nonce(r.nonce());
    return a;
  }
  std::unique_ptr<disc::AggregatedDiscoveryService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<disc::DiscoveryRequest, disc::DiscoveryResponse>>
      stream_;
  disc::DiscoveryRequest req_;
};

class Graces : public FeedFixture {
 protected:
  // The /debug/state row of the stream named `client`.
  SubscriberInfo row(const std::string& client) {
    for (auto& i : sink_->subscribers())
      if (i.client == client && i.connected) return i;
    ADD_FAILURE() << "no subscriber " << client;
    return {};
  }
  std::vector<pipeline::AckBoard::Holdout> board_holdouts() {
    for (const auto& e : board_.entries())
      if (e.consumer == "feed") return e.holdouts;
    return {};
  }
  // The ghost row of `client`; nullopt when there is none.
  std::optional<SubscriberInfo> ghost(const std::string& client) {
    for (auto& i : sink_->subscribers())
      if (i.client == client && !i.connected) return i;
    return std::nullopt;
  }
  // web with `n` endpoints, at generation g.
  void publish_web(uint64_t g, int n) {
    std::vector<testing::Ep> eps;
    for (int i = 1; i <= n; ++i) eps.push_back({.ip = "10.0.0." + std::to_string(i)});
    publish(snapshot(g, {service("default", "web", eps)}));
  }
};

// A grace short enough to pass within a test.
class Stale : public Graces {
 protected:
  static constexpr milliseconds kStaleAfter{2000};
  void SetUp() override {
    FeedOptions o;
    o.subscriber_grace = kStaleAfter;
    start(o);
  }
};

// A grace that never passes within a test: what holds is the ghosts alone.
class Reconnect : public Graces {
 protected:
  void SetUp() override {
    FeedOptions o;
    o.subscriber_grace = std::chrono::minutes(5);
    start(o);
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
  EXPECT_TRUE(row("silent").holding);

  ASSERT_TRUE(eventually([&] { return board_generation() == 2; }, std::chrono::seconds(10)));
  const auto took = std::chrono::steady_clock::now() - published;
  EXPECT_GE(took, kStaleAfter);
  EXPECT_LT(took, kStaleAfter + milliseconds(1000));
  EXPECT_EQ(sink_->applied_generation(), 2u);
  EXPECT_FALSE(row("silent").holding);
  EXPECT_TRUE(row("good").holding);
  auto held = board_holdouts();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].client, "silent");
  EXPECT_EQ(held[0].snapshot->generation, 1u);
  EXPECT_EQ(held[0].reason, "unacknowledged");
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
  ASSERT_TRUE(eventually([&] { return row("silent").holding; }));
  // The hub's row and the board are written one after the other (the board last): a holdout
  // stays on the board a moment longer, never shorter.
  EXPECT_TRUE(eventually([&] { return board_holdouts().empty(); }));
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

TEST_F(Stale, AClientThatLeavesWhileStaleStaysAHoldoutUnderItsName) {
  publish_web(1, 2);
  {
    Client silent(channel_, "silent");
    ASSERT_EQ(silent.read(), 1u);
    publish_web(2, 1);
    ASSERT_EQ(silent.read(), 2u);
    ASSERT_TRUE(eventually([&] { return sink_->holdouts().size() == 1; },
                           kStaleAfter + milliseconds(1000)));
    // The hub puts the holdout on the board, then reports the generation it frees; a reader
    // can look in between.
    EXPECT_TRUE(eventually([&] { return board_generation() == 2u; }));
  }
  // Gone: its ghost is the holdout now (connected false, not holding).
  ASSERT_TRUE(eventually([&] {
    auto rows = sink_->subscribers();
    return rows.size() == 1 && !rows[0].connected;
  }));
  auto rows = sink_->subscribers();
  EXPECT_EQ(rows[0].client, "silent");
  EXPECT_FALSE(rows[0].holding);
  auto held = board_holdouts();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].client, "silent");
  EXPECT_EQ(held[0].snapshot->generation, 1u);
  EXPECT_EQ(metric("endpointd_feed_subscribers_stale"), 0);
  EXPECT_EQ(metric("endpointd_feed_stale_subscribers_total"), 1);
  EXPECT_EQ(metric("endpointd_feed_holdouts"), 1);
  EXPECT_EQ(metric("endpointd_feed_subscribers_lapsed_total", "unacknowledged"), 1);
}

TEST_F(Stale, AnXdsClientThatNeverAcksEndpointsIsStaleByItsNodeId) {
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
  EXPECT_FALSE(r.holding);
  EXPECT_EQ(r.api, "ads");
  EXPECT_EQ(metric("endpointd_feed_stale_subscribers_total"), 1);

  // The ACK of the newest response brings it back.
  ASSERT_TRUE(ads->Write(ack_of(resp)));
  EXPECT_TRUE(eventually([&] { return row("envoy-silent").holding; }));
  EXPECT_EQ(metric("endpointd_feed_subscribers_stale"), 0);
  ctx.TryCancel();
  ads->Finish().ok();
}

TEST_F(Stale, AnXdsClientThatKeepsNackingIsAHoldoutNacking) {
  publish_web(1, 3);
  AdsClient envoy(channel_, "envoy-nacking");
  auto r1 = envoy.read();
  EXPECT_EQ(r1.version_info(), "1");
  envoy.ack(r1);
  ASSERT_TRUE(eventually([&] { return row("envoy-nacking").acked_version == 1; }));

  publish_web(2, 2);
  auto r2 = envoy.read();
  EXPECT_EQ(r2.version_info(), "2");
  envoy.nack(r2);
  ASSERT_TRUE(eventually([&] { return row("envoy-nacking").nacks == 1; }));
  EXPECT_EQ(board_generation(), 1u);  // it keeps routing by 1: held, for now

  ASSERT_TRUE(eventually([&] { return board_generation() == 2; }, std::chrono::seconds(10)));
  auto held = board_holdouts();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].client, "envoy-nacking");
  EXPECT_EQ(held[0].reason, "nacking");
  EXPECT_EQ(held[0].snapshot->generation, 1u);
  EXPECT_EQ(row("envoy-nacking").lapsed, "nacking");
  EXPECT_EQ(metric("endpointd_feed_subscribers_lapsed_total", "nacking"), 1);
  EXPECT_EQ(metric("endpointd_feed_subscribers_lapsed_total", "unacknowledged"), 0);
}

TEST_F(Reconnect, AWatchClientThatReconnectsIsHeldAtWhatItAckedUntilItAcksAgain) {
  publish_web(1, 3);
  auto first = std::make_unique<Client>(channel_, "proxy-a");
  ASSERT_EQ(first->read(), 1u);
  first->ack(1);
  ASSERT_TRUE(eventually([&] { return row("proxy-a").acked_version == 1; }));
  publish_web(2, 2);
  ASSERT_EQ(first->read(), 2u);
  first.reset();  // gone without acknowledging 2
  ASSERT_TRUE(eventually([&] { return ghost("proxy-a").has_value(); }));
  EXPECT_TRUE(ghost("proxy-a")->holding);
  EXPECT_EQ(ghost("proxy-a")->acked_generation, 1u);
  EXPECT_EQ(board_generation(), 1u);  // a stream's end no longer lets 2 through
  EXPECT_EQ(metric("endpointd_feed_ghosts_holding"), 1);

  Client back(channel_, "proxy-a");
  ASSERT_EQ(back.read(), 2u);  // its full state, at the current snapshot
  ASSERT_TRUE(eventually([&] { return !ghost("proxy-a"); }));
  EXPECT_EQ(row("proxy-a").acked_generation, 1u);  // from where its name was
  EXPECT_EQ(board_generation(), 1u);
  EXPECT_EQ(metric("endpointd_feed_ghosts_holding"), 0);
  back.ack(2);
  EXPECT_TRUE(eventually([&] { return board_generation() == 2; }));
  EXPECT_TRUE(board_holdouts().empty());
}

TEST_F(Reconnect, AnXdsClientThatReconnectsIsHeldByItsNodeIdUntilItAcksEndpointsAgain) {
  publish_web(1, 3);
  auto first = std::make_unique<AdsClient>(channel_, "envoy-1");
  auto r1 = first->read();
  first->ack(r1);
  ASSERT_TRUE(eventually([&] { return row("envoy-1").acked_version == 1; }));
  publish_web(2, 2);
  EXPECT_EQ(first->read().version_info(), "2");
  first.reset();
  ASSERT_TRUE(eventually([&] { return ghost("envoy-1").has_value(); }));
  EXPECT_EQ(board_generation(), 1u);

  AdsClient back(channel_, "envoy-1");
  auto r2 = back.read();
  EXPECT_EQ(r2.version_info(), "2");
  ASSERT_TRUE(eventually([&] { return !ghost("envoy-1"); }));
  EXPECT_EQ(row("envoy-1").acked_generation, 1u);
  EXPECT_EQ(board_generation(), 1u);
  back.ack(r2);
  EXPECT_TRUE(eventually([&] { return board_generation() == 2; }));
}

TEST_F(Reconnect, AnAnonymousClientThatLeavesStopsHoldingAtOnce) {
  publish_web(1, 3);
  auto anon = std::make_unique<Client>(channel_, "");
  ASSERT_EQ(anon->read(), 1u);
  publish_web(2, 2);
  ASSERT_EQ(anon->read(), 2u);
  EXPECT_EQ(board_generation(), 1u);
  anon.reset();
  EXPECT_TRUE(eventually([&] { return board_generation() == 2; }));
  EXPECT_TRUE(sink_->subscribers().empty());  // no ghost
  EXPECT_TRUE(board_holdouts().empty());
}

// An agent restart over a real feed: the first agent's sink writes the named subscriber to its
// state file when it stops; the second one loads it, and holds its applied generation at
// nothing until that client, which stayed away, reconnects and acknowledges.
TEST(Restart, AClientThatStayedAwayAcrossARestartHoldsTheNewAgentUntilItAcks) {
  std::string dir = ::testing::TempDir() + "/feed_restart_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  FeedOptions o;
  o.listen = "127.0.0.1:0";
  o.subscriber_grace = std::chrono::minutes(5);
  o.state_file = dir + "/feed-subscribers";
  auto web = [](uint64_t g, int n) {
    std::vector<testing::Ep> eps;
    for (int i = 1; i <= n; ++i) eps.push_back({.ip = "10.0.0." + std::to_string(i)});
    auto s = std::make_shared<model::Snapshot>(*snapshot(g, {service("default", "web", eps)}));
    s->slice_revision = 1000 + g;
    return model::SnapshotPtr(s);
  };
  auto feed_generation = [](const pipeline::AckBoard& b) -> std::optional<uint64_t> {
    for (const auto& e : b.entries())
      if (e.consumer == "feed") return e.generation();
    return std::nullopt;
  };
  {
    pipeline::AckBoard board;
    prometheus::Registry registry;
    FeedSink sink(o, &board, &registry);
    ASSERT_TRUE(sink.start());
    auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(sink.port()),
                                  grpc::InsecureChannelCredentials());
    sink.apply(web(1, 3), model::Delta{});
    {
      Client c(ch, "proxy-a");
      ASSERT_EQ(c.read(), 1u);
      c.ack(1);
      ASSERT_TRUE(eventually([&] { return feed_generation(board) == 1u; }));
      ASSERT_TRUE(eventually([&] {
        for (const auto& i : sink.subscribers())
          if (i.client == "proxy-a" && i.acked_version == 1) return true;
        return false;
      }));
    }  // it goes away, and stays away while the agent restarts
    sink.stop();
  }
  std::ifstream in(o.state_file);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  EXPECT_EQ(text, "endpointd-feed-subscribers 1\n1001 1 proxy-a\n");

  pipeline::AckBoard board;
  prometheus::Registry registry;
  FeedSink sink(o, &board, &registry);
  ASSERT_TRUE(sink.start());
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(sink.port()),
                                grpc::InsecureChannelCredentials());
  sink.apply(web(1, 2), model::Delta{});  // the new agent's own numbering
  EXPECT_EQ(feed_generation(board), 0u);  // held at nothing
  {
    Client back(ch, "proxy-a");
    ASSERT_EQ(back.read(), 1u);
    ASSERT_TRUE(eventually([&] {
      for (const auto& i : sink.subscribers())
        if (i.client == "proxy-a" && !i.connected) return false;  // still a ghost
      return true;
    }));
    EXPECT_EQ(feed_generation(board), 0u);  // it has not acknowledged anything of this agent
    back.ack(1);
    EXPECT_TRUE(eventually([&] { return feed_generation(board) == 1u; }));
  }
  sink.stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace endpointd::feed
