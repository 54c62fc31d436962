// envoy.service.discovery.v3.AggregatedDiscoveryService: LDS, RDS, CDS and EDS over one
// stream, state of the world (StreamAggregatedResources) and delta (DeltaAggregatedResources).
// A FeedStream per stream (at most one response in flight); per resource type the
// stream remembers what it sent, so a new snapshot produces a response only for the types
// whose resources really changed, built from the newest snapshot (slow readers coalesce).
// ACK/NACK by nonce; only the ACK of a ClusterLoadAssignment response moves the stream's
// acknowledged generation (endpoints live in EDS), a NACK never does.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <map>
#include <set>
#include <type_traits>

#include "envoy/service/discovery/v3/discovery.grpc.pb.h"
#include "feed/resources.h"
#include "feed/services.h"
#include "feed/stream.h"

namespace endpointd::feed {

namespace {

namespace disc = envoy::service::discovery::v3;
using Reject = Metrics::Reject;

struct Built {
  model::ServiceStatePtr src;  // null for an EDS resource of a service that does not exist
  google::protobuf::Any any;
};
using Resources = std::map<std::string, Built>;

struct TypeState {
  std::string url;
  XdsType type = XdsType::kUnknown;
  bool requested = false;
  bool wildcard = false;
  std::set<std::string> names;
  std::set<std::string> force;  // delta: newly subscribed, answer even if unchanged
  bool dirty = false;           // the subscription changed: answer even if nothing else did
  Resources sent;               // SotW: the last response; delta: what the client holds
  model::SnapshotPtr basis;     // the snapshot `sent` was computed from
  std::string nonce;            // of the last response of this type
  uint64_t version = 0;         // generation of the last response
  uint64_t nacks = 0;
  std::string last_nack;
};

std::string version_hash(const google::protobuf::Any& a) {
  char buf[17];
  snprintf(buf, sizeof buf, "%016zx", std::hash<std::string>{}(a.value()));
  return buf;
}

// Per stream: type URLs (endpointd serves four; a few unknown ones get empty answers) and
// subscribed names per type (a cluster's service ports, with room to spare). Past either the
// stream ends with RESOURCE_EXHAUSTED, counted as rejected{reason="stream_limit"}.
constexpr size_t kMaxTypesPerStream = 8;
constexpr size_t kMaxNamesPerType = 100000;

template <bool kDelta>
class AdsStream final : public FeedStream {
  using Request = std::conditional_t<kDelta, disc::DeltaDiscoveryRequest, disc::DiscoveryRequest>;
  using Response =
      std::conditional_t<kDelta, disc::DeltaDiscoveryResponse, disc::DiscoveryResponse>;

 public:
  AdsStream(grpc::CallbackServerContext* ctx, ServiceContext sc)
      : FeedStream(ctx, std::move(sc), kDelta ? Metrics::Api::kDeltaAds : Metrics::Api::kAds) {
    xctx_.zone = sc_.zone;
    start("an xDS stream");
  }

  SubscriberInfo info() const override {
    std::lock_guard lock(mu_);
    SubscriberInfo i;
    i.id = id_;
    i.api = kDelta ? "delta-ads" : "ads";
    i.peer = peer_;
    i.client = node_id_;
    for (const auto& [url, ts] : types_) {
      if (!ts.requested) continue;
      if (!i.subscription.empty()) i.subscription += " ";
      i.subscription +=
          std::string(short_name(ts.type)) + "=" +
          (ts.wildcard ? std::string("*") : std::to_string(ts.names.size()) + " names");
      i.nacks += ts.nacks;
      if (!ts.last_nack.empty())
        i.last_nack = std::string(short_name(ts.type)) + ": " + ts.last_nack;
    }
    i.sent_version = acks_.sent_version();
    i.acked_version = acks_.acked_version();
    i.acked_generation = acks_.acked() ? acks_.acked()->generation : 0;
    return i;
  }

 private:
  bool handle_request_locked(bool* acks_moved) override {
    // Raw bytes in, parsed here: a request that does not parse ends the stream with
    // INVALID_ARGUMENT (gRPC's own parsing would only report a failed read).
    if (!grpc::SerializationTraits<Request>::Deserialize(&in_bytes_, &in_).ok()) {
      sc_.metrics->rejected(Reject::kMalformed);
      spdlog::warn("feed: malformed {} from {}",
                   kDelta ? "DeltaDiscoveryRequest" : "DiscoveryRequest", peer_);
      finish_locked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 kDelta ? "endpointd feed: malformed DeltaDiscoveryRequest"
                                        : "endpointd feed: malformed DiscoveryRequest"));
      return false;
    }
    if (in_.type_url().empty()) {
      sc_.metrics->rejected(Reject::kUnknownType);
      finish_locked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "endpointd feed: an ADS request must carry a type_url"));
      return false;
    }
    // What one stream may hold: a few type URLs (four are endpointd's) and a bounded number of
    // subscribed names per type, so that one client cannot grow the agent without bound.
    std::string why;
    if (!types_.count(in_.type_url()) && types_.size() >= kMaxTypesPerStream)
      why = "more than " + std::to_string(kMaxTypesPerStream) + " type URLs on one stream";
    size_t asked = 0;
    if constexpr (kDelta) {
      auto it = types_.find(in_.type_url());
      asked = (it == types_.end() ? 0 : it->second.names.size()) +
              static_cast<size_t>(in_.resource_names_subscribe_size());
    } else {
      asked = static_cast<size_t>(in_.resource_names_size());
    }
    if (asked > kMaxNamesPerType)
      why = "more than " + std::to_string(kMaxNamesPerType) + " resource names of one type";
    if (!why.empty()) {
      sc_.metrics->rejected(Reject::kStreamLimit);
      spdlog::warn("feed: {} (node {}) closed: {}", peer_, node_id_, why);
      finish_locked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "endpointd feed: " + why));
      return false;
    }
    if (in_.has_node() && node_id_.empty()) {
      node_id_ = in_.node().id();
      identity_ = node_id_;  // the stream's identity (feed/hub.h)
      xctx_.client_zone = in_.node().locality().zone();
    }
    *acks_moved = handle_locked();
    *acks_moved = maybe_write_locked() || *acks_moved;
    return true;
  }

  TypeState& type_state(const std::string& url) {
    auto [it, fresh] = types_.try_emplace(url);
    if (fresh) {
      it->second.url = url;
      it->second.type = xds_type(url);
      if (it->second.type == XdsType::kUnknown) {
        sc_.metrics->rejected(Reject::kUnknownType);
        spdlog::warn("feed: {} asked for unknown type {}; it gets empty answers", peer_, url);
      }
    }
    return it->second;
  }

  // ACK/NACK and subscription changes of one request. Returns true when acks moved.
  bool handle_locked() {
    TypeState& ts = type_state(in_.type_url());
    bool acks_moved = false;
    const std::string& nonce = in_.response_nonce();
    bool stale = false;
    if (!nonce.empty()) {
      if (nonce != ts.nonce) {
        // An answer to an older response; the client will answer the newer one too.
        sc_.metrics->rejected(Reject::kStaleNonce);
        stale = true;
      } else if (in_.has_error_detail()) {
        ++ts.nacks;
        ts.last_nack = in_.error_detail().message();
        sc_.metrics->nack(api_);
        acks_.nacked();
        spdlog::warn("feed: {} (node {}) rejected {} version {}: {}", peer_, node_id_,
                     short_name(ts.type), ts.version, ts.last_nack);
      } else {
        sc_.metrics->ack(api_);
        if (ts.type == XdsType::kEndpoint) {
          if (acks_.ack(ts.version)) {
            acks_moved = true;
          } else {
            bogus_ack_locked(ts.version);
          }
        }
      }
    }
    if constexpr (kDelta) {
      const bool first = !ts.requested;
      ts.requested = true;
      for (const auto& n : in_.resource_names_subscribe()) {
        if (n == "*") {
          ts.wildcard = true;
          continue;
        }
        check_name(ts, n);
        ts.names.insert(n);
        ts.force.insert(n);
      }
      for (const auto& n : in_.resource_names_unsubscribe()) {
        if (n == "*") ts.wildcard = false;
        ts.names.erase(n);
        ts.force.erase(n);
        ts.sent.erase(n);
      }
      if (first && in_.resource_names_subscribe_size() == 0 &&
          (ts.type == XdsType::kListener || ts.type == XdsType::kCluster))
        ts.wildcard = true;
      if (first) ts.dirty = true;
    } else {
      if (stale) return acks_moved;  // a stale request's names are not the client's latest
      std::set<std::string> names;
      bool wildcard = false;
      for (const auto& n : in_.resource_names()) {
        if (n == "*") {
          wildcard = true;
        } else {
          names.insert(n);
        }
      }
      if (names.empty() && (ts.type == XdsType::kListener || ts.type == XdsType::kCluster))
        wildcard = true;
      if (!ts.requested || nonce.empty() || names != ts.names || wildcard != ts.wildcard) {
        if (names != ts.names)
          for (const auto& n : names)
            if (!ts.names.count(n)) check_name(ts, n);
        ts.names = std::move(names);
        ts.wildcard = wildcard;
        ts.requested = true;
        ts.dirty = true;
      }
    }
    return acks_moved;
  }

  void check_name(const TypeState& ts, const std::string& n) {
    if (ts.type != XdsType::kUnknown && !parse_resource_name(ts.type, n, sc_.zone)) {
      sc_.metrics->rejected(Reject::kBadResourceName);
      // Logged at the 1st, 2nd, 4th... per stream: a client subscribing to thousands of
      // unknown names must not fill the log.
      if (uint64_t k = ++bad_names_; (k & (k - 1)) == 0)
        spdlog::info(
            "feed: {} subscribed to {} {}, which is no endpointd resource name ({} so "
            "far on this stream)",
            peer_, short_name(ts.type), n, k);
    }
  }
  uint64_t bad_names_ = 0;

  void add(Resources& out, const TypeState& ts, const std::string& name, const ServicePortName& spn,
           model::ServiceStatePtr src) {
    auto prev = ts.sent.find(name);
    if (prev != ts.sent.end() && src && prev->second.src == src) {
      out.emplace(name, prev->second);  // same service state: same resource
      return;
    }
    Built b{src, build_resource(ts.type, spn, src.get(), xctx_)};
    out.emplace(name, std::move(b));
  }

  // What the client should hold of this type at snapshot `s`.
  Resources desired(const TypeState& ts, const model::Snapshot& s) {
    Resources out;
    if (ts.type == XdsType::kUnknown) return out;
    const bool named = ts.type == XdsType::kListener || ts.type == XdsType::kRoute;
    if (ts.wildcard) {
      for (const auto& st : s.services)
        for (uint16_t port : xds_ports(*st)) {
          ServicePortName spn{st->key(), port};
          add(out, ts,
              named ? listener_name(spn.key, port, sc_.zone)
                    : cluster_name(spn.key, port, sc_.zone),
              spn, st);
        }
    }
    for (const auto& name : ts.names) {
      if (out.count(name)) continue;
      auto spn = parse_resource_name(ts.type, name, sc_.zone);
      if (!spn) continue;
      auto st = s.find_ptr(spn->key);
      if (st && has_xds_port(*st, spn->port)) {
        add(out, ts, name, *spn, std::move(st));
      } else if (ts.type == XdsType::kEndpoint) {
        add(out, ts, name, *spn, nullptr);  // exists with no endpoints until the service does
      }
    }
    return out;
  }

  static bool same(const Resources& a, const Resources& b) {
    if (a.size() != b.size()) return false;
    for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib)
      if (ia->first != ib->first || ia->second.any.value() != ib->second.any.value()) return false;
    return true;
  }

  // Sends the first type that needs an answer, if nothing is in flight. Returns true when
  // acked() moved without a send.
  bool maybe_write_locked() override {
    if (writing_ || finishing_ || !newest_) return false;
    bool acks_moved = false;
    // Make before break: clusters before their endpoints, listeners before their routes.
    std::vector<TypeState*> order;
    for (std::string_view url : {kClusterType, kEndpointType, kListenerType, kRouteType})
      if (auto it = types_.find(std::string(url)); it != types_.end()) order.push_back(&it->second);
    for (auto& [url, ts] : types_)
      if (ts.type == XdsType::kUnknown) order.push_back(&ts);
    for (TypeState* ts : order) {
      if (!ts->requested) continue;
      if (ts->basis == newest_ && !ts->dirty && ts->force.empty()) continue;
      Resources want = desired(*ts, *newest_);
      if (send_locked(*ts, std::move(want))) {
        if (ts->type == XdsType::kEndpoint) acks_.sent(newest_, sc_.hub->now());
        return acks_moved;
      }
      ts->basis = newest_;
      if (ts->type == XdsType::kEndpoint) {
        acks_.unchanged(newest_);
        acks_moved = true;
      }
    }
    auto eds = types_.find(std::string(kEndpointType));
    if (eds == types_.end() || !eds->second.requested) {
      acks_.unchanged(newest_);  // no endpoints asked for: it routes by nothing we send
      acks_moved = true;
    }
    return acks_moved;
  }

  // Starts the write of a response if `want` differs from what the client has (or the
  // subscription changed); false when there is nothing to say.
  bool send_locked(TypeState& ts, Resources want) {
    out_.Clear();
    out_.set_type_url(ts.url);
    if constexpr (kDelta) {
      for (const auto& [name, b] : want) {
        auto prev = ts.sent.find(name);
        if (prev != ts.sent.end() && prev->second.any.value() == b.any.value() &&
            !ts.force.count(name))
          continue;
        auto* r = out_.add_resources();
        r->set_name(name);
        r->set_version(version_hash(b.any));
        *r->mutable_resource() = b.any;
      }
      for (const auto& [name, b] : ts.sent)
        if (!want.count(name)) out_.add_removed_resources(name);
      for (const auto& name : ts.force)
        if (!want.count(name) && !ts.sent.count(name)) out_.add_removed_resources(name);
      const bool say = ts.dirty || out_.resources_size() > 0 || out_.removed_resources_size() > 0;
      ts.force.clear();
      if (!say) return false;
      out_.set_system_version_info(std::to_string(newest_->generation));
    } else {
      if (!ts.dirty && same(want, ts.sent)) return false;
      for (const auto& [name, b] : want) *out_.add_resources() = b.any;
      out_.set_version_info(std::to_string(newest_->generation));
    }
    ts.dirty = false;
    ts.sent = std::move(want);
    ts.basis = newest_;
    ts.version = newest_->generation;
    ts.nonce = std::to_string(++nonce_);
    out_.set_nonce(ts.nonce);
    bool own = false;
    grpc::ByteBuffer bytes;
    if (!grpc::SerializationTraits<Response>::Serialize(out_, &bytes, &own).ok()) {
      finish_locked(grpc::Status(grpc::StatusCode::INTERNAL, "endpointd feed: cannot encode"));
      return true;
    }
    out_.Clear();  // the bytes are what is sent; the message would only hold memory
    start_write_locked(bytes);
    return true;
  }

  // Guarded by mu_:
  Request in_;
  Response out_;
  XdsContext xctx_;
  std::string node_id_;
  std::map<std::string, TypeState> types_;
  uint64_t nonce_ = 0;
};

using RawAds = disc::AggregatedDiscoveryService::WithRawCallbackMethod_StreamAggregatedResources<
    disc::AggregatedDiscoveryService::WithRawCallbackMethod_DeltaAggregatedResources<
        disc::AggregatedDiscoveryService::Service>>;

class AdsService final : public RawAds {
 public:
  explicit AdsService(ServiceContext sc) : sc_(std::move(sc)) {}
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StreamAggregatedResources(
      grpc::CallbackServerContext* ctx) override {
    return new AdsStream<false>(ctx, sc_);
  }
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DeltaAggregatedResources(
      grpc::CallbackServerContext* ctx) override {
    return new AdsStream<true>(ctx, sc_);
  }

 private:
  ServiceContext sc_;
};

}  // namespace

std::unique_ptr<grpc::Service> make_ads_service(ServiceContext ctx) {
  return std::make_unique<AdsService>(std::move(ctx));
}

}  // namespace endpointd::feed
