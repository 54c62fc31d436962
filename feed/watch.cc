// endpointd.v1.UpstreamFeed/Watch: one callback reactor per stream. At most one response is
// in flight; a snapshot that arrives meanwhile replaces the pending one, so a slow reader is
// sent the newest state (coalesced), never a backlog.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <list>
#include <set>
#include <unordered_map>

#include "endpointd/v1/feed.grpc.pb.h"
#include "feed/resources.h"
#include "feed/services.h"

namespace endpointd::feed {

namespace {

using Reject = Metrics::Reject;

// Encoded responses shared by all watch streams. Subscribers with the same selection, brought
// from the same snapshot to the same one, are sent the same bytes: a change that reaches 1,000
// of them is built and serialized once, and each stream's write holds a reference to the
// shared slices instead of its own copy of the message. Keyed by selection, basis generation
// (0 for a full state) and target generation; least recently used entries go first.
class ResponseCache {
 public:
  struct Entry {
    std::mutex mu;  // held while the first stream that wants it builds it
    bool built = false;
    bool ok = false;
    grpc::ByteBuffer bytes;
  };

  std::shared_ptr<Entry> get(const std::string& key) {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    lru_.emplace_front(key, std::make_shared<Entry>());
    index_.emplace(key, lru_.begin());
    while (lru_.size() > kMaxEntries) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return lru_.front().second;
  }

 private:
  // A handful of generations × distinct selections; a full state of an all-services
  // subscriber is the biggest entry, and streams still writing one keep their reference.
  static constexpr size_t kMaxEntries = 64;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<Entry>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

class WatchStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                          public Subscriber {
 public:
  WatchStream(grpc::CallbackServerContext* ctx, ServiceContext sc,
              std::shared_ptr<ResponseCache> cache)
      : sc_(std::move(sc)),
        cache_(std::move(cache)),
        id_(sc_.hub->next_id()),
        peer_(ctx->peer()),
        acks_(sc_.hub->current()) {
    if (!sc_.hub->add(this)) {
      sc_.metrics->rejected(Reject::kTooManyStreams);
      spdlog::warn("feed: refused a watch stream from {}: stream limit reached", peer_);
      refused_ = true;
      Finish(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "endpointd feed: too many streams"));
      return;
    }
    sc_.metrics->stream_opened(Metrics::Api::kWatch);
    bool acks_moved = false;
    {
      // The hub's locks are taken before a stream's (the hub locks each stream while it
      // holds its own), so read the hub first: never the other way round.
      auto cur = sc_.hub->current();
      std::lock_guard lock(mu_);
      if (cur && (!newest_ || cur->generation > newest_->generation)) newest_ = cur;
      acks_moved = maybe_write_locked();
    }
    if (acks_moved) sc_.hub->acks_changed(this);
    StartRead(&in_bytes_);
  }

  void notify(const model::SnapshotPtr& snap) override {
    std::lock_guard lock(mu_);
    if (newest_ && snap->generation <= newest_->generation) return;
    if (writing_ && newest_ != basis_) sc_.metrics->coalesced();
    newest_ = snap;
    maybe_write_locked();  // the hub recomputes acks after notifying everyone
  }

  model::SnapshotPtr acked() const override {
    std::lock_guard lock(mu_);
    return acks_.acked();
  }

  SubscriberInfo info() const override {
    std::lock_guard lock(mu_);
    SubscriberInfo i;
    i.id = id_;
    i.api = "watch";
    i.peer = peer_;
    i.client = client_;
    i.subscription = subscribed_ ? sel_.str() : "";
    i.sent_version = acks_.sent_version();
    i.acked_version = acks_.acked_version();
    i.acked_generation = acks_.acked() ? acks_.acked()->generation : 0;
    return i;
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed or went away
      std::lock_guard lock(mu_);
      finish_locked(grpc::Status::OK);
      return;
    }
    bool acks_moved = false;
    {
      std::lock_guard lock(mu_);
      if (!grpc::SerializationTraits<v1::WatchRequest>::Deserialize(&in_bytes_, &in_).ok()) {
        sc_.metrics->rejected(Reject::kMalformed);
        spdlog::warn("feed: malformed WatchRequest from {}", peer_);
        finish_locked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "endpointd feed: malformed WatchRequest"));
        return;
      }
      switch (in_.request_case()) {
        case v1::WatchRequest::kSubscribe: {
          std::string error;
          auto sel = Selection::from(in_.subscribe(), &error);
          if (!sel) {
            sc_.metrics->rejected(Reject::kInvalidSubscribe);
            spdlog::warn("feed: invalid Subscribe from {}: {}", peer_, error);
            finish_locked(
                grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "endpointd feed: " + error));
            return;
          }
          sel_ = std::move(*sel);
          sel_key_ = sel_.str();
          client_ = in_.subscribe().client_name();
          subscribed_ = true;
          need_full_ = true;
          acks_moved = maybe_write_locked();
          break;
        }
        case v1::WatchRequest::kAck:
          sc_.metrics->ack(Metrics::Api::kWatch);
          if (acks_.ack(in_.ack().version())) {
            acks_moved = true;
          } else {
            sc_.metrics->rejected(Reject::kInvalidAck);
          }
          break;
        case v1::WatchRequest::REQUEST_NOT_SET:
          sc_.metrics->rejected(Reject::kInvalidSubscribe);
          finish_locked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "endpointd feed: a WatchRequest holds a subscribe or an ack"));
          return;
      }
    }
    if (acks_moved) sc_.hub->acks_changed(this);
    StartRead(&in_bytes_);
  }

  void OnWriteDone(bool ok) override {
    bool acks_moved = false;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      out_bytes_.Clear();  // drop this stream's reference to the shared bytes
      if (!ok) finishing_ = true;
      if (finishing_) {
        finish_locked(status_);
        return;
      }
      acks_moved = maybe_write_locked();
    }
    if (acks_moved) sc_.hub->acks_changed(this);
  }

  void OnDone() override {
    if (!refused_) {
      sc_.hub->remove(this);
      sc_.metrics->stream_closed(Metrics::Api::kWatch);
    }
    delete this;
  }

 private:
  // Finishes now, or when the write in flight completes.
  void finish_locked(grpc::Status st) {
    if (!finishing_) status_ = std::move(st);
    finishing_ = true;
    if (writing_ || finished_) return;
    finished_ = true;
    Finish(status_);
  }

  // Sends what the subscriber lacks, if nothing is in flight. Returns true when acked()
  // moved without a send (the new snapshot changed nothing this subscriber sees).
  bool maybe_write_locked() {
    if (writing_ || finishing_ || !newest_) return false;
    if (!subscribed_) {  // routes by nothing yet, so it holds nothing back
      acks_.unchanged(newest_);
      return true;
    }
    const bool full = need_full_;
    need_full_ = false;
    if (!full) {
      if (basis_ == newest_) return false;
      if (!changed_for_me()) {
        basis_ = newest_;
        acks_.unchanged(newest_);
        return true;
      }
    }
    std::string key = sel_key_;
    key += full ? "|full|" : "|" + std::to_string(basis_->generation) + "|";
    key += std::to_string(newest_->generation);
    auto entry = cache_->get(key);
    {
      std::lock_guard build(entry->mu);
      if (!entry->built) {
        entry->built = true;
        entry->ok = encode(full, &entry->bytes);
      }
      if (entry->ok) out_bytes_ = entry->bytes;  // shares the slices
    }
    if (!entry->ok) {
      finish_locked(grpc::Status(grpc::StatusCode::INTERNAL, "endpointd feed: cannot encode"));
      return false;
    }
    basis_ = newest_;
    acks_.sent(newest_);
    writing_ = true;
    sc_.metrics->update_sent(Metrics::Api::kWatch);
    StartWrite(&out_bytes_);
    return false;
  }

  // Whether anything this subscriber receives differs between basis_ and newest_.
  bool changed_for_me() {
    if (sel_.exact_only()) {
      for (const auto& k : exact_keys())
        if (basis_->find_ptr(k) != newest_->find_ptr(k)) return true;
      return false;
    }
    auto delta = sc_.hub->diff(basis_, newest_);
    for (const auto* keys : {&delta->added, &delta->changed, &delta->removed})
      for (const auto& k : *keys)
        if (sel_.matches(k)) return true;
    return false;
  }

  bool encode(bool full, grpc::ByteBuffer* bytes) {
    v1::WatchResponse out;
    out.set_full(full);
    if (full) {
      build_full(&out);
    } else {
      build_incremental(&out);
    }
    out.set_version(newest_->generation);
    bool own = false;
    grpc::Status st = grpc::SerializationTraits<v1::WatchResponse>::Serialize(out, bytes, &own);
    if (!st.ok())
      spdlog::error("feed: cannot encode a WatchResponse of {} bytes for {}: {}",
                    out.ByteSizeLong(), peer_, st.error_message());
    return st.ok();
  }

  std::set<model::ServiceKey> exact_keys() const {
    std::set<model::ServiceKey> keys;
    for (const auto& s : sel_.selectors) keys.insert({s.ns, s.name});
    return keys;
  }

  void build_full(v1::WatchResponse* out) {
    if (sel_.exact_only()) {
      for (const auto& k : exact_keys())
        if (const auto* st = newest_->find(k)) fill_service(*st, sel_, out->add_services());
      return;
    }
    for (const auto& st : newest_->services)
      if (sel_.matches(st->key())) fill_service(*st, sel_, out->add_services());
  }

  static void add_removed(v1::WatchResponse* out, const model::ServiceKey& k) {
    auto* r = out->add_removed();
    r->set_namespace_(k.ns);
    r->set_name(k.name);
  }

  void build_incremental(v1::WatchResponse* out) {
    if (sel_.exact_only()) {
      for (const auto& k : exact_keys()) {
        auto before = basis_->find_ptr(k);
        auto after = newest_->find_ptr(k);
        if (before == after) continue;
        if (after) {
          fill_service(*after, sel_, out->add_services());
        } else {
          add_removed(out, k);
        }
      }
      return;
    }
    auto delta = sc_.hub->diff(basis_, newest_);
    for (const auto* keys : {&delta->added, &delta->changed})
      for (const auto& k : *keys)
        if (sel_.matches(k))
          if (const auto* st = newest_->find(k)) fill_service(*st, sel_, out->add_services());
    for (const auto& k : delta->removed)
      if (sel_.matches(k)) add_removed(out, k);
  }

  const ServiceContext sc_;
  const std::shared_ptr<ResponseCache> cache_;
  const uint64_t id_;
  const std::string peer_;
  bool refused_ = false;

  mutable std::mutex mu_;  // guards everything below; taken after the hub's lock, never before
  grpc::ByteBuffer in_bytes_;
  grpc::ByteBuffer out_bytes_;  // the response in flight (slices shared with the cache)
  v1::WatchRequest in_;
  Selection sel_;
  std::string sel_key_;
  std::string client_;
  bool subscribed_ = false;
  bool need_full_ = false;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  grpc::Status status_;
  model::SnapshotPtr basis_;   // the state the last response brought the client to
  model::SnapshotPtr newest_;  // the newest snapshot known
  AckTracker acks_;
};

class WatchService final
    : public v1::UpstreamFeed::WithRawCallbackMethod_Watch<v1::UpstreamFeed::Service> {
 public:
  explicit WatchService(ServiceContext sc) : sc_(std::move(sc)) {}
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Watch(
      grpc::CallbackServerContext* ctx) override {
    return new WatchStream(ctx, sc_, cache_);
  }

 private:
  ServiceContext sc_;
  std::shared_ptr<ResponseCache> cache_ = std::make_shared<ResponseCache>();
};

}  // namespace

std::unique_ptr<grpc::Service> make_watch_service(ServiceContext ctx) {
  return std::make_unique<WatchService>(std::move(ctx));
}

}  // namespace endpointd::feed
