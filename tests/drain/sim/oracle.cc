// The oracle (oracle.h): the planner's tables, the feed's messages and the DNS zone, read back.
// Nothing here may call model/routing.h (drain_sim_oracle_independent checks the object file).
#include "tests/drain/sim/oracle.h"

#include "dns/message.h"
#include "dns/zone.h"
#include "endpointd/v1/feed.pb.h"
#include "envoy/config/endpoint/v3/endpoint.pb.h"
#include "feed/resources.h"
#include "proxy/planner.h"

namespace endpointd::drain::sim {
namespace {

constexpr size_t kCacheMax = 4096;

// The address a DNAT element sends to: `<addr> . <port>` data of a backend map, or the backend
// field of an affinity-backends key (`<vip> . proto . port . <addr> . <port>`).
void dnat_targets(const proxy::Table& t, std::set<model::IpAddr>& out) {
  const size_t alen = t.family == model::IpFamily::kV4 ? 4 : 16;
  for (const auto& [name, set] : t.sets) {
    if (set.shape == proxy::SetShape::kBackends) {
      for (const auto& e : set.elements) {
        if (e.data.size() < alen) continue;
        out.insert(
            model::IpAddr::from_bytes(t.family, reinterpret_cast<const uint8_t*>(e.data.data())));
      }
    } else if (set.shape == proxy::SetShape::kVipBackendSet) {
      const size_t at = alen + 4 + 4;  // after the VIP, its protocol and its port
      for (const auto& e : set.elements) {
        if (e.key.size() < at + alen) continue;
        out.insert(model::IpAddr::from_bytes(t.family,
                                             reinterpret_cast<const uint8_t*>(e.key.data() + at)));
      }
    }
  }
}

}  // namespace

bool Oracle::kernel_routes(const model::Snapshot& snap, const std::string& node,
                           const model::IpAddr& ip) {
  auto key = std::make_pair(snap.generation, node);
  auto it = kernel_.find(key);
  if (it == kernel_.end()) {
    if (kernel_.size() >= kCacheMax) kernel_.clear();
    ++builds_;
    proxy::NodeContext base;
    base.node_name = node;
    proxy::Planner planner(proxy::node_context_from(base, snap));
    planner.reset(snap);
    std::set<model::IpAddr> targets;
    for (auto f : planner.families()) dnat_targets(planner.table(f), targets);
    it = kernel_.emplace(key, std::move(targets)).first;
  }
  return it->second.count(ip) > 0;
}

Oracle::FeedHold Oracle::feed_holds(const model::Snapshot& snap, const model::IpAddr& ip) {
  auto it = feed_.find(snap.generation);
  if (it == feed_.end()) {
    if (feed_.size() >= kCacheMax) feed_.clear();
    ++builds_;
    Feed held;
    feed::Selection all;
    all.all = true;
    feed::XdsContext ctx;
    for (const auto& st : snap.services) {
      // endpointd.v1.UpstreamFeed: a subscriber routes by each endpoint's verdict.
      v1::ServiceEndpoints msg;
      feed::fill_service(*st, all, &msg);
      for (const auto& port : msg.ports()) {
        for (const auto& e : port.endpoints()) {
          if (e.routing() != v1::ROUTED && e.routing() != v1::ROUTED_FALLBACK &&
              e.routing() != v1::ROUTING_UNSPECIFIED)
            continue;
          if (auto a = model::IpAddr::parse(e.address())) held.upstream.insert(*a);
        }
      }
      // xDS: the ClusterLoadAssignment of every port that has one.
      for (uint16_t port : feed::xds_ports(*st)) {
        auto any =
            feed::build_resource(feed::XdsType::kEndpoint, {st->service.key, port}, st.get(), ctx);
        envoy::config::endpoint::v3::ClusterLoadAssignment cla;
        if (!any.UnpackTo(&cla)) continue;
        namespace core = envoy::config::core::v3;
        size_t healthy = 0, hosts = 0;
        for (const auto& loc : cla.endpoints())
          for (const auto& lb : loc.lb_endpoints()) {
            ++hosts;
            if (lb.health_status() == core::HEALTHY || lb.health_status() == core::UNKNOWN)
              ++healthy;
          }
        for (const auto& loc : cla.endpoints()) {
          for (const auto& lb : loc.lb_endpoints()) {
            auto a = model::IpAddr::parse(lb.endpoint().address().socket_address().address());
            if (!a) continue;
            auto h = lb.health_status();
            if (h == core::HEALTHY || h == core::UNKNOWN || (h == core::DRAINING && healthy == 0))
              held.eds.insert(*a);
            else if (healthy * 2 < hosts)
              held.eds_panic.insert(*a);
          }
        }
      }
    }
    it = feed_.emplace(snap.generation, std::move(held)).first;
  }
  FeedHold out;
  out.upstream = it->second.upstream.count(ip) > 0;
  out.eds = it->second.eds.count(ip) > 0;
  out.eds_panic = !out.eds && it->second.eds_panic.count(ip) > 0;
  return out;
}

const std::vector<model::IpAddr>& Oracle::dns_answer(const model::Snapshot& snap,
                                                     std::string_view name, bool aaaa) {
  auto key = std::make_pair(snap.generation, std::string(name) + (aaaa ? "/AAAA" : "/A"));
  auto it = dns_.find(key);
  if (it != dns_.end()) return it->second;
  if (dns_.size() >= kCacheMax) dns_.clear();
  ++builds_;
  std::vector<model::IpAddr> out;
  auto zone = dns::Zone::build(snap, dns::ZoneOptions{});
  if (auto qname = dns::name_from_text(name)) {
    dns::lowercase_name({qname->bytes.data(), qname->len});
    auto r = zone->lookup(*qname, aaaa ? dns::type::kAAAA : dns::type::kA);
    if (r.kind == dns::Zone::Kind::kAnswer && r.set)
      out.assign(r.set->addresses.begin(), r.set->addresses.end());
  }
  return dns_.emplace(key, std::move(out)).first->second;
}

}  // namespace endpointd::drain::sim
