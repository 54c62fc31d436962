// The cluster thread owns the Aggregator and every stream's bookkeeping; gRPC's callbacks only
// hand events to it (a stream opened, a message, a stream done), so no stream is ever freed
// under a caller and no lock is held across a call into gRPC but a stream's own.
#include "drain/cluster.h"

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <list>
#include <string_view>
#include <variant>

#include "drain/peer_identity.h"
#include "drain/peer_tls.h"
#include "endpointd/v1/drain.grpc.pb.h"
#include "model/json.h"

namespace endpointd::drain {

namespace pb = endpointd::v1;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxName = 253;  // a node name is a DNS subdomain
constexpr size_t kMaxList = 100000;

bool valid_name(const std::string& s) {
  return !s.empty() && s.size() <= kMaxName;
}

void copy_names(const google::protobuf::RepeatedPtrField<std::string>& in,
                std::vector<std::string>& out) {
  out.reserve(std::min<size_t>(in.size(), kMaxList));
  for (const auto& s : in) {
    if (out.size() >= kMaxList) break;
    if (valid_name(s)) out.push_back(s);
  }
}

void copy_holdouts(const google::protobuf::RepeatedPtrField<pb::WatermarkHoldout>& in,
                   HoldoutList& out) {
  std::vector<Holdout> raw;
  for (const auto& h : in) {
    if (raw.size() >= kMaxHoldouts) break;
    if (!valid_name(h.node()) || !valid_name(h.client())) continue;
    raw.push_back(Holdout{h.node(), h.client(), h.revision(), h.reason().substr(0, kMaxName)});
  }
  out = HoldoutList::of(std::move(raw));
}

template <typename W>
void put_holdouts(const HoldoutList& in, W* w) {
  for (const auto& h : in) {
    auto* o = w->add_holdouts();
    o->set_node(h.node);
    o->set_client(h.client);
    o->set_revision(h.revision);
    o->set_reason(h.reason);
  }
}

// A received message as the Aggregator takes it; an error names what was wrong.
Result<Message> from_wire(const pb::PeerMessage& m) {
  if (m.has_up()) {
    const auto& u = m.up();
    if (!valid_name(u.from())) return Error{"up report without a valid sender name"};
    UpReport r;
    r.from = u.from();
    r.watermark = u.watermark();
    r.covered.count = u.covered_count();
    r.covered.digest = u.covered_digest();
    copy_names(u.silent(), r.silent);
    copy_names(u.returning(), r.returning);
    r.leaving = u.leaving();
    r.probe = u.probe();
    copy_names(u.excluded(), r.excluded);
    r.epoch = u.epoch();
    r.dns_watermark = u.dns_watermark();
    copy_holdouts(u.holdouts(), r.holdouts);
    r.decision = u.decision();
    return Message{std::move(r)};
  }
  if (m.has_down()) {
    const auto& d = m.down();
    if (!valid_name(d.from())) return Error{"down report without a valid sender name"};
    DownReport r;
    r.from = d.from();
    r.watermark = d.watermark();
    copy_names(d.excluded(), r.excluded);
    r.epoch = d.epoch();
    r.covered.count = d.covered_count();
    r.covered.digest = d.covered_digest();
    r.dns_watermark = d.dns_watermark();
    copy_holdouts(d.holdouts(), r.holdouts);
    r.own = d.own_watermark();
    r.own_dns = d.own_dns_watermark();
    return Message{std::move(r)};
  }
  return Error{"a message with neither an up nor a down report"};
}

pb::PeerMessage to_wire(const Message& m) {
  pb::PeerMessage out;
  if (const auto* u = std::get_if<UpReport>(&m)) {
    auto* w = out.mutable_up();
    w->set_from(u->from);
    w->set_watermark(u->watermark);
    w->set_covered_count(u->covered.count);
    w->set_covered_digest(u->covered.digest);
    for (const auto& s : u->silent) w->add_silent(s);
    for (const auto& s : u->returning) w->add_returning(s);
    w->set_leaving(u->leaving);
    w->set_probe(u->probe);
    for (const auto& s : u->excluded) w->add_excluded(s);
    w->set_epoch(u->epoch);
    w->set_dns_watermark(u->dns_watermark);
    put_holdouts(u->holdouts, w);
    w->set_decision(u->decision);
  } else {
    const auto& d = std::get<DownReport>(m);
    auto* w = out.mutable_down();
    w->set_from(d.from);
    w->set_watermark(d.watermark);
    for (const auto& s : d.excluded) w->add_excluded(s);
    w->set_epoch(d.epoch);
    w->set_covered_count(d.covered.count);
    w->set_covered_digest(d.covered.digest);
    w->set_dns_watermark(d.dns_watermark);
    put_holdouts(d.holdouts, w);
    w->set_own_watermark(d.own);
    w->set_own_dns_watermark(d.own_dns);
  }
  return out;
}

const std::string& sender(const pb::PeerMessage& m) {
  return m.has_up() ? m.up().from() : m.down().from();
}

}  // namespace

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
                         "epoch (a decision past the cap or step), coverage (an up report not "
                         "over the sender's subtree: not counted), decision (an exclusion of "
                         "this agent's line passed up: refused), malformed, sample-below (the "
                         "root's direct sample below the minimum over it: held there)")
                     .Register(*r);
  }
};

namespace {

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

}  // namespace

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

grpc::ServerBidiReactor<pb::PeerMessage, pb::PeerMessage>* Cluster::exchange(
    grpc::CallbackServerContext* ctx) {
  auto* s = new InStream(this, ctx, opts_.queue);
  Event ev;
  ev.kind = Event::Kind::kNewIn;
  ev.in = s;
  post(std::move(ev));
  return s;
}

Cluster::Cluster(ClusterOptions opts, std::function<void()> on_change)
    : opts_(std::move(opts)),
      on_change_(std::move(on_change)),
      metrics_(std::make_unique<Metrics>(opts_.registry)),
      agg_(opts_.node, opts_.aggregator) {}

Cluster::~Cluster() {
  stop();
}

void Cluster::start() {
  {
    std::lock_guard lock(inbox_mu_);
    stopping_ = false;
  }
  publish_view();
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "drain-cluster");
    run();
  });
}

void Cluster::stop() {
  {
    std::lock_guard lock(inbox_mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Cluster::post(Event ev) {
  {
    std::lock_guard lock(inbox_mu_);
    if (ev.kind == Event::Kind::kNewIn || ev.kind == Event::Kind::kOutDone ||
        ev.kind == Event::Kind::kInDone) {
      if (ev.kind == Event::Kind::kNewIn) ++live_reactors_;
      inbox_.push_back(std::move(ev));
    } else if (inbox_messages_ >= opts_.inbox) {
      // Full: the sender's next report (every heartbeat) carries the same state.
      std::lock_guard vl(view_mu_);
      ++stats_.dropped_inbox;
      return;
    } else {
      ++inbox_messages_;
      inbox_.push_back(std::move(ev));
    }
  }
  inbox_cv_.notify_all();
}

void Cluster::set_members(std::map<std::string, std::string> addresses) {
  {
    std::lock_guard lock(inbox_mu_);
    if (addresses == pending_members_) return;
    pending_members_ = std::move(addresses);
    members_changed_ = true;
  }
  inbox_cv_.notify_all();
}

void Cluster::set_local(uint64_t watermark) {
  set_local(watermark, watermark, {});
}

void Cluster::set_local(uint64_t watermark, uint64_t dns_watermark, HoldoutList holdouts) {
  {
    std::lock_guard lock(inbox_mu_);
    if (watermark == pending_local_ && dns_watermark == pending_local_dns_ &&
        holdouts == pending_holdouts_)
      return;
    pending_local_ = watermark;
    pending_local_dns_ = dns_watermark;
    pending_holdouts_ = std::move(holdouts);
    local_changed_ = true;
  }
  inbox_cv_.notify_all();
}

Cluster::View Cluster::view() const {
  std::lock_guard lock(view_mu_);
  return view_;
}

Cluster::Stats Cluster::stats() const {
  std::lock_guard lock(view_mu_);
  return stats_;
}

std::string Cluster::to_json() const {
  std::lock_guard lock(view_mu_);
  return json_;
}

void Cluster::publish_view() {
  View v;
  v.local = 0;
  {
    std::lock_guard lock(inbox_mu_);
    v.local = pending_local_;
  }
  v.cluster = agg_.cluster_watermark();
  v.member = agg_.members().count(opts_.node) > 0;
  // The member list is copied only when it changed: a heartbeat costs O(children), not O(N).
  v.facts = agg_.facts(members_view_);
  members_view_ = v.facts.members;
  v.members = members_view_;
  v.excluded = agg_.excluded();
  std::string j = "{\"node\":" + model::json_string(opts_.node) +
                  ",\"local_watermark\":" + std::to_string(v.local) +
                  ",\"cluster_watermark\":" + std::to_string(v.cluster) +
                  ",\"cluster_dns_watermark\":" + std::to_string(v.facts.dns) +
                  ",\"coverage_current\":" + (v.facts.coverage_current ? "true" : "false") +
                  ",\"holdouts\":" + std::to_string(v.facts.holdouts.size()) +
                  ",\"member\":" + (v.member ? "true" : "false") +
                  ",\"members\":" + std::to_string(v.members->size()) +
                  ",\"root\":" + model::json_string(agg_.tree().root()) +
                  ",\"depth\":" + std::to_string(agg_.tree().depth());
  const std::string* parent = agg_.tree().parent(opts_.node);
  j += ",\"parent\":" + (parent ? model::json_string(*parent) : std::string("null"));
  auto list = [](const auto& names) {
    std::string s = "[";
    bool first = true;
    for (const auto& n : names) {
      if (!first) s += ",";
      first = false;
      s += model::json_string(n);
    }
    return s + "]";
  };
  j += ",\"children\":" + list(agg_.tree().children(opts_.node));
  j += ",\"excluded\":" + list(v.excluded);
  j += ",\"epoch\":" + std::to_string(agg_.epoch());
  std::vector<std::string> suspects;
  for (const auto& [n, since] : agg_.suspects()) suspects.push_back(n);
  j += ",\"suspects\":" + list(suspects);
  std::vector<std::string> in, out;
  for (const auto& [n, s] : incoming_by_node_) in.push_back(n);
  for (const auto& [n, s] : outgoing_) out.push_back(n);
  j += ",\"streams\":{\"incoming\":" + list(in) + ",\"outgoing\":" + list(out) +
       ",\"unnamed\":" + std::to_string(incoming_.size() - incoming_by_node_.size()) + "}";
  {
    std::lock_guard lock(view_mu_);
    stats_.incoming = incoming_.size();
    stats_.outgoing = outgoing_.size();
    stats_.peak_streams = std::max(stats_.peak_streams, stats_.incoming + stats_.outgoing);
    const Stats& s = stats_;
    j += ",\"counters\":{\"up_sent\":" + std::to_string(s.up_sent) +
         ",\"down_sent\":" + std::to_string(s.down_sent) +
         ",\"up_received\":" + std::to_string(s.up_received) +
         ",\"down_received\":" + std::to_string(s.down_received) +
         ",\"bytes_sent\":" + std::to_string(s.bytes_sent) +
         ",\"bytes_received\":" + std::to_string(s.bytes_received) +
         ",\"streams_opened\":" + std::to_string(s.streams_opened) +
         ",\"streams_accepted\":" + std::to_string(s.streams_accepted) +
         ",\"peak_streams\":" + std::to_string(s.peak_streams) +
         ",\"refused_unnamed\":" + std::to_string(s.refused_unnamed) +
         ",\"refused_not_member\":" + std::to_string(s.refused_not_member) +
         ",\"refused_renamed\":" + std::to_string(s.refused_renamed) +
         ",\"refused_limit\":" + std::to_string(s.refused_limit) +
         ",\"refused_identity\":" + std::to_string(s.refused_identity) +
         ",\"refused_replayed\":" + std::to_string(s.refused_replayed) +
         ",\"refused_malformed\":" + std::to_string(s.refused_malformed) +
         ",\"dropped_queue\":" + std::to_string(s.dropped_queue) +
         ",\"dropped_inbox\":" + std::to_string(s.dropped_inbox) +
         ",\"dropped_no_stream\":" + std::to_string(s.dropped_no_stream) +
         ",\"watermark_backwards\":" + std::to_string(s.watermark_backwards) +
         ",\"watermark_clamped_ahead\":" + std::to_string(s.watermark_clamped_ahead) +
         ",\"refused_coverage\":" + std::to_string(agg_.stats().refused_coverage) +
         ",\"refused_decision\":" + std::to_string(agg_.stats().refused_decision) +
         ",\"refused_epoch\":" + std::to_string(agg_.stats().refused_epoch) +
         ",\"not_parent\":" + std::to_string(agg_.stats().not_parent) +
         ",\"samples\":" + std::to_string(agg_.stats().samples) +
         ",\"sample_below\":" + std::to_string(agg_.stats().sample_below) + "}}";
    view_ = std::move(v);
    json_ = std::move(j);
  }
  metrics_->streams->Add({{"direction", "incoming"}}).Set(static_cast<double>(incoming_.size()));
  metrics_->streams->Add({{"direction", "outgoing"}}).Set(static_cast<double>(outgoing_.size()));
  metrics_->excluded->Set(static_cast<double>(agg_.excluded().size()));
  metrics_->watermark->Add({{"scope", "cluster"}})
      .Set(static_cast<double>(agg_.cluster_watermark()));
}

void Cluster::report_anomalies(SteadyClock::time_point) {
  for (const auto& a : agg_.take_anomalies()) {
    const std::string_view kind(a.kind);
    bool ahead = kind == "ahead";
    if (ahead || kind == "backwards") {
      std::lock_guard lock(view_mu_);
      ++(ahead ? stats_.watermark_clamped_ahead : stats_.watermark_backwards);
    }
    metrics_->anomalies->Add({{"kind", a.kind}}).Increment();
    // Logged at the 1st, 2nd, 4th, 8th… of each kind from each peer: a peer that keeps at it
    // is seen in the log without filling it.
    uint64_t n = ++anomaly_counts_[std::string(a.kind) + "/" + a.from];
    if ((n & (n - 1)) != 0) continue;
    if (kind == "epoch")
      spdlog::warn(
          "drain: peer {} sent an exclusion decision numbered {}, past the cap or more than {} "
          "decisions past this agent's {}: refused ({} so far)",
          a.from, a.reported, Aggregator::kMaxEpochStep, a.kept, n);
    else if (kind == "not-parent")
      spdlog::warn(
          "drain: peer {} sent a cluster watermark of {} but is not this agent's parent in its "
          "layout: not taken (this agent's is {}; {} so far)",
          a.from, a.reported, a.kept, n);
    else if (ahead)
      spdlog::warn(
          "drain: peer {} sent a cluster watermark of {}, above this agent's own {} that it "
          "counts: clamped to {} ({} so far)",
          a.from, a.reported, a.kept, a.kept, n);
    else if (kind == "coverage")
      spdlog::warn(
          "drain: peer {} reported over {} agents, not its subtree of {} in this agent's layout: "
          "not counted in the minimum (layouts differ while a member joins, leaves or is "
          "suspected; otherwise a false report; {} so far)",
          a.from, a.reported, a.kept, n);
    else if (kind == "decision")
      spdlog::warn(
          "drain: peer {} passed up an exclusion decision (number {}) that excludes this agent "
          "or one of its ancestors: refused, such a decision comes from the root down ({} so far)",
          a.from, a.reported, n);
    else if (kind == "malformed")
      spdlog::warn(
          "drain: peer {} reported a DNS watermark of {} above its watermark of {}: refused ({} "
          "so far)",
          a.from, a.reported, a.kept, n);
    else if (kind == "sample-below") {
      std::string path;
      for (const auto& p : agg_.tree().ancestors(a.from))
        path = p + (path.empty() ? "" : " > ") + path;
      spdlog::warn(
          "drain: sampled directly, peer {} applied up to {} but the minimum over it was {}: "
          "the cluster watermark is held at {} until the tree agrees (it restarted, or an agent "
          "on its way up, {}, reported falsely; {} so far)",
          a.from, a.kept, a.reported, a.kept, path, n);
    } else
      spdlog::warn(
          "drain: peer {} reported a watermark of {}, below its previous report over the same "
          "agents (a restart, or a false report): taken as reported ({} so far)",
          a.from, a.reported, n);
  }
}

void Cluster::handle(Event& ev, SteadyClock::time_point now) {
  auto refuse = [&](InStream* s, grpc::StatusCode code, const std::string& why,
                    uint64_t Stats::*counter, const char* reason) {
    s->refused = true;
    // Logged at powers of two per reason: a hostile neighbour does not fill the log.
    uint64_t n = ++refusals_logged_[reason];
    if ((n & (n - 1)) == 0)
      spdlog::warn("drain: peer stream from {} refused ({}, {} so far): {}", s->peer(), reason, n,
                   why);
    {
      std::lock_guard lock(view_mu_);
      ++(stats_.*counter);
    }
    metrics_->refused->Add({{"reason", reason}}).Increment();
    s->finish(grpc::Status(code, "endpointd drain: " + why));
  };
  switch (ev.kind) {
    case Event::Kind::kNewIn:
      incoming_.insert(ev.in);
      if (incoming_.size() > opts_.max_incoming) {
        refuse(ev.in, grpc::StatusCode::RESOURCE_EXHAUSTED, "too many peer streams",
               &Stats::refused_limit, "limit");
      } else {
        std::lock_guard lock(view_mu_);
        ++stats_.streams_accepted;
      }
      return;
    case Event::Kind::kInDone:
      if (!ev.in->node.empty()) {
        auto it = incoming_by_node_.find(ev.in->node);
        if (it != incoming_by_node_.end() && it->second == ev.in) incoming_by_node_.erase(it);
      }
      if (!ev.in->credential.empty()) {
        auto it = incoming_by_credential_.find(ev.in->credential);
        if (it != incoming_by_credential_.end() && it->second == ev.in)
          incoming_by_credential_.erase(it);
      }
      incoming_.erase(ev.in);
      delete ev.in;
      {
        std::lock_guard lock(inbox_mu_);
        --live_reactors_;
      }
      return;
    case Event::Kind::kOutDone: {
      auto it = outgoing_.find(ev.out->node);
      if (it != outgoing_.end() && it->second == ev.out) outgoing_.erase(it);
      if (!ev.out->answered) {
        // Never answered (down, starting, or refusing us): wait twice as long before the next
        // attempt, up to half the liveness deadline. A rollout of a DaemonSet starts agents
        // whose parents are not up yet; a fixed interval had 200 agents dial the absent ones
        // five times a second each.
        auto& b = backoff_[ev.out->node];
        b.delay = std::min(std::max(opts_.reconnect, 2 * b.delay),
                           std::max(opts_.reconnect, opts_.aggregator.silence / 2));
      }
      if (!ev.out->status.ok() && ev.out->status.error_code() != grpc::StatusCode::CANCELLED)
        spdlog::debug("drain: stream to peer {} ended: {}", ev.out->node,
                      ev.out->status.error_message());
      delete ev.out;
      {
        std::lock_guard lock(inbox_mu_);
        --live_reactors_;
      }
      return;
    }
    case Event::Kind::kMessage:
      break;
  }
  auto parsed = from_wire(ev.message);
  const std::string from = parsed.ok() ? sender(ev.message) : std::string();
  if (ev.in) {
    InStream* s = ev.in;
    if (!incoming_.count(s) || s->refused) return;
    if (!parsed.ok()) {
      refuse(s, grpc::StatusCode::INVALID_ARGUMENT, parsed.error(), &Stats::refused_malformed,
             "malformed");
      return;
    }
    if (s->node.empty()) {
      if (!agg_.members().count(from) || from == opts_.node) {
        refuse(s, grpc::StatusCode::PERMISSION_DENIED,
               "\"" + from.substr(0, 64) + "\" is not a member of the cluster watermark",
               &Stats::refused_not_member, "not_member");
        return;
      }
      if (opts_.tls &&
          std::find(s->cert_names.begin(), s->cert_names.end(), from) == s->cert_names.end()) {
        refuse(s, grpc::StatusCode::PERMISSION_DENIED,
               "it spoke as \"" + from.substr(0, 64) + "\" but its " +
                   (opts_.verifier ? "token" : "certificate") + " names " +
                   (s->cert_names.empty() ? std::string("no node")
                                          : "\"" + s->cert_names.front().substr(0, 64) + "\""),
               &Stats::refused_identity, opts_.verifier ? "other_node" : "identity");
        return;
      }
      if (opts_.verifier) {
        // A token is taken on one live stream at a time: the same token on a second stream
        // while the first is open is someone who holds a copy (a peer it was sent to).
        if (s->credential.empty()) {
          refuse(s, grpc::StatusCode::UNAUTHENTICATED, "no token on the stream",
                 &Stats::refused_identity, "no_token");
          return;
        }
        auto [cit, fresh_cred] = incoming_by_credential_.emplace(s->credential, s);
        if (!fresh_cred && cit->second != s) {
          InStream* first = cit->second;
          if (incoming_.count(first) && !first->refused) {
            refuse(s, grpc::StatusCode::PERMISSION_DENIED,
                   "node " + from.substr(0, 64) +
                       "'s token is already in use on another open stream (from " + first->peer() +
                       ")",
                   &Stats::refused_replayed, "replayed");
            return;
          }
          cit->second = s;
        }
      }
      s->node = from;
      auto [it, fresh] = incoming_by_node_.emplace(from, s);
      if (!fresh) {
        // A newer stream from the same node (it reconnected): the older one goes.
        it->second->finish(grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "replaced"));
        it->second->node.clear();
        it->second = s;
      }
    } else if (from != s->node) {
      refuse(s, grpc::StatusCode::INVALID_ARGUMENT,
             "a stream of node " + s->node + " spoke as \"" + from.substr(0, 64) + "\"",
             &Stats::refused_renamed, "renamed");
      return;
    }
  } else {
    OutStream* s = ev.out;
    if (parsed.ok() && from == s->node) {
      s->answered = true;
      backoff_[s->node].delay = opts_.reconnect;
    }
    if (!parsed.ok() || from != s->node) {
      spdlog::warn("drain: peer {} sent {}; stream closed", s->node,
                   parsed.ok() ? "a report as \"" + from.substr(0, 64) + "\"" : parsed.error());
      s->close();
      return;
    }
  }
  {
    std::lock_guard lock(view_mu_);
    (ev.message.has_up() ? stats_.up_received : stats_.down_received)++;
    stats_.bytes_received += ev.bytes;
  }
  metrics_->messages
      ->Add({{"direction", "received"}, {"kind", ev.message.has_up() ? "up" : "down"}})
      .Increment();
  metrics_->bytes->Add({{"direction", "received"}}).Increment(static_cast<double>(ev.bytes));
  agg_.receive(parsed.value(), now);
}

void Cluster::dispatch(std::vector<Aggregator::Send> sends, SteadyClock::time_point now) {
  for (auto& s : sends) {
    bool up = std::holds_alternative<UpReport>(s.message);
    pb::PeerMessage m = to_wire(s.message);
    size_t bytes = m.ByteSizeLong();
    bool delivered = false, kept = true;
    auto in = incoming_by_node_.find(s.to);
    auto out = outgoing_.find(s.to);
    // Up reports on this agent's own stream, down reports on the child's; either on whatever
    // stream there is with that peer; else a new stream of this agent's (a probe, a child
    // that has not connected yet).
    if (!up && in != incoming_by_node_.end()) {
      kept = in->second->send(std::move(m));
      delivered = true;
    } else if (out != outgoing_.end()) {
      kept = out->second->send(std::move(m));
      delivered = true;
    } else if (in != incoming_by_node_.end()) {
      kept = in->second->send(std::move(m));
      delivered = true;
    } else {
      auto addr = addresses_.find(s.to);
      auto& b = backoff_[s.to];
      if (b.delay.count() == 0) b.delay = opts_.reconnect;
      if (addr != addresses_.end() && now - b.last >= b.delay) {
        b.last = now;
        {
          std::lock_guard lock(inbox_mu_);
          ++live_reactors_;
        }
        auto* o =
            new OutStream(this, s.to, addr->second, opts_.credentials, opts_.tls, opts_.queue);
        outgoing_[s.to] = o;
        {
          std::lock_guard lock(view_mu_);
          ++stats_.streams_opened;
        }
        kept = o->send(std::move(m));
        delivered = true;
      }
    }
    // Not delivered: the last attempt to open a stream to that peer is too recent.
    std::lock_guard lock(view_mu_);
    if (!delivered) {
      ++stats_.dropped_no_stream;
      metrics_->dropped->Add({{"reason", "no_stream"}}).Increment();
      continue;
    }
    if (!kept) {
      ++stats_.dropped_queue;
      metrics_->dropped->Add({{"reason", "queue"}}).Increment();
    }
    (up ? stats_.up_sent : stats_.down_sent)++;
    stats_.bytes_sent += bytes;
    metrics_->messages->Add({{"direction", "sent"}, {"kind", up ? "up" : "down"}}).Increment();
    metrics_->bytes->Add({{"direction", "sent"}}).Increment(static_cast<double>(bytes));
  }
}

void Cluster::sweep(SteadyClock::time_point now) {
  for (InStream* s : incoming_) {
    if (s->node.empty() && !s->refused && now - s->opened() > opts_.hello) {
      s->refused = true;
      spdlog::warn("drain: peer stream from {} refused: it named no node within {} ms", s->peer(),
                   opts_.hello.count());
      {
        std::lock_guard lock(view_mu_);
        ++stats_.refused_unnamed;
      }
      metrics_->refused->Add({{"reason", "unnamed"}}).Increment();
      s->finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                             "endpointd drain: the stream named no node in time"));
    }
  }
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    const std::string* parent = agg_.tree().parent(opts_.node);
    bool is_parent = parent && *parent == it->first;
    if (!is_parent && now - it->second->last_send > opts_.idle) {
      it->second->close();  // OnDone removes it
    }
    ++it;
  }
}

void Cluster::run() {
  auto next_sweep = SteadyClock::now();
  uint64_t last_cluster = agg_.cluster_watermark();
  std::set<std::string> last_excluded = agg_.excluded();
  while (true) {
    std::vector<Event> events;
    bool members_changed = false, local_changed = false, stopping = false;
    std::map<std::string, std::string> members;
    uint64_t local = 0, local_dns = 0;
    HoldoutList holdouts;
    {
      std::unique_lock lock(inbox_mu_);
      // At most a poll per millisecond whatever the deadlines say.
      auto deadline = std::max(std::min(agg_.next_deadline(), next_sweep),
                               SteadyClock::now() + std::chrono::milliseconds(1));
      inbox_cv_.wait_until(lock, deadline, [&] {
        return stopping_ || !inbox_.empty() || members_changed_ || local_changed_;
      });
      events.swap(inbox_);
      inbox_messages_ = 0;
      stopping = stopping_;
      if (members_changed_) {
        members = pending_members_;
        members_changed = true;
        members_changed_ = false;
      }
      local_changed = local_changed_;
      local_changed_ = false;
      local = pending_local_;
      local_dns = pending_local_dns_;
      if (local_changed) holdouts = pending_holdouts_;
    }
    auto now = SteadyClock::now();
    for (auto& ev : events) handle(ev, now);
    if (stopping) break;
    if (members_changed) {
      addresses_ = std::move(members);
      std::vector<std::string> names;
      for (const auto& [n, a] : addresses_) names.push_back(n);
      agg_.set_members(names, now);
    }
    if (local_changed) {
      agg_.set_local(local, local_dns, std::move(holdouts));
      metrics_->watermark->Add({{"scope", "local"}}).Set(static_cast<double>(local));
    }
    dispatch(agg_.poll(now), now);
    report_anomalies(now);
    if (now >= next_sweep) {
      sweep(now);
      // Hello and idle deadlines are seconds long; a sweep a quarter of the shorter apart.
      next_sweep =
          now + std::max(std::chrono::milliseconds(50), std::min(opts_.hello, opts_.idle) / 4);
    }
    publish_view();
    if (agg_.cluster_watermark() != last_cluster || agg_.excluded() != last_excluded) {
      if (agg_.excluded() != last_excluded) {
        std::vector<std::string> added, back;
        for (const auto& n : agg_.excluded())
          if (!last_excluded.count(n)) added.push_back(n);
        for (const auto& n : last_excluded)
          if (!agg_.excluded().count(n)) back.push_back(n);
        if (!added.empty())
          spdlog::warn("drain: excluded from the cluster watermark (silent past {} ms): {}",
                       opts_.aggregator.silence.count(), fmt::join(added, ", "));
        if (!back.empty()) spdlog::info("drain: readmitted: {}", fmt::join(back, ", "));
      }
      last_cluster = agg_.cluster_watermark();
      last_excluded = agg_.excluded();
      if (on_change_) on_change_();
    }
  }
  // Stopping: close every stream and wait for gRPC to be done with each.
  for (auto& [n, s] : outgoing_) s->close();
  for (InStream* s : incoming_)
    s->finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "endpointd is stopping"));
  auto until = SteadyClock::now() + std::chrono::seconds(5);
  while (true) {
    std::vector<Event> events;
    {
      std::unique_lock lock(inbox_mu_);
      if (live_reactors_ == 0) break;
      inbox_cv_.wait_until(lock, until, [&] { return !inbox_.empty(); });
      if (inbox_.empty() && SteadyClock::now() >= until) break;
      events.swap(inbox_);
    }
    auto now = SteadyClock::now();
    for (auto& ev : events) {
      handle(ev, now);
      if (ev.kind == Event::Kind::kNewIn)
        ev.in->finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "endpointd is stopping"));
    }
  }
}

}  // namespace endpointd::drain
