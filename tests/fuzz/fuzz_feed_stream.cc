// libFuzzer target: whole feed streams against a running FeedSink (loopback, port 0), so every
// request goes through what the streams do with it: WatchRequest subscriptions and acks;
// DiscoveryRequest and DeltaDiscoveryRequest type URLs, resource names, nonces, ACKs and NACKs,
// and the responses they cause. Input: the API (first byte), then messages, each behind a
// two-byte little-endian length. Whatever the client says, the server must end the stream with
// OK or INVALID_ARGUMENT, within the call's deadline.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "feed/feed.h"
#include "model/snapshot.h"

namespace {

using namespace endpointd;

model::ServiceStatePtr service(const std::string& ns, const std::string& name, uint16_t port) {
  auto s = std::make_shared<model::ServiceState>();
  s->service.key = {ns, name};
  s->service.cluster_ips = {*model::IpAddr::parse("10.96.0.10")};
  model::ServicePort sp;
  sp.name = "http";
  sp.port = port;
  sp.target_port_name = "http";
  s->service.ports.push_back(sp);
  for (const char* ip : {"10.1.0.1", "10.1.0.2"}) {
    model::MergedEndpoint m;
    m.address = *model::IpAddr::parse(ip);
    bool first = ip[7] == '1';
    m.conditions = {first, true, !first};
    m.ports.push_back({"http", model::Protocol::kTCP, 8080, ""});
    m.zone = first ? "zone-a" : "zone-b";
    m.node_name = "node-a";
    m.target_ref = model::ObjectRef{"Pod", ns, name + "-" + ip, "uid"};
    s->endpoints.push_back(m);
  }
  return s;
}

struct Feed {
  std::unique_ptr<feed::FeedSink> sink;
  std::unique_ptr<grpc::GenericStub> stub;

  Feed() {
    feed::FeedOptions opts;
    opts.listen = "127.0.0.1:0";
    opts.fanout_threads = 1;
    sink = std::make_unique<feed::FeedSink>(opts, nullptr, nullptr);
    if (!sink->start()) std::abort();
    auto snap = std::make_shared<model::Snapshot>();
    snap->generation = 1;
    snap->synced = true;
    snap->services = {service("default", "db", 5432), service("default", "web", 80)};
    sink->apply(snap, model::Delta{});
    stub = std::make_unique<grpc::GenericStub>(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(sink->port()), grpc::InsecureChannelCredentials()));
  }
};

Feed& feed_server() {
  static Feed* f = new Feed();  // lives as long as the process: streams may outlast an input
  return *f;
}

constexpr const char* kMethods[] = {
    "/endpointd.v1.UpstreamFeed/Watch",
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // an error line per invalid UTF-8 string
  spdlog::set_level(spdlog::level::off);     // a warning per malformed request
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 64 * 1024) return 0;
  Feed& f = feed_server();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::CompletionQueue cq;
  auto call = f.stub->PrepareCall(&ctx, kMethods[data[0] % 3], &cq);
  void* tag;
  bool ok = false;
  call->StartCall(nullptr);
  cq.Next(&tag, &ok);
  // The messages in order, then a half-close; the responses are read after (they are small,
  // so flow control never holds the server's writes meanwhile).
  grpc::ByteBuffer in;
  for (size_t off = 1; ok && off + 2 <= size;) {
    size_t len = data[off] | static_cast<size_t>(data[off + 1]) << 8;
    off += 2;
    if (len > size - off) len = size - off;
    grpc::Slice slice(data + off, len);
    off += len;
    grpc::ByteBuffer msg(&slice, 1);
    call->Write(msg, nullptr);
    cq.Next(&tag, &ok);
  }
  if (ok) {
    call->WritesDone(nullptr);
    cq.Next(&tag, &ok);
  }
  for (ok = true; ok;) {  // whatever the server still sends, until it ends the stream
    call->Read(&in, nullptr);
    cq.Next(&tag, &ok);
  }
  grpc::Status st;
  call->Finish(&st, nullptr);
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (st.error_code() != grpc::StatusCode::OK &&
      st.error_code() != grpc::StatusCode::INVALID_ARGUMENT)
    __builtin_trap();
  return 0;
}
