// gRPC's own xDS client (the xds:/// resolver, bootstrapped at endpointd's feed) making real
// RPCs to backends on loopback, following an endpoint that drains away and one that comes,
// without a failed RPC.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "echo.grpc.pb.h"
#include "fixture.h"

namespace endpointd::feed {
namespace {

using testing::eventually;
using testing::FeedFixture;
using testing::snapshot;

class EchoService final : public endpointd::testing::Echo::Service {
 public:
  explicit EchoService(std::string name) : name_(std::move(name)) {}
  grpc::Status Who(grpc::ServerContext*, const endpointd::testing::WhoRequest*,
                   endpointd::testing::WhoReply* reply) override {
    reply->set_backend(name_);
    return grpc::Status::OK;
  }

 private:
  std::string name_;
};

struct Backend {
  std::string ip;
  int port = 0;
  std::unique_ptr<EchoService> service;
  std::unique_ptr<grpc::Server> server;
};

std::unique_ptr<Backend> start_backend(const std::string& ip) {
  auto b = std::make_unique<Backend>();
  b->ip = ip;
  b->service = std::make_unique<EchoService>(ip);
  grpc::ServerBuilder sb;
  sb.AddListeningPort(ip + ":0", grpc::InsecureServerCredentials(), &b->port);
  sb.RegisterService(b->service.get());
  b->server = sb.BuildAndStart();
  EXPECT_NE(b->port, 0) << "cannot listen on " << ip;
  return b;
}

model::ServiceStatePtr web(const std::vector<std::pair<const Backend*, bool>>& backends) {
  std::vector<testing::Ep> eps;
  for (const auto& [b, terminating] : backends)
    eps.push_back({.ip = b->ip,
                   .ready = !terminating,
                   .serving = true,
                   .terminating = terminating,
                   .port = static_cast<uint16_t>(b->port)});
  return testing::service("default", "web", eps);
}

class Proxyless : public FeedFixture {};

TEST_F(Proxyless, FollowsDrainAndAddWithoutAFailedRpc) {
  start();
  auto a = start_backend("127.0.0.2");
  auto b = start_backend("127.0.0.3");
  auto c = start_backend("127.0.0.4");
  publish(snapshot(1, {web({{a.get(), false}, {b.get(), false}})}));

  const std::string bootstrap =
      R"({"xds_servers":[{"server_uri":"127.0.0.1:)" + std::to_string(sink_->port()) +
      R"(","channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],)"
      R"("node":{"id":"proxyless-test","locality":{"zone":"zone-a"}}})";
  setenv("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap.c_str(), 1);
  auto ch = grpc::CreateChannel("xds:///web.default.svc.cluster.local:80",
                                grpc::InsecureChannelCredentials());
  auto stub = endpointd::testing::Echo::NewStub(ch);

  {  // the first RPC waits for LDS → RDS → CDS → EDS and a connection
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    endpointd::testing::WhoReply reply;
    auto st = stub->Who(&ctx, {}, &reply);
    ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
  }

  std::mutex mu;
  std::map<std::string, int> hits;
  std::atomic<int> failures{0}, calls{0};
  std::string last_error;
  std::atomic<bool> stop{false};
  std::thread load([&] {
    while (!stop) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      endpointd::testing::WhoReply reply;
      auto st = stub->Who(&ctx, {}, &reply);
      std::lock_guard lock(mu);
      ++calls;
      if (st.ok()) {
        ++hits[reply.backend()];
      } else {
        ++failures;
        last_error = st.error_message();
      }
    }
  });
  auto reset = [&] {
    std::lock_guard lock(mu);
    hits.clear();
  };
  auto hit = [&](const std::string& ip) {
    std::lock_guard lock(mu);
    return hits.count(ip) ? hits[ip] : 0;
  };
  auto total = [&] {
    std::lock_guard lock(mu);
    int n = 0;
    for (auto& [k, v] : hits) n += v;
    return n;
  };

  // Round robin over both.
  EXPECT_TRUE(eventually([&] { return hit(a->ip) > 10 && hit(b->ip) > 10; }));
  EXPECT_TRUE(eventually([&] { return board_generation() == 1; }));

  // b terminates (still serving): DRAINING in EDS; once the client acknowledged it, b gets
  // no new RPCs while it is still up.
  publish(snapshot(2, {web({{a.get(), false}, {b.get(), true}})}));
  ASSERT_TRUE(eventually([&] { return board_generation() == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // in-flight picks settle
  reset();
  EXPECT_TRUE(eventually([&] { return total() > 200; }));
  EXPECT_EQ(hit(b->ip), 0);
  b->server->Shutdown();

  // c arrives: it is used as soon as it is connected.
  publish(snapshot(3, {web({{a.get(), false}, {c.get(), false}})}));
  EXPECT_TRUE(eventually([&] { return board_generation() == 3; }));
  reset();
  EXPECT_TRUE(eventually([&] { return hit(c->ip) > 10 && hit(a->ip) > 10; }));

  stop = true;
  load.join();
  EXPECT_EQ(failures.load(), 0) << last_error;
  EXPECT_GT(calls.load(), 300);
  auto subs = sink_->subscribers();
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_EQ(subs[0].api, "ads");
  EXPECT_EQ(subs[0].client, "proxyless-test");
  EXPECT_EQ(subs[0].nacks, 0u) << subs[0].last_nack;
  a->server->Shutdown();
  c->server->Shutdown();
}

}  // namespace
}  // namespace endpointd::feed
