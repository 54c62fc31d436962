// libFuzzer target: a request to the feed as its streams first take it — raw bytes
// deserialized as gRPC hands them over (SerializationTraits over a ByteBuffer) into a
// WatchRequest, DiscoveryRequest or DeltaDiscoveryRequest (the first byte chooses) — then the
// pure handling of what it asks for: a Subscribe's Selection; an xDS type URL, each resource
// name parsed, built back and parsed again, and the resource built for it. What a stream
// remembers between requests (nonces, ACK/NACK, names per type) lives in the gRPC reactors of
// feed/ads.cc and feed/watch.cc and is not reachable without a server.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <cstdint>
#include <memory>
#include <string>

#include "endpointd/v1/feed.pb.h"
#include "envoy/service/discovery/v3/discovery.pb.h"
#include "feed/resources.h"

namespace {

using namespace endpointd;
using feed::XdsType;
namespace disc = envoy::service::discovery::v3;

// default/web: TCP 80 with a ready and a terminating endpoint, UDP 53 (no xDS resources).
const model::ServiceState& web() {
  static const auto st = [] {
    auto s = std::make_shared<model::ServiceState>();
    s->service.key = {"default", "web"};
    s->service.cluster_ips = {*model::IpAddr::parse("10.96.0.10")};
    model::ServicePort http;
    http.name = "http";
    http.port = 80;
    http.target_port_name = "http";
    s->service.ports.push_back(http);
    model::ServicePort dns;
    dns.name = "dns";
    dns.protocol = model::Protocol::kUDP;
    dns.port = 53;
    dns.target_port_number = 53;
    s->service.ports.push_back(dns);
    for (const char* ip : {"10.1.0.1", "10.1.0.2"}) {
      model::MergedEndpoint m;
      m.address = *model::IpAddr::parse(ip);
      bool first = ip[7] == '1';
      m.conditions = {first, true, !first};
      m.ports.push_back({"http", model::Protocol::kTCP, 8080, ""});
      m.zone = first ? "zone-a" : "zone-b";
      m.node_name = "node-a";
      m.target_ref = model::ObjectRef{"Pod", "default", std::string("web-") + ip, "uid"};
      s->endpoints.push_back(m);
    }
    return s;
  }();
  return *st;
}

template <typename M>
bool deserialize(const uint8_t* data, size_t size, M* msg) {
  grpc::Slice slice(data, size);
  grpc::ByteBuffer bytes(&slice, 1);
  return grpc::SerializationTraits<M>::Deserialize(&bytes, msg).ok();
}

void selection(const v1::Subscribe& sub) {
  auto sel = feed::Selection::from(sub);
  if (!sel) return;
  (void)sel->str();
  if (sel->exact_only())
    for (const auto& s : sel->selectors)
      if (s.name.empty()) __builtin_trap();
  const model::ServiceKey& k = web().key();
  if (sel->carries_port(k, 80) && !sel->matches(k)) __builtin_trap();
  if (sel->matches(k)) {
    v1::ServiceEndpoints out;
    feed::fill_service(web(), *sel, &out);
  }
}

void resource_name(XdsType t, const std::string& name, const feed::XdsContext& ctx) {
  if (name == "*") return;
  auto spn = feed::parse_resource_name(t, name, ctx.zone);
  if (!spn) return;
  if (spn->port == 0 || spn->key.ns.empty() || spn->key.name.empty()) __builtin_trap();
  // A name that parses names the same service port once built back.
  const bool named = t == XdsType::kListener || t == XdsType::kRoute;
  std::string back = named ? feed::listener_name(spn->key, spn->port, ctx.zone)
                           : feed::cluster_name(spn->key, spn->port, ctx.zone);
  auto again = feed::parse_resource_name(t, back, ctx.zone);
  if (!again || again->key != spn->key || again->port != spn->port) __builtin_trap();
  const model::ServiceState* st =
      spn->key == web().key() && feed::has_xds_port(web(), spn->port) ? &web() : nullptr;
  if (!st && t != XdsType::kEndpoint) return;  // the stream sends these only for services
  auto any = feed::build_resource(t, *spn, st, ctx);
  if (any.type_url() != feed::type_url(t)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // an error line per invalid UTF-8 string
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 1 << 20) return 0;
  const uint8_t which = data[0] % 3;
  ++data;
  --size;
  feed::XdsContext ctx;  // the default zone, cluster.local
  if (which == 0) {
    v1::WatchRequest req;
    if (!deserialize(data, size, &req)) return 0;
    if (req.has_subscribe()) selection(req.subscribe());
  } else if (which == 1) {
    disc::DiscoveryRequest req;
    if (!deserialize(data, size, &req)) return 0;
    XdsType t = feed::xds_type(req.type_url());
    if (t == XdsType::kUnknown) return 0;
    ctx.client_zone = req.node().locality().zone();
    for (const auto& n : req.resource_names()) resource_name(t, n, ctx);
  } else {
    disc::DeltaDiscoveryRequest req;
    if (!deserialize(data, size, &req)) return 0;
    XdsType t = feed::xds_type(req.type_url());
    if (t == XdsType::kUnknown) return 0;
    ctx.client_zone = req.node().locality().zone();
    for (const auto& n : req.resource_names_subscribe()) resource_name(t, n, ctx);
    for (const auto& n : req.resource_names_unsubscribe()) resource_name(t, n, ctx);
  }
  return 0;
}
