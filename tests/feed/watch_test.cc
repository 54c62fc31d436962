// endpointd.v1.UpstreamFeed over a real gRPC server on loopback.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <future>

#include "endpointd/v1/feed.grpc.pb.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

using testing::eventually;
using testing::FeedFixture;
using testing::service;
using testing::snapshot;

class WatchClient {
 public:
  explicit WatchClient(const std::shared_ptr<grpc::Channel>& ch)
      : stub_(v1::UpstreamFeed::NewStub(ch)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    stream_ = stub_->Watch(&ctx_);
  }
  bool subscribe(std::vector<std::tuple<std::string, std::string, uint32_t>> sel,
                 bool all = false) {
    v1::WatchRequest r;
    r.mutable_subscribe()->set_all(all);
    r.mutable_subscribe()->set_client_name("test");
    for (auto& [ns, name, port] : sel) {
      auto* s = r.mutable_subscribe()->add_selectors();
      s->set_namespace_(ns);
      s->set_name(name);
      s->set_port(port);
    }
    return stream_->Write(r);
  }
  v1::WatchResponse read() {
    v1::WatchResponse r;
    EXPECT_TRUE(stream_->Read(&r));
    return r;
  }
  bool ack(uint64_t v) {
    v1::WatchRequest r;
    r.mutable_ack()->set_version(v);
    return stream_->Write(r);
  }
  grpc::Status close() {
    stream_->WritesDone();
    v1::WatchResponse r;
    while (stream_->Read(&r)) {
    }
    return stream_->Finish();
  }
  grpc::Status finish_after_error() {
    v1::WatchResponse r;
    while (stream_->Read(&r)) {
    }
    return stream_->Finish();
  }
  grpc::ClientContext& ctx() { return ctx_; }

 private:
  std::unique_ptr<v1::UpstreamFeed::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WatchRequest, v1::WatchResponse>> stream_;
};

using Watch = FeedFixture;

TEST_F(Watch, InitialStateThenIncrementalUpdatesAndAcks) {
  start();
  auto web1 =
      service("default", "web", {{.ip = "10.0.0.1"}, {.ip = "10.0.0.2", .terminating = true}});
  auto api = service("default", "api", {{.ip = "10.0.1.1"}});
  publish(snapshot(1, {web1, api}));

  WatchClient c(channel_);
  ASSERT_TRUE(c.subscribe({{"default", "web", 0}}));
  auto full = c.read();
  EXPECT_TRUE(full.full());
  EXPECT_EQ(full.version(), 1u);
  ASSERT_EQ(full.services_size(), 1);
  const auto& svc = full.services(0);
  EXPECT_EQ(svc.name(), "web");
  ASSERT_EQ(svc.ports_size(), 1);
  EXPECT_EQ(svc.ports(0).port(), 80u);
  ASSERT_EQ(svc.ports(0).endpoints_size(), 2);
  const auto& e = svc.ports(0).endpoints(1);
  EXPECT_EQ(e.address(), "10.0.0.2");
  EXPECT_EQ(e.port(), 8080u);
  EXPECT_TRUE(e.terminating());
  // The routing rule's verdicts: 10.0.0.1 is ready, so the terminating one drains.
  EXPECT_EQ(svc.ports(0).endpoints(0).routing(), v1::ROUTED);
  EXPECT_EQ(e.routing(), v1::DRAINING);
  EXPECT_EQ(e.zone(), "zone-a");
  EXPECT_EQ(e.node(), "node-zone-a");
  EXPECT_EQ(e.target().name(), "web-10.0.0.2");
  ASSERT_TRUE(c.ack(1));
  EXPECT_TRUE(eventually([&] { return board_generation() == 1; }));

  // A change of web: an incremental update with web whole.
  auto web2 = service("default", "web", {{.ip = "10.0.0.1"}});
  publish(snapshot(2, {web2, api}));
  auto inc = c.read();
  EXPECT_FALSE(inc.full());
  EXPECT_EQ(inc.version(), 2u);
  ASSERT_EQ(inc.services_size(), 1);
  EXPECT_EQ(inc.services(0).ports(0).endpoints_size(), 1);
  EXPECT_EQ(board_generation(), 1u);  // not acknowledged yet

  // A change elsewhere sends nothing here, and rides on the ack of version 2.
  auto api3 = service("default", "api", {{.ip = "10.0.1.2"}});
  publish(snapshot(3, {web2, api3}));
  EXPECT_EQ(board_generation(), 1u);
  ASSERT_TRUE(c.ack(2));
  EXPECT_TRUE(eventually([&] { return board_generation() == 3; }));

  // Removal of the service.
  publish(snapshot(4, {api3}));
  auto rm = c.read();
  EXPECT_EQ(rm.version(), 4u);
  ASSERT_EQ(rm.removed_size(), 1);
  EXPECT_EQ(rm.removed(0).name(), "web");
  EXPECT_TRUE(c.close().ok());
}

TEST_F(Watch, SubscriptionChangeOnTheSameStream) {
  start();
  publish(snapshot(
      5, {service("default", "web", {{.ip = "10.0.0.1"}}),
          service("prod", "a", {{.ip = "10.1.0.1"}}), service("prod", "b", {{.ip = "10.1.0.2"}})}));
  WatchClient c(channel_);
  ASSERT_TRUE(c.subscribe({{"default", "web", 0}}));
  EXPECT_EQ(c.read().services_size(), 1);
  ASSERT_TRUE(c.subscribe({{"prod", "", 0}}));
  auto r = c.read();
  EXPECT_TRUE(r.full());
  ASSERT_EQ(r.services_size(), 2);
  EXPECT_EQ(r.services(0).namespace_(), "prod");
  ASSERT_TRUE(c.subscribe({}, /*all=*/true));
  EXPECT_EQ(c.read().services_size(), 3);
  // Port selectors keep only that port.
  ASSERT_TRUE(c.subscribe({{"default", "web", 443}}));
  auto p = c.read();
  ASSERT_EQ(p.services_size(), 1);
  EXPECT_EQ(p.services(0).ports_size(), 0);
  EXPECT_TRUE(c.close().ok());
}

TEST_F(Watch, UnknownServiceIsEmptyAndFillsInWhenItAppears) {
  start();
  publish(snapshot(1, {}));
  WatchClient c(channel_);
  ASSERT_TRUE(c.subscribe({{"default", "later", 0}}));
  auto r = c.read();
  EXPECT_TRUE(r.full());
  EXPECT_EQ(r.services_size(), 0);
  publish(snapshot(2, {service("default", "later", {{.ip = "10.0.0.9"}})}));
  auto r2 = c.read();
  EXPECT_FALSE(r2.full());
  ASSERT_EQ(r2.services_size(), 1);
  EXPECT_EQ(r2.services(0).name(), "later");
  EXPECT_TRUE(c.close().ok());
}

TEST_F(Watch, AppliedWaitsForEverySubscriberAndDropsOnesThatLeave) {
  start();
  auto web = [](const char* ip) { return service("default", "web", {{.ip = ip}}); };
  publish(snapshot(1, {web("10.0.0.1")}));
  WatchClient a(channel_), b(channel_);
  ASSERT_TRUE(a.subscribe({{"default", "web", 0}}));
  ASSERT_TRUE(b.subscribe({}, true));
  EXPECT_EQ(a.read().version(), 1u);
  EXPECT_EQ(b.read().version(), 1u);
  ASSERT_TRUE(eventually([&] { return sink_->subscribers().size() == 2; }));

  publish(snapshot(2, {web("10.0.0.2")}));
  EXPECT_EQ(a.read().version(), 2u);
  EXPECT_EQ(b.read().version(), 2u);
  ASSERT_TRUE(a.ack(2));
  ASSERT_TRUE(eventually([&] {
    for (const auto& s : sink_->subscribers())
      if (s.client == "test" && s.acked_version == 2) return true;
    return false;
  }));
  EXPECT_LT(board_generation(), 2u);  // b has not acknowledged
  ASSERT_TRUE(b.ack(2));
  EXPECT_TRUE(eventually([&] { return board_generation() == 2; }));

  publish(snapshot(3, {web("10.0.0.3")}));
  EXPECT_EQ(a.read().version(), 3u);
  EXPECT_EQ(b.read().version(), 3u);
  ASSERT_TRUE(a.ack(3));
  EXPECT_EQ(board_generation(), 2u);
  b.ctx().TryCancel();  // b goes away without acknowledging: it stops counting
  EXPECT_TRUE(eventually([&] { return board_generation() == 3; }));
  EXPECT_EQ(metric("endpointd_feed_applied_generation"), 3);
  EXPECT_TRUE(a.close().ok());
}

TEST_F(Watch, BogusAckIsCountedAndIgnored) {
  start();
  publish(snapshot(1, {service("default", "web", {{.ip = "10.0.0.1"}})}));
  WatchClient c(channel_);
  ASSERT_TRUE(c.subscribe({{"default", "web", 0}}));
  c.read();
  ASSERT_TRUE(c.ack(99));
  EXPECT_TRUE(
      eventually([&] { return metric("endpointd_feed_rejected_total", "invalid_ack") == 1; }));
  EXPECT_EQ(board_generation(), 1u);  // joined at 1; 99 was never sent
  ASSERT_TRUE(c.ack(1));
  // A version between two it was sent, which it never was (there is no generation 2): refused,
  // and it moves nothing.
  publish(snapshot(3, {service("default", "web", {{.ip = "10.0.0.3"}})}));
  EXPECT_EQ(c.read().version(), 3u);
  ASSERT_TRUE(c.ack(2));
  EXPECT_TRUE(
      eventually([&] { return metric("endpointd_feed_rejected_total", "invalid_ack") == 2; }));
  for (const auto& r : sink_->subscribers()) EXPECT_EQ(r.acked_version, 1u);
  EXPECT_EQ(board_generation(), 1u);
  ASSERT_TRUE(c.ack(1));  // a repeat of one it acknowledged: harmless, not counted
  ASSERT_TRUE(c.ack(3));
  EXPECT_TRUE(eventually([&] { return board_generation() == 3; }));
  EXPECT_EQ(metric("endpointd_feed_rejected_total", "invalid_ack"), 2);
  EXPECT_TRUE(c.close().ok());
}

TEST_F(Watch, SlowSubscriberIsCoalescedToTheNewestState) {
  start();
  // Big updates, so a client that does not read fills the flow-control window quickly.
  auto big = [](int g) {
    std::vector<testing::Ep> eps;
    for (int i = 0; i < 2000; ++i)
      eps.push_back({.ip = "10." + std::to_string(g % 250) + "." + std::to_string(i / 250) + "." +
                           std::to_string(i % 250 + 1)});
    return service("default", "web", eps);
  };
  publish(snapshot(1, {big(1)}));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 65536);
  auto ch = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(sink_->port()),
                                      grpc::InsecureChannelCredentials(), args);
  WatchClient c(ch);
  ASSERT_TRUE(c.subscribe({{"default", "web", 0}}));
  ASSERT_TRUE(eventually([&] { return sink_->subscribers().size() == 1; }));
  constexpr uint64_t kLast = 60;
  for (uint64_t g = 2; g <= kLast; ++g) publish(snapshot(g, {big(static_cast<int>(g))}));
  // Now read: far fewer responses than snapshots, the last one the newest state.
  int responses = 0;
  uint64_t version = 0;
  while (version != kLast) {
    auto r = c.read();
    ++responses;
    ASSERT_GT(r.version(), version);
    version = r.version();
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_LT(responses, 20);
  EXPECT_GT(metric("endpointd_feed_coalesced_total"), 0);
  ASSERT_TRUE(c.ack(kLast));
  EXPECT_TRUE(eventually([&] { return board_generation() == kLast; }));
  EXPECT_TRUE(c.close().ok());
}

TEST_F(Watch, StreamLimitRefusesWithResourceExhausted) {
  FeedOptions o;
  o.max_streams = 2;
  start(o);
  publish(snapshot(1, {}));
  WatchClient a(channel_), b(channel_);
  ASSERT_TRUE(a.subscribe({}, true));
  ASSERT_TRUE(b.subscribe({}, true));
  a.read();
  b.read();
  WatchClient c(channel_);
  c.subscribe({}, true);
  auto st = c.finish_after_error();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(metric("endpointd_feed_rejected_total", "too_many_streams"), 1);
  // The others carry on.
  publish(snapshot(2, {service("default", "web", {{.ip = "10.0.0.1"}})}));
  EXPECT_EQ(a.read().version(), 2u);
  EXPECT_EQ(b.read().version(), 2u);
  EXPECT_TRUE(a.close().ok());
  EXPECT_TRUE(b.close().ok());
}

TEST_F(Watch, InvalidSubscribeAndMalformedBytesAreRefusedAlone) {
  start();
  publish(snapshot(1, {service("default", "web", {{.ip = "10.0.0.1"}})}));
  WatchClient good(channel_);
  ASSERT_TRUE(good.subscribe({{"default", "web", 0}}));
  good.read();

  WatchClient bad(channel_);
  bad.subscribe({{"", "web", 0}});
  EXPECT_EQ(bad.finish_after_error().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(metric("endpointd_feed_rejected_total", "invalid_subscribe"), 1);

  // Bytes that are no WatchRequest.
  grpc::Status st = send_junk("/endpointd.v1.UpstreamFeed/Watch");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(metric("endpointd_feed_rejected_total", "malformed"), 1);

  publish(snapshot(2, {service("default", "web", {{.ip = "10.0.0.2"}})}));
  EXPECT_EQ(good.read().version(), 2u);
  EXPECT_TRUE(good.close().ok());
}

TEST_F(Watch, HealthServiceAnswersServing) {
  start();
  grpc::GenericStub generic(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer req;  // HealthCheckRequest{} is zero bytes
  grpc::Slice empty("");
  req = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer resp;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                    [&](grpc::Status s) { done.set_value(s); });
  auto st = done.get_future().get();
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(resp.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(s.begin(), s.end());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

}  // namespace
}  // namespace endpointd::feed
