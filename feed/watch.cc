// endpointd.v1.UpstreamFeed/Watch: a FeedStream that speaks WatchRequest / WatchResponse.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <list>
#include <unordered_map>
#include <vector>

#include "endpointd/v1/feed.grpc.pb.h"
#include "feed/resources.h"
#include "feed/services.h"
#include "feed/stream.h"

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

class WatchStream final : public FeedStream {
 public:
  WatchStream(grpc::CallbackServerContext* ctx, ServiceContext sc,
              std::shared_ptr<ResponseCache> cache)
      : FeedStream(ctx, std::move(sc), Metrics::Api::kWatch), cache_(std::move(cache)) {
    start("a watch stream");
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

 private:
  bool handle_request_locked(bool* acks_moved) override {
    if (!grpc::SerializationTraits<v1::WatchRequest>::Deserialize(&in_bytes_, &in_).ok()) {
      sc_.metrics->rejected(Reject::kMalformed);
      spdlog::warn("feed: malformed WatchRequest from {}", peer_);
      finish_locked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "endpointd feed: malformed WatchRequest"));
      return false;
    }
    switch (in_.request_case()) {
      case v1::WatchRequest::kSubscribe: {
        auto sel = Selection::from(in_.subscribe());
        if (!sel) {
          sc_.metrics->rejected(Reject::kInvalidSubscribe);
          spdlog::warn("feed: invalid Subscribe from {}: {}", peer_, sel.error());
          finish_locked(
              grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "endpointd feed: " + sel.error()));
          return false;
        }
        sel_ = std::move(*sel);
        sel_key_ = sel_.str();
        exact_ = sel_.exact_only();
        exact_keys_.clear();
        if (exact_) {
          for (const auto& x : sel_.selectors) exact_keys_.push_back({x.ns, x.name});
          std::sort(exact_keys_.begin(), exact_keys_.end());
          exact_keys_.erase(std::unique(exact_keys_.begin(), exact_keys_.end()), exact_keys_.end());
        }
        // The first name given is the stream's identity (feed/hub.h); a later Subscribe changes
        // the selection, not who the client is.
        if (client_.empty()) {
          client_ = in_.subscribe().client_name();
          identity_ = client_;
        }
        subscribed_ = true;
        need_full_ = true;
        *acks_moved = maybe_write_locked();
        return true;
      }
      case v1::WatchRequest::kAck:
        sc_.metrics->ack(Metrics::Api::kWatch);
        if (acks_.ack(in_.ack().version())) {
          *acks_moved = true;
        } else {
          bogus_ack_locked(in_.ack().version());
        }
        return true;
      case v1::WatchRequest::REQUEST_NOT_SET:
        break;
    }
    sc_.metrics->rejected(Reject::kInvalidSubscribe);
    finish_locked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "endpointd feed: a WatchRequest holds a subscribe or an ack"));
    return false;
  }

  // Sends what the subscriber lacks, if nothing is in flight. Returns true when acked()
  // moved without a send (the new snapshot changed nothing this subscriber sees).
  bool maybe_write_locked() override {
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
    grpc::ByteBuffer bytes;
    bool ok;
    {
      std::lock_guard build(entry->mu);
      if (!entry->built) {
        entry->built = true;
        entry->ok = encode(full, &entry->bytes);
      }
      ok = entry->ok;
      if (ok) bytes = entry->bytes;  // shares the slices
    }
    if (!ok) {
      finish_locked(grpc::Status(grpc::StatusCode::INTERNAL, "endpointd feed: cannot encode"));
      return false;
    }
    start_write_locked(bytes);
    basis_ = newest_;
    acks_.sent(newest_, sc_.hub->now());
    return false;
  }

  // Whether anything this subscriber receives differs between basis_ and newest_.
  bool changed_for_me() {
    if (exact_) {
      for (const auto& k : exact_keys_)
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

  void build_full(v1::WatchResponse* out) {
    if (exact_) {
      for (const auto& k : exact_keys_)
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
    if (exact_) {
      for (const auto& k : exact_keys_) {
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

  const std::shared_ptr<ResponseCache> cache_;
  // Guarded by mu_:
  v1::WatchRequest in_;
  Selection sel_;
  std::string sel_key_;
  bool exact_ = false;                         // only exact ns/name selectors
  std::vector<model::ServiceKey> exact_keys_;  // their services, sorted, each once
  std::string client_;
  bool subscribed_ = false;
  bool need_full_ = false;
  model::SnapshotPtr basis_;  // the state the last response brought the client to
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
