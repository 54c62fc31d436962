// Snapshots and a running feed for the feed tests.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "feed/feed.h"
#include "model/snapshot.h"
#include "pipeline/ack_board.h"

namespace endpointd::feed::testing {

struct Ep {
  std::string ip;
  bool ready = true;
  bool serving = true;
  bool terminating = false;
  std::string zone = "zone-a";
  uint16_t port = 8080;
};

inline model::ServiceStatePtr service(const std::string& ns, const std::string& name,
                                      std::vector<Ep> eps, uint16_t port = 80) {
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = {ns, name};
  st->service.cluster_ips = {*model::IpAddr::parse("10.96.0.10")};
  model::ServicePort sp;
  sp.name = "http";
  sp.port = port;
  sp.target_port_name = "http";
  st->service.ports.push_back(sp);
  for (const auto& e : eps) {
    model::MergedEndpoint m;
    m.address = *model::IpAddr::parse(e.ip);
    m.conditions = {e.ready, e.serving, e.terminating};
    m.ports.push_back({"http", model::Protocol::kTCP, e.port, ""});
    m.zone = e.zone;
    m.node_name = "node-" + e.zone;
    m.hostname = "";
    m.target_ref = model::ObjectRef{"Pod", ns, name + "-" + e.ip, "uid-" + e.ip};
    st->endpoints.push_back(m);
  }
  std::sort(st->endpoints.begin(), st->endpoints.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  return st;
}

inline model::SnapshotPtr snapshot(uint64_t g, std::vector<model::ServiceStatePtr> services) {
  auto s = std::make_shared<model::Snapshot>();
  s->generation = g;
  s->synced = true;
  std::sort(services.begin(), services.end(),
            [](const auto& a, const auto& b) { return a->key() < b->key(); });
  s->services = std::move(services);
  return s;
}

// Polls `pred` until it holds or two seconds pass; for state that another thread moves
// (acknowledgements arrive on gRPC's threads).
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

class FeedFixture : public ::testing::Test {
 protected:
  void start(FeedOptions opts = {}) {
    opts.listen = "127.0.0.1:0";
    sink_ = std::make_unique<FeedSink>(opts, &board_, &registry_);
    auto st = sink_->start();
    ASSERT_TRUE(st) << st.error();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(sink_->port()),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (sink_) sink_->stop();
  }
  void publish(const model::SnapshotPtr& s) { sink_->apply(s, model::Delta{}); }
  // A sample of a metric family in the registry, by one label's value (empty: unlabelled).
  double metric(const std::string& family, const std::string& label_value = "") {
    for (const auto& f : registry_.Collect()) {
      if (f.name != family) continue;
      for (const auto& m : f.metric) {
        bool match = label_value.empty() ? m.label.empty()
                                         : (!m.label.empty() && m.label[0].value == label_value);
        if (!match) continue;
        return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
      }
    }
    return -1;
  }
  // Opens a bidirectional stream of `method`, writes bytes that are no protobuf message (a
  // length-delimited field longer than the buffer) and returns how the server ended it.
  grpc::Status send_junk(const std::string& method) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    auto call = generic.PrepareCall(&ctx, method, &cq);
    int start_tag = 0, write_tag = 0, finish_tag = 0;
    void* tag;
    bool ok;
    grpc::Status st(grpc::StatusCode::UNKNOWN, "the test's call never finished");
    call->StartCall(&start_tag);
    if (cq.Next(&tag, &ok)) {
      grpc::Slice junk(std::string("\x0a\xff\xff\xff\xff\x0f", 6));
      grpc::ByteBuffer buf(&junk, 1);
      call->Write(buf, &write_tag);
      cq.Next(&tag, &ok);
      call->Finish(&st, &finish_tag);
      cq.Next(&tag, &ok);
    }
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return st;
  }
  uint64_t board_generation() {
    for (const auto& e : board_.entries())
      if (e.consumer == "feed") return e.generation();
    return 0;
  }

  pipeline::AckBoard board_;
  prometheus::Registry registry_;
  std::unique_ptr<FeedSink> sink_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace endpointd::feed::testing
