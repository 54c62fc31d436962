// endpointd-haproxy's end of endpointd.v1.UpstreamFeed/Watch: one stream at a time on its own
// thread, opened again with backoff when it ends. A stream's state is published once its
// full response arrived, so until then the previous stream's state stays in force.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "adapters/haproxy/adapter.h"
#include "adapters/haproxy/metrics.h"
#include "endpointd/v1/feed.grpc.pb.h"

namespace endpointd::haproxy {

class FeedClient {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::string target;  // gRPC target, e.g. "127.0.0.1:9470"
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    v1::Subscribe subscribe;
    std::chrono::milliseconds min_backoff{250};
    std::chrono::milliseconds max_backoff{10000};
  };
  // The newest state of the current stream. `stream` numbers the streams, `seq` the
  // responses received over all of them.
  struct View {
    uint64_t stream = 0;
    uint64_t seq = 0;
    FeedState state;
  };

  FeedClient(Options opts, Metrics& metrics);
  ~FeedClient();
  FeedClient(const FeedClient&) = delete;
  FeedClient& operator=(const FeedClient&) = delete;

  void start();
  // Ends the stream and the thread; wakes wait().
  void stop();

  // Waits until a response newer than `seen_seq` arrived (returns the view), the deadline
  // passed or stop() was called (nullopt).
  std::optional<View> wait(uint64_t seen_seq, Clock::time_point deadline);
  // Sends Ack{version} on stream `stream`, if that stream is still open. False when it is
  // not (the version is then acknowledged on a later stream, after its full response).
  bool ack(uint64_t stream, uint64_t version);

 private:
  void run();
  // One stream, until it ends. True when it received at least one response.
  bool run_stream(uint64_t id);

  Options opts_;
  Metrics& metrics_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::UpstreamFeed::Stub> stub_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;  // view_, and the backoff sleep
  std::condition_variable cv_;
  View view_;

  std::mutex ctx_mu_;  // the open stream's context, for stop() to cancel it
  grpc::ClientContext* ctx_ = nullptr;

  std::mutex write_mu_;  // the open stream, for acks from the sync loop
  grpc::ClientReaderWriter<v1::WatchRequest, v1::WatchResponse>* stream_ = nullptr;
  uint64_t stream_id_ = 0;
};

}  // namespace endpointd::haproxy
