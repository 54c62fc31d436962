// The oracle (oracle.h): the planner's tables, the feed's messages and the DNS zone, read back.
// Nothing here may call model/routing.h (drain_sim_oracle_independent checks the object file).
#include "tests/drain/sim/oracle.h"

#include <optional>

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

Oracle::Oracle() = default;
Oracle::~Oracle() = default;

namespace {

Oracle::ServicesKey services_key(const model::Snapshot& snap, Oracle::Services* keep) {
  Oracle::ServicesKey key;
  for (const auto& st : snap.services) {
    key.push_back(st.get());
    if (keep) keep->push_back(st);
  }
  return key;
}

// What a kernel's plan reads besides the services: which node it is and the Nodes' addresses
// (node_context_from).
std::string context_key(const model::Snapshot& snap, const std::string& node) {
  std::string k = node;
  for (const auto& n : snap.nodes) {
    k += '|' + n->name + ':' + n->zone;
    for (const auto& a : n->addresses) k += ',' + a.type + '=' + a.address;
    for (const auto& c : n->pod_cidrs) k += ',' + c.str();
  }
  return k;
}

// The service a name of the cluster zone names: <service>.<namespace>.svc.<zone>.
std::optional<model::ServiceKey> service_of_name(std::string_view name) {
  std::vector<std::string_view> labels;
  while (!name.empty()) {
    size_t dot = name.find('.');
    labels.push_back(name.substr(0, dot));
    if (dot == std::string_view::npos) break;
    name.remove_prefix(dot + 1);
  }
  if (labels.size() < 4 || labels[2] != "svc") return std::nullopt;
  return model::ServiceKey{std::string(labels[1]), std::string(labels[0])};
}

}  // namespace

bool Oracle::kernel_routes(const model::Snapshot& snap, const std::string& node,
                           const model::IpAddr& ip) {
  return kernel_targets(snap, node).count(ip) > 0;
}

const std::set<model::IpAddr>& Oracle::kernel_targets(const model::Snapshot& snap,
                                                      const std::string& node) {
  auto key = std::make_pair(services_key(snap, nullptr), context_key(snap, node));
  auto it = kernel_.find(key);
  if (it == kernel_.end()) {
    if (kernel_.size() >= kCacheMax) kernel_.clear();
    ++builds_;
    Kernel k;
    services_key(snap, &k.keep);
    // The node's planner moves from the state it planned last by the difference, as the proxy
    // sink's does (Planner::update); a new node or another context plans whole (reset).
    proxy::NodeContext base;
    base.node_name = node;
    auto ctx = proxy::node_context_from(base, snap);
    auto& p = planners_[node];
    if (!p.planner || p.planner->context() != ctx) {
      p.planner = std::make_unique<proxy::Planner>(ctx);
      p.planner->reset(snap);
    } else {
      p.planner->update(snap, model::diff(&p.last, snap));
    }
    p.last = snap;
    for (auto f : p.planner->families()) dnat_targets(p.planner->table(f), k.targets);
    it = kernel_.emplace(std::move(key), std::move(k)).first;
  }
  return it->second.targets;
}

Oracle::FeedHold Oracle::feed_holds(const model::Snapshot& snap, const model::IpAddr& ip) {
  FeedHold out;
  for (const auto& st : snap.services) {
    auto it = feed_.find(st.get());
    if (it == feed_.end()) {
      if (feed_.size() >= kCacheMax) feed_.clear();
      ++builds_;
      it = feed_.emplace(st.get(), std::make_pair(st, encode(*st))).first;
    }
    const Feed& held = it->second.second;
    out.upstream = out.upstream || held.upstream.count(ip) > 0;
    out.eds = out.eds || held.eds.count(ip) > 0;
    out.eds_panic = out.eds_panic || held.eds_panic.count(ip) > 0;
  }
  out.eds_panic = !out.eds && out.eds_panic;
  return out;
}

Oracle::Feed Oracle::encode(const model::ServiceState& svc) {
  Feed held;
  feed::Selection all;
  all.all = true;
  feed::XdsContext ctx;
  // endpointd.v1.UpstreamFeed: a subscriber routes by each endpoint's verdict.
  v1::ServiceEndpoints msg;
  feed::fill_service(svc, all, &msg);
  for (const auto& port : msg.ports()) {
    for (const auto& e : port.endpoints()) {
      if (e.routing() != v1::ROUTED && e.routing() != v1::ROUTED_FALLBACK &&
          e.routing() != v1::ROUTING_UNSPECIFIED)
        continue;
      if (auto a = model::IpAddr::parse(e.address())) held.upstream.insert(*a);
    }
  }
  // xDS: the ClusterLoadAssignment of every port that has one.
  for (uint16_t port : feed::xds_ports(svc)) {
    auto any = feed::build_resource(feed::XdsType::kEndpoint, {svc.service.key, port}, &svc, ctx);
    envoy::config::endpoint::v3::ClusterLoadAssignment cla;
    if (!any.UnpackTo(&cla)) continue;
    namespace core = envoy::config::core::v3;
    size_t healthy = 0, hosts = 0;
    for (const auto& loc : cla.endpoints())
      for (const auto& lb : loc.lb_endpoints()) {
        ++hosts;
        if (lb.health_status() == core::HEALTHY || lb.health_status() == core::UNKNOWN) ++healthy;
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
  return held;
}

const std::vector<model::IpAddr>& Oracle::dns_answer(const model::Snapshot& snap,
                                                     std::string_view name, bool aaaa) {
  // A service's name: only that service's records answer it.
  const model::Snapshot* from = &snap;
  std::shared_ptr<model::Snapshot> one;
  if (auto svc = service_of_name(name)) {
    one = std::make_shared<model::Snapshot>();
    one->generation = snap.generation;
    one->slice_revision = snap.slice_revision;
    one->synced = snap.synced;
    std::vector<model::ServiceStatePtr> only;
    if (auto st = snap.find_ptr(*svc)) only.push_back(std::move(st));
    one->services = model::ServiceList(std::move(only));
    from = one.get();
  }
  auto key =
      std::make_pair(services_key(*from, nullptr), std::string(name) + (aaaa ? "/AAAA" : "/A"));
  auto it = dns_.find(key);
  if (it != dns_.end()) return it->second.addresses;
  if (dns_.size() >= kCacheMax) dns_.clear();
  ++builds_;
  Answer out;
  services_key(*from, &out.keep);
  // One builder for every snapshot asked about: it diffs from the one it applied last, as the
  // DNS sink's does.
  if (!zones_) zones_ = std::make_unique<dns::ZoneBuilder>(dns::ZoneOptions{});
  auto zone = zones_->apply(one ? one : std::make_shared<model::Snapshot>(snap));
  if (auto qname = dns::name_from_text(name)) {
    dns::lowercase_name({qname->bytes.data(), qname->len});
    auto r = zone->lookup(*qname, aaaa ? dns::type::kAAAA : dns::type::kA);
    if (r.kind == dns::Zone::Kind::kAnswer && r.set)
      out.addresses.assign(r.set->addresses.begin(), r.set->addresses.end());
  }
  return dns_.emplace(std::move(key), std::move(out)).first->second.addresses;
}

}  // namespace endpointd::drain::sim
