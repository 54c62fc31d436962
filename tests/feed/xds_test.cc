// The aggregated discovery service, driven by a hand-written xDS client: state of the world
// and delta, ACK/NACK by nonce, bad input.
#include <gtest/gtest.h>

#include "envoy/config/cluster/v3/cluster.pb.h"
#include "envoy/config/endpoint/v3/endpoint.pb.h"
#include "envoy/service/discovery/v3/discovery.grpc.pb.h"
#include "feed/resources.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

namespace disc = envoy::service::discovery::v3;
using envoy::config::endpoint::v3::ClusterLoadAssignment;
using testing::eventually;
using testing::FeedFixture;
using testing::service;
using testing::snapshot;

const std::string kEds(kEndpointType);
const std::string kCds(kClusterType);
const std::string kWeb = "outbound|80||web.default.svc.cluster.local";

template <typename Req, typename Resp>
class Stream {
 public:
  Stream(const std::shared_ptr<grpc::Channel>& ch, bool delta)
      : stub_(disc::AggregatedDiscoveryService::NewStub(ch)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if constexpr (std::is_same_v<Req, disc::DiscoveryRequest>) {
      (void)delta;
      stream_ = stub_->StreamAggregatedResources(&ctx_);
    } else {
      stream_ = stub_->DeltaAggregatedResources(&ctx_);
    }
  }
  bool write(const Req& r) { return stream_->Write(r); }
  Resp read() {
    Resp r;
    EXPECT_TRUE(stream_->Read(&r));
    return r;
  }
  grpc::Status close() {
    stream_->WritesDone();
    Resp r;
    while (stream_->Read(&r)) {
    }
    return stream_->Finish();
  }

 private:
  std::unique_ptr<disc::AggregatedDiscoveryService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<Req, Resp>> stream_;
};
using Sotw = Stream<disc::DiscoveryRequest, disc::DiscoveryResponse>;
using Delta = Stream<disc::DeltaDiscoveryRequest, disc::DeltaDiscoveryResponse>;

disc::DiscoveryRequest request(const std::string& type, std::vector<std::string> names,
                               const disc::DiscoveryResponse* answering = nullptr) {
  disc::DiscoveryRequest r;
  r.set_type_url(type);
  r.mutable_node()->set_id("test-node");
  for (auto& n : names) r.add_resource_names(n);
  if (answering) {
    r.set_version_info(answering->version_info());
    r.set_response_nonce(answering->nonce());
  }
  return r;
}

ClusterLoadAssignment cla(const disc::DiscoveryResponse& r, int i = 0) {
  ClusterLoadAssignment c;
  EXPECT_TRUE(r.resources(i).UnpackTo(&c));
  return c;
}

size_t endpoint_count(const ClusterLoadAssignment& c) {
  size_t n = 0;
  for (const auto& l : c.endpoints()) n += l.lb_endpoints_size();
  return n;
}

using Xds = FeedFixture;

TEST_F(Xds, ClustersThenEndpointsWithAcks) {
  start();
  publish(snapshot(1, {service("default", "web", {{.ip = "10.0.0.1"}, {.ip = "10.0.0.2"}}),
                       service("default", "api", {{.ip = "10.0.1.1"}}, 8080)}));
  Sotw s(channel_, false);
  ASSERT_TRUE(s.write(request(kCds, {})));  // wildcard
  auto cds = s.read();
  EXPECT_EQ(cds.type_url(), kCds);
  EXPECT_EQ(cds.version_info(), "1");
  ASSERT_EQ(cds.resources_size(), 2);
  envoy::config::cluster::v3::Cluster c;
  ASSERT_TRUE(cds.resources(0).UnpackTo(&c));
  EXPECT_EQ(c.name(), "outbound|8080||api.default.svc.cluster.local");
  ASSERT_TRUE(s.write(request(kCds, {}, &cds)));  // ACK

  ASSERT_TRUE(s.write(request(kEds, {kWeb})));
  auto eds = s.read();
  EXPECT_EQ(eds.type_url(), kEds);
  ASSERT_EQ(eds.resources_size(), 1);
  EXPECT_EQ(endpoint_count(cla(eds)), 2u);
  EXPECT_EQ(board_generation(), 1u);

  // An endpoint starts terminating: DRAINING, and applied(2) only after the ACK.
  publish(snapshot(
      2, {service("default", "web",
                  {{.ip = "10.0.0.1"}, {.ip = "10.0.0.2", .ready = false, .terminating = true}}),
          service("default", "api", {{.ip = "10.0.1.1"}}, 8080)}));
  auto eds2 = s.read();  // CDS did not change: only EDS is sent
  EXPECT_EQ(eds2.type_url(), kEds);
  EXPECT_EQ(eds2.version_info(), "2");
  EXPECT_EQ(cla(eds2).endpoints(0).lb_endpoints(1).health_status(),
            envoy::config::core::v3::DRAINING);
  EXPECT_EQ(board_generation(), 1u);
  ASSERT_TRUE(s.write(request(kEds, {kWeb}, &eds2)));
  EXPECT_TRUE(eventually([&] { return board_generation() == 2; }));
  EXPECT_TRUE(s.close().ok());
}

TEST_F(Xds, NackIsReportedAndNeverCountedAsAck) {
  start();
  publish(snapshot(1, {service("default", "web", {{.ip = "10.0.0.1"}})}));
  Sotw s(channel_, false);
  ASSERT_TRUE(s.write(request(kEds, {kWeb})));
  auto r1 = s.read();
  ASSERT_TRUE(s.write(request(kEds, {kWeb}, &r1)));
  publish(snapshot(2, {service("default", "web", {{.ip = "10.0.0.2"}})}));
  auto r2 = s.read();
  auto nack = request(kEds, {kWeb}, &r2);
  nack.set_version_info(r1.version_info());  // a NACK carries the last accepted version
  nack.mutable_error_detail()->set_code(3);
  nack.mutable_error_detail()->set_message("endpoint rejected");
  ASSERT_TRUE(s.write(nack));
  EXPECT_TRUE(eventually([&] { return metric("endpointd_feed_nacks_total", "ads") == 1; }));
  auto subs = sink_->subscribers();
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_EQ(subs[0].nacks, 1u);
  EXPECT_EQ(subs[0].last_nack, "eds: endpoint rejected");
  EXPECT_EQ(board_generation(), 1u);
  EXPECT_TRUE(s.close().ok());
}

TEST_F(Xds, StaleNonceAndUnknownTypeAndBadNames) {
  start();
  publish(snapshot(1, {service("default", "web", {{.ip = "10.0.0.1"}})}));
  Sotw s(channel_, false);
  ASSERT_TRUE(s.write(request(kEds, {kWeb})));
  auto r1 = s.read();
  auto stale = request(kEds, {kWeb});
  stale.set_response_nonce("not-a-nonce");
  ASSERT_TRUE(s.write(stale));
  EXPECT_TRUE(
      eventually([&] { return metric("endpointd_feed_rejected_total", "stale_nonce") == 1; }));
  EXPECT_EQ(sink_->subscribers()[0].acked_version, 0u);

  ASSERT_TRUE(s.write(request("type.googleapis.com/envoy.example.Nothing", {"x"})));
  auto u = s.read();
  EXPECT_EQ(u.type_url(), "type.googleapis.com/envoy.example.Nothing");
  EXPECT_EQ(u.resources_size(), 0);
  EXPECT_EQ(metric("endpointd_feed_rejected_total", "unknown_type"), 1);

  ASSERT_TRUE(s.write(request(kEds, {kWeb, "no-such-name"}, &r1)));
  auto r2 = s.read();  // the subscription changed: answered, the bad name left out
  EXPECT_EQ(r2.resources_size(), 1);
  EXPECT_EQ(metric("endpointd_feed_rejected_total", "bad_resource_name"), 1);
  EXPECT_TRUE(s.close().ok());
}

// One stream may not grow the agent without bound: past 8 type URLs, or 100,000 names of one
// type, it ends with RESOURCE_EXHAUSTED (counted); another stream is untouched.
TEST_F(Xds, AStreamPastItsLimitsEndsAloneWithResourceExhausted) {
  start();
  publish(snapshot(1, {service("default", "web", {{.ip = "10.0.0.1"}})}));
  Sotw good(channel_, false);
  ASSERT_TRUE(good.write(request(kEds, {kWeb})));
  auto r1 = good.read();

  Sotw types(channel_, false);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(types.write(request("type.googleapis.com/example.T" + std::to_string(i), {})));
    types.read();
  }
  types.write(request("type.googleapis.com/example.T8", {}));
  grpc::Status st = types.close();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("type URLs"), std::string::npos) << st.error_message();

  Sotw names(channel_, false);
  std::vector<std::string> many;
  for (int i = 0; i <= 100000; ++i) many.push_back(std::to_string(i));
  names.write(request(kEds, many));
  st = names.close();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_EQ(metric("endpointd_feed_rejected_total", "stream_limit"), 2);

  // The good stream acks and gets the next change.
  ASSERT_TRUE(good.write(request(kEds, {kWeb}, &r1)));
  publish(snapshot(2, {service("default", "web", {{.ip = "10.0.0.2"}})}));
  EXPECT_EQ(good.read().version_info(), "2");
  EXPECT_TRUE(good.close().ok());
}

TEST_F(Xds, MalformedBytesEndOnlyThatStreamWithInvalidArgument) {
  start();
  publish(snapshot(1, {service("default", "web", {{.ip = "10.0.0.1"}})}));
  Sotw good(channel_, false);
  ASSERT_TRUE(good.write(request(kEds, {kWeb})));
  auto r1 = good.read();
  ASSERT_EQ(r1.resources_size(), 1);

  for (const char* method :
       {"/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"}) {
    grpc::Status st = send_junk(method);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_NE(st.error_message().find("malformed"), std::string::npos) << st.error_message();
  }
  EXPECT_EQ(metric("endpointd_feed_rejected_total", "malformed"), 2);

  // The good stream is untouched: it acks and gets the next change.
  ASSERT_TRUE(good.write(request(kEds, {kWeb}, &r1)));
  publish(snapshot(2, {service("default", "web", {{.ip = "10.0.0.2"}})}));
  auto r2 = good.read();
  EXPECT_EQ(r2.version_info(), "2");
  EXPECT_TRUE(good.close().ok());
}

TEST_F(Xds, MissingServiceIsEmptyAndFillsIn) {
  start();
  publish(snapshot(1, {}));
  Sotw s(channel_, false);
  ASSERT_TRUE(s.write(request(kEds, {kWeb})));
  auto r1 = s.read();
  ASSERT_EQ(r1.resources_size(), 1);
  EXPECT_EQ(cla(r1).cluster_name(), kWeb);
  EXPECT_EQ(endpoint_count(cla(r1)), 0u);
  ASSERT_TRUE(s.write(request(kEds, {kWeb}, &r1)));
  publish(snapshot(2, {service("default", "web", {{.ip = "10.0.0.1"}})}));
  auto r2 = s.read();
  EXPECT_EQ(endpoint_count(cla(r2)), 1u);
  EXPECT_TRUE(s.close().ok());
}

TEST_F(Xds, DeltaSendsOnlyWhatChanged) {
  start();
  publish(snapshot(1, {service("default", "web", {{.ip = "10.0.0.1"}}),
                       service("default", "api", {{.ip = "10.0.1.1"}})}));
  const std::string api = "outbound|80||api.default.svc.cluster.local";
  Delta d(channel_, true);
  disc::DeltaDiscoveryRequest sub;
  sub.set_type_url(kEds);
  sub.add_resource_names_subscribe(kWeb);
  sub.add_resource_names_subscribe(api);
  ASSERT_TRUE(d.write(sub));
  auto r1 = d.read();
  EXPECT_EQ(r1.resources_size(), 2);
  disc::DeltaDiscoveryRequest ack;
  ack.set_type_url(kEds);
  ack.set_response_nonce(r1.nonce());
  ASSERT_TRUE(d.write(ack));
  EXPECT_TRUE(eventually([&] { return sink_->subscribers()[0].acked_version == 1; }));

  publish(snapshot(2, {service("default", "web", {{.ip = "10.0.0.2"}}),
                       service("default", "api", {{.ip = "10.0.1.1"}})}));
  auto r2 = d.read();
  ASSERT_EQ(r2.resources_size(), 1);
  EXPECT_EQ(r2.resources(0).name(), kWeb);
  EXPECT_FALSE(r2.resources(0).version().empty());
  ack.set_response_nonce(r2.nonce());
  ASSERT_TRUE(d.write(ack));
  EXPECT_TRUE(eventually([&] { return board_generation() == 2; }));

  // Cluster watch over delta: the api service goes away → removed.
  disc::DeltaDiscoveryRequest cds;
  cds.set_type_url(kCds);
  ASSERT_TRUE(d.write(cds));  // first CDS request without names: wildcard
  auto c1 = d.read();
  EXPECT_EQ(c1.type_url(), kCds);
  EXPECT_EQ(c1.resources_size(), 2);
  cds.set_response_nonce(c1.nonce());
  ASSERT_TRUE(d.write(cds));
  publish(snapshot(3, {service("default", "web", {{.ip = "10.0.0.2"}})}));
  bool saw_removal = false;
  for (int i = 0; i < 2 && !saw_removal; ++i) {
    auto r = d.read();
    if (r.type_url() == kCds) {
      ASSERT_EQ(r.removed_resources_size(), 1);
      EXPECT_EQ(r.removed_resources(0), api);
      saw_removal = true;
    }
  }
  EXPECT_TRUE(saw_removal);
  EXPECT_TRUE(d.close().ok());
}

}  // namespace
}  // namespace endpointd::feed
