// The feed stream loop: subscribe, fold responses, publish complete states, reconnect.
#include "adapters/haproxy/feed_client.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace endpointd::haproxy {

FeedClient::FeedClient(Options opts, Metrics& metrics) : opts_(std::move(opts)), metrics_(metrics) {
  grpc::ChannelArguments args;
  // A feed that went away without closing the connection is noticed within 40 s.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetMaxReceiveMessageSize(16 << 20);  // the feed's own limit
  channel_ = grpc::CreateCustomChannel(opts_.target, opts_.credentials, args);
  stub_ = v1::UpstreamFeed::NewStub(channel_);
}

FeedClient::~FeedClient() {
  stop();
}

void FeedClient::start() {
  thread_ = std::thread([this] { run(); });
}

void FeedClient::stop() {
  stopping_ = true;
  {
    std::lock_guard lock(mu_);
    cv_.notify_all();
  }
  {
    std::lock_guard lock(ctx_mu_);
    if (ctx_) ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

std::optional<FeedClient::View> FeedClient::wait(uint64_t seen_seq, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return stopping_ || view_.seq > seen_seq; });
  if (stopping_ || view_.seq <= seen_seq) return std::nullopt;
  return view_;
}

bool FeedClient::ack(uint64_t stream, uint64_t version) {
  std::lock_guard lock(write_mu_);
  if (!stream_ || stream_id_ != stream) return false;
  v1::WatchRequest req;
  req.mutable_ack()->set_version(version);
  return stream_->Write(req);
}

void FeedClient::run() {
  auto backoff = opts_.min_backoff;
  for (uint64_t id = 1; !stopping_; ++id) {
    metrics_.feed_streams.Increment();
    if (run_stream(id)) backoff = opts_.min_backoff;
    if (stopping_) break;
    metrics_.feed_stream_errors.Increment();
    spdlog::warn("feed {}: reconnecting in {} ms", opts_.target, backoff.count());
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, backoff, [&] { return stopping_.load(); });
    backoff = std::min(backoff * 2, opts_.max_backoff);
  }
}

bool FeedClient::run_stream(uint64_t id) {
  grpc::ClientContext ctx;
  {
    std::lock_guard lock(ctx_mu_);
    if (stopping_) return false;
    ctx_ = &ctx;
  }
  auto stream = stub_->Watch(&ctx);
  {
    std::lock_guard lock(write_mu_);
    stream_ = stream.get();
    stream_id_ = id;
  }
  v1::WatchRequest req;
  *req.mutable_subscribe() = opts_.subscribe;
  // When this write fails the stream is dead: Read below returns false at once.
  stream->Write(req);

  bool got_response = false;
  FeedState state;
  v1::WatchResponse resp;
  while (stream->Read(&resp)) {
    if (!got_response && !resp.full()) {
      spdlog::warn("feed {}: the first response of a stream is not full; waiting for one",
                   opts_.target);
    }
    got_response = true;
    fold(state, resp);
    metrics_.received_version.Set(static_cast<double>(resp.version()));
    if (!state.complete) continue;
    spdlog::debug("feed {}: version {} ({}, {} services)", opts_.target, resp.version(),
                  resp.full() ? "full" : "incremental", state.services.size());
    if (resp.full())
      spdlog::info("feed {}: stream {} starts at version {} with {} services", opts_.target, id,
                   resp.version(), state.services.size());
    std::lock_guard lock(mu_);
    view_.stream = id;
    ++view_.seq;
    view_.state = state;
    cv_.notify_all();
  }
  {
    std::lock_guard lock(write_mu_);
    stream_ = nullptr;
  }
  grpc::Status st = stream->Finish();
  {
    std::lock_guard lock(ctx_mu_);
    ctx_ = nullptr;
  }
  if (!stopping_) {
    spdlog::warn("feed {}: stream {} ended: {} ({})", opts_.target, id,
                 static_cast<int>(st.error_code()), st.error_message());
  }
  return got_response;
}

}  // namespace endpointd::haproxy
