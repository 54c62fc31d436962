// The stream mechanics shared by the UpstreamFeed and xDS services.
#include "feed/stream.h"

#include <spdlog/spdlog.h>

namespace endpointd::feed {

FeedStream::FeedStream(grpc::CallbackServerContext* ctx, ServiceContext sc, Metrics::Api api)
    : sc_(std::move(sc)),
      id_(sc_.hub->next_id()),
      peer_(ctx->peer()),
      api_(api),
      acks_(sc_.hub->current()) {}

void FeedStream::start(const char* what) {
  // Only now, with the subclass constructed: the hub may notify the stream at once.
  if (!sc_.hub->add(this)) {
    sc_.metrics->rejected(Metrics::Reject::kTooManyStreams);
    spdlog::warn("feed: refused {} from {}: stream limit reached", what, peer_);
    refused_ = true;
    Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "endpointd feed: too many streams"));
    return;
  }
  sc_.metrics->stream_opened(api_);
  bool acks_moved = false;
  {
    // The hub's locks are taken before a stream's (the hub locks each stream while it holds
    // its own), so read the hub first: never the other way round.
    auto cur = sc_.hub->current();
    std::lock_guard lock(mu_);
    if (cur && (!newest_ || cur->generation > newest_->generation)) newest_ = cur;
    acks_moved = maybe_write_locked();
  }
  if (acks_moved) sc_.hub->acks_changed(this);
  StartRead(&in_bytes_);
}

void FeedStream::notify(const model::SnapshotPtr& snap) {
  std::lock_guard lock(mu_);
  if (newest_ && snap->generation <= newest_->generation) return;
  // A snapshot that was never sent is replaced: that is the coalescing of a slow reader.
  if (writing_ && newest_ != in_flight_) sc_.metrics->coalesced();
  newest_ = snap;
  maybe_write_locked();  // the hub refreshes every subscriber's ack after notifying them all
}

model::SnapshotPtr FeedStream::acked() const {
  std::lock_guard lock(mu_);
  return acks_.acked();
}

std::optional<Clock::time_point> FeedStream::outstanding_since() const {
  std::lock_guard lock(mu_);
  return acks_.outstanding_since();
}

bool FeedStream::nacking() const {
  std::lock_guard lock(mu_);
  return acks_.nacking();
}

bool FeedStream::resume(const model::SnapshotPtr& last, Clock::time_point since) {
  std::lock_guard lock(mu_);
  return acks_.resume(last, since);
}

void FeedStream::OnReadDone(bool ok) {
  if (!ok) {  // the client half-closed or went away
    std::lock_guard lock(mu_);
    finish_locked(grpc::Status::OK);
    return;
  }
  bool acks_moved = false;
  std::string identity;
  {
    std::lock_guard lock(mu_);
    if (!handle_request_locked(&acks_moved)) return;
    if (!identified_ && !identity_.empty()) {
      identified_ = true;
      identity = identity_;
    }
  }
  // Before the next request is read: a returning client's ack must find it resumed.
  if (!identity.empty()) sc_.hub->identify(this, identity);
  if (acks_moved) sc_.hub->acks_changed(this);
  StartRead(&in_bytes_);
}

void FeedStream::OnWriteDone(bool ok) {
  bool acks_moved = false;
  {
    std::lock_guard lock(mu_);
    writing_ = false;
    out_bytes_.Clear();  // drop this stream's reference to the bytes
    in_flight_.reset();
    if (!ok) finishing_ = true;
    if (finishing_) {
      finish_locked(status_);
      return;
    }
    acks_moved = maybe_write_locked();
  }
  if (acks_moved) sc_.hub->acks_changed(this);
}

void FeedStream::OnDone() {
  if (!refused_) {
    sc_.hub->remove(this);
    sc_.metrics->stream_closed(api_);
  }
  delete this;
}

void FeedStream::start_write_locked(const grpc::ByteBuffer& bytes) {
  out_bytes_ = bytes;  // shares the slices
  in_flight_ = newest_;
  writing_ = true;
  sc_.metrics->update_sent(api_);
  StartWrite(&out_bytes_);
}

void FeedStream::bogus_ack_locked(uint64_t version) {
  sc_.metrics->rejected(Metrics::Reject::kInvalidAck);
  if (uint64_t k = ++bogus_acks_; (k & (k - 1)) == 0)
    spdlog::warn(
        "feed: {} (client '{}') acknowledged version {}, which this stream never sent (last "
        "sent {}); refused ({} so far on this stream)",
        peer_, identity_, version, acks_.sent_version(), k);
}

void FeedStream::finish_locked(grpc::Status st) {
  if (!finishing_) status_ = std::move(st);
  finishing_ = true;
  if (writing_ || finished_) return;
  finished_ = true;
  Finish(status_);
}

}  // namespace endpointd::feed
