// What an UpstreamFeed watch stream and an xDS stream have in common (private to feed/): one
// callback reactor per stream over raw bytes, registered with the hub as a subscriber; at most
// one write in flight, and a snapshot that arrives meanwhile replaces the pending one, so a
// slow reader is sent the newest state (coalesced), never a backlog. The API-specific part —
// parsing a request, deciding what to send — is in the subclasses.
#pragma once

#include <grpcpp/grpcpp.h>

#include <mutex>
#include <string>

#include "feed/hub.h"
#include "feed/metrics.h"
#include "feed/services.h"

namespace endpointd::feed {

class FeedStream : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                   public Subscriber {
 public:
  FeedStream(grpc::CallbackServerContext* ctx, ServiceContext sc, Metrics::Api api);

  void notify(const model::SnapshotPtr& snap) final;
  model::SnapshotPtr acked() const final;
  std::optional<Clock::time_point> outstanding_since() const final;
  bool nacking() const final;
  bool resume(const model::SnapshotPtr& last, Clock::time_point since) final;
  void OnReadDone(bool ok) final;
  void OnWriteDone(bool ok) final;
  void OnDone() final;

 protected:
  // The end of a subclass's constructor: registers with the hub (or refuses the stream at the
  // limit), sends what there is to send, starts reading. `what` names the stream in logs.
  void start(const char* what);

  // Under mu_: the request in in_bytes_ arrived. Returns false when it ended the stream
  // (finish_locked called); sets *acks_moved when acked() moved.
  virtual bool handle_request_locked(bool* acks_moved) = 0;
  // Under mu_: sends what the client lacks if nothing is in flight (via start_write_locked).
  // Returns true when acked() moved without a send.
  virtual bool maybe_write_locked() = 0;

  // Starts the write of `bytes` (the response for newest_).
  void start_write_locked(const grpc::ByteBuffer& bytes);
  // Finishes now, or when the write in flight completes.
  void finish_locked(grpc::Status st);
  // The client acknowledged `version`, which this stream never sent: counted as
  // rejected{reason="invalid_ack"}, logged at the 1st, 2nd, 4th... of the stream.
  void bogus_ack_locked(uint64_t version);

  const ServiceContext sc_;
  const uint64_t id_;
  const std::string peer_;
  const Metrics::Api api_;

  mutable std::mutex mu_;  // guards everything below; taken after the hub's locks, never before
  grpc::ByteBuffer in_bytes_;
  bool writing_ = false;
  bool finishing_ = false;
  model::SnapshotPtr newest_;  // the newest snapshot known
  AckTracker acks_;
  // The name the client gave (Subscribe.client_name, the xDS node id): set once by the
  // subclass; the stream tells the hub (Hub::identify) after the request that carried it.
  std::string identity_;

 private:
  bool refused_ = false;
  bool finished_ = false;
  bool identified_ = false;  // identity_ was told to the hub
  uint64_t bogus_acks_ = 0;
  grpc::Status status_;
  grpc::ByteBuffer out_bytes_;    // the response in flight (its slices may be shared)
  model::SnapshotPtr in_flight_;  // the snapshot the response in flight was built from
};

}  // namespace endpointd::feed
