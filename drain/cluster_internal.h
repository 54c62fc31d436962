// What drain/cluster.cc (the cluster thread's loop) and drain/cluster_streams.cc (its stream
// bookkeeping) share: the events gRPC's callbacks hand the thread, the metrics, and the streams
// themselves (callback reactors, each with a bounded write queue). Internal to drain/.
#pragma once

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <list>
#include <string_view>

#include "drain/cluster.h"
#include "drain/peer_identity.h"
#include "drain/peer_tls.h"
#include "endpointd/v1/drain.grpc.pb.h"

namespace endpointd::drain {

namespace pb = endpointd::v1;
using SteadyClock = std::chrono::steady_clock;

struct Cluster::Event {
  enum class Kind : uint8_t { kNewIn, kMessage, kInDone, kOutDone };
  Kind kind = Kind::kMessage;
  InStream* in = nullptr;
  OutStream* out = nullptr;
  pb::PeerMessage message;
  size_t bytes = 0;
};

struct Cluster::Metrics {
  std::shared_ptr<prometheus::Registry> own;
  prometheus::Family<prometheus::Counter>* messages;
  prometheus::Family<prometheus::Counter>* bytes;
  prometheus::Family<prometheus::Counter>* refused;
  prometheus::Family<prometheus::Counter>* dropped;
  prometheus::Family<prometheus::Gauge>* streams;
  prometheus::Gauge* excluded;
  prometheus::Family<prometheus::Gauge>* watermark;
  prometheus::Family<prometheus::Counter>* anomalies;

  explicit Metrics(prometheus::Registry* r) {
    if (!r) {
      own = std::make_shared<prometheus::Registry>();
      r = own.get();
    }
    messages = &prometheus::BuildCounter()
                    .Name("endpointd_drain_peer_messages_total")
                    .Help("Cluster watermark reports, by direction (sent, received) and kind")
                    .Register(*r);
    bytes = &prometheus::BuildCounter()
                 .Name("endpointd_drain_peer_bytes_total")
                 .Help("Bytes of cluster watermark reports (protobuf payload), by direction")
                 .Register(*r);
    refused = &prometheus::BuildCounter()
                   .Name("endpointd_drain_peer_refused_total")
                   .Help("Peer streams closed by this agent, by reason")
                   .Register(*r);
    dropped = &prometheus::BuildCounter()
                   .Name("endpointd_drain_peer_dropped_total")
                   .Help("Reports not delivered, by reason (queue full, inbox full, no stream)")
                   .Register(*r);
    streams = &prometheus::BuildGauge()
                   .Name("endpointd_drain_peer_streams")
                   .Help("Peer streams open now, by direction (incoming, outgoing)")
                   .Register(*r);
    excluded = &prometheus::BuildGauge()
                    .Name("endpointd_drain_peers_excluded")
                    .Help("Nodes excluded from the cluster watermark (silent past the deadline)")
                    .Register(*r)
                    .Add({});
    watermark = &prometheus::BuildGauge()
                     .Name("endpointd_drain_watermark")
                     .Help(
                         "EndpointSlice position applied: local (this agent's consumers) and "
                         "cluster (every live agent's)")
                     .Register(*r);
    anomalies = &prometheus::BuildCounter()
                     .Name("endpointd_drain_peer_watermark_anomalies_total")
                     .Help(
                         "Peer watermark reports wrong on their face, by kind: backwards (taken "
                         "as reported), ahead (a cluster watermark above this agent's own, "
                         "clamped), not-parent (a down report from another than the parent), "
                         "epoch (a decision past the cap or step, or more than one step a "
                         "liveness window from others than the parent), coverage (an up report "
                         "not over the sender's subtree: not counted), decision (an exclusion of "
                         "this agent's line from another than its parent: refused), malformed, "
                         "sample-below (the "
                         "root's direct sample below the minimum over it: held there)")
                     .Register(*r);
  }
};

// The messages waiting on one stream, under the stream's lock: at most `limit`; when full, the
// oldest one not yet being written goes (reports are state: a newer one supersedes it).
struct WriteQueue {
  explicit WriteQueue(size_t limit) : limit(limit) {}
  size_t limit;
  std::list<pb::PeerMessage> messages;
  bool writing = false;

  // Queues `m`. Returns the message to start writing (null: a write is already in flight) and
  // sets *dropped when one waiting message made room.
  const pb::PeerMessage* push(pb::PeerMessage m, bool* dropped) {
    *dropped = false;
    if (messages.size() >= limit) {
      messages.erase(writing ? std::next(messages.begin()) : messages.begin());
      *dropped = true;
    }
    messages.push_back(std::move(m));
    if (writing) return nullptr;
    writing = true;
    return &messages.front();
  }
  // A write completed. Returns the next message to write, or null (writing stops) when there
  // is none or `more` is false.
  const pb::PeerMessage* written(bool more) {
    messages.pop_front();
    if (more && !messages.empty()) return &messages.front();
    writing = false;
    return nullptr;
  }
};

// One incoming stream (a child, or any peer that reports to this agent). Its memory is freed
// by the cluster thread after OnDone, never inside a callback.
class Cluster::InStream final : public grpc::ServerBidiReactor<pb::PeerMessage, pb::PeerMessage> {
 public:
  InStream(Cluster* c, grpc::CallbackServerContext* ctx, size_t queue)
      : c_(c), out_(queue), opened_(SteadyClock::now()) {
    peer_ = ctx->peer();
    if (auto auth = ctx->auth_context()) cert_names = peer_certificate_names(*auth);
    // Identity: what names this token (its signature; the processor verified it already).
    auto md = ctx->client_metadata().find(kPeerTokenMetadata);
    if (md != ctx->client_metadata().end()) {
      std::string_view t(md->second.data(), md->second.size());
      auto dot = t.rfind('.');
      if (dot != std::string_view::npos) credential = std::string(t.substr(dot + 1, 128));
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      finish(grpc::Status::OK);
      return;
    }
    Event ev;
    ev.kind = Event::Kind::kMessage;
    ev.in = this;
    ev.bytes = in_.ByteSizeLong();
    ev.message = std::move(in_);
    in_.Clear();
    c_->post(std::move(ev));
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    if (!ok) finishing_ = true;
    if (const auto* next = out_.written(!finishing_)) {
      StartWrite(next);
      return;
    }
    if (finishing_ && !finished_) {
      finished_ = true;
      Finish(status_);
    }
  }

  void OnDone() override {
    Event ev;
    ev.kind = Event::Kind::kInDone;
    ev.in = this;
    c_->post(std::move(ev));
  }

  // Queues a message; returns false when one waiting was dropped to make room.
  bool send(pb::PeerMessage m) {
    std::lock_guard lock(mu_);
    if (finishing_) return true;
    bool dropped = false;
    if (const auto* first = out_.push(std::move(m), &dropped)) StartWrite(first);
    return !dropped;
  }

  void finish(grpc::Status st) {
    std::lock_guard lock(mu_);
    if (finishing_) return;
    finishing_ = true;
    status_ = std::move(st);
    if (!out_.writing) {
      finished_ = true;
      Finish(status_);
    }
  }

  std::string node;                     // set by the cluster thread from the first message
  bool refused = false;                 // the cluster thread closed it
  std::vector<std::string> cert_names;  // what the client's verified certificate names
  std::string credential;               // identity: the token's signature
  const std::string& peer() const { return peer_; }
  SteadyClock::time_point opened() const { return opened_; }

 private:
  Cluster* c_;
  WriteQueue out_;
  SteadyClock::time_point opened_;
  std::string peer_;
  pb::PeerMessage in_;
  std::recursive_mutex mu_;  // a write can complete inline, on the thread that started it
  bool finishing_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

// One outgoing stream, to a parent (or a former one being told that this agent left).
class Cluster::OutStream final : public grpc::ClientBidiReactor<pb::PeerMessage, pb::PeerMessage> {
 public:
  OutStream(Cluster* c, std::string node, const std::string& address,
            const std::shared_ptr<grpc::ChannelCredentials>& creds, bool tls, size_t queue)
      : node(std::move(node)), c_(c), out_(queue) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 4 << 20);
    // Each stream its own connection: a stream torn down takes only its own with it.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Dialled by address, verified by name: the parent's certificate must name its node.
    if (tls) args.SetSslTargetNameOverride(this->node);
    channel_ = grpc::CreateCustomChannel(address,
                                         creds ? creds : grpc::InsecureChannelCredentials(), args);
    stub_ = pb::Peer::NewStub(channel_);
    stub_->async()->Exchange(&ctx_, this);
    // Held until this side is done writing: gRPC may not call OnDone (after which no write
    // may start) while send() could still start one.
    AddHold();
    StartRead(&in_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The parent ended the stream: write no more; OnDone follows with the status.
      std::lock_guard lock(mu_);
      closing_ = true;
      release();
      return;
    }
    Event ev;
    ev.kind = Event::Kind::kMessage;
    ev.out = this;
    ev.bytes = in_.ByteSizeLong();
    ev.message = std::move(in_);
    in_.Clear();
    c_->post(std::move(ev));
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    if (const auto* next = out_.written(ok && !closing_)) {
      StartWrite(next);
      return;
    }
    if (!ok) closing_ = true;
    if (closing_) release();
  }

  void OnDone(const grpc::Status& st) override {
    status = st;
    Event ev;
    ev.kind = Event::Kind::kOutDone;
    ev.out = this;
    c_->post(std::move(ev));
  }

  bool send(pb::PeerMessage m) {
    std::lock_guard lock(mu_);
    if (closing_) return true;
    bool dropped = false;
    if (const auto* first = out_.push(std::move(m), &dropped)) StartWrite(first);
    last_send = SteadyClock::now();
    return !dropped;
  }

  void close() {
    {
      std::lock_guard lock(mu_);
      closing_ = true;
      if (!out_.writing) release();
    }
    ctx_.TryCancel();
  }

  const std::string node;
  bool answered = false;  // the peer sent a valid report on it (cluster thread)
  SteadyClock::time_point last_send = SteadyClock::now();
  grpc::Status status;

 private:
  Cluster* c_;
  WriteQueue out_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Peer::Stub> stub_;  // the generated gRPC client for Peer
  grpc::ClientContext ctx_;
  pb::PeerMessage in_;
  std::recursive_mutex mu_;
  bool closing_ = false;
  bool held_ = true;

  // Under mu_, once closing_ and no write is in flight: lets the call end.
  void release() {
    if (!held_ || out_.writing) return;
    held_ = false;
    RemoveHold();
  }
};

}  // namespace endpointd::drain
