// The daemon's parts and their order: sinks and the update loop first, then the admin server,
// then the source, so that nothing a source says is lost.
#include "daemon/daemon.h"

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "daemon/admin.h"
#include "daemon/sources.h"
#include "daemon/state_json.h"
#include "dns/sink.h"
#include "drain/coordinator.h"
#include "feed/feed.h"
#include "pipeline/ack_board.h"
#include "pipeline/update_loop.h"
#include "proxy/conntrack.h"
#include "proxy/healthcheck.h"
#include "proxy/monitor.h"
#include "proxy/netlink.h"
#include "proxy/sink.h"

namespace endpointd::daemon {

struct Daemon::Impl {
  Config cfg;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  pipeline::AckBoard board;
  std::unique_ptr<pipeline::UpdateLoop> loop;
  std::unique_ptr<Source> source;
  std::unique_ptr<AdminServer> admin;
  std::unique_ptr<proxy::NetlinkBackend> netlink;
  std::unique_ptr<proxy::ProxySink> proxy_sink;
  // Shared with the netlink backend's quiet full sync hooks, which may outlive stop().
  std::shared_ptr<proxy::Monitor> monitor;
  std::unique_ptr<dns::DnsSink> dns_sink;
  std::unique_ptr<feed::FeedSink> feed_sink;
  std::unique_ptr<proxy::Conntrack> conntrack;
  std::unique_ptr<proxy::HealthCheckServer> health_checks;
  std::unique_ptr<drain::Coordinator> drain;

  bool start_proxy(std::string* error);
  bool start_dns(std::string* error);
  bool start_feed(std::string* error);
  bool start_drain(std::string* error);

  Probe healthz() {
    if (proxy_sink && !proxy_sink->healthy())
      return {false, "the nftables dataplane has an update queued that was not applied in time"};
    return {true, "ok"};
  }

  Probe readyz() {
    auto snap = loop->current();
    if (!snap->synced)
      return {false, "not synced: the first full list of cluster state has not arrived"};
    for (const auto& e : board.entries())
      if (!e.snapshot || !e.snapshot->synced)
        return {false, "sink " + e.consumer + " has not applied the first synced state"};
    return {true, "ok"};
  }

  std::string debug_state() {
    DebugState st;
    st.snapshot = loop->current();
    st.node_name = cfg.node_name;
    st.sinks = board.entries();
    if (source) st.source_errors = source->errors();
    if (drain) st.drains_json = drain->drains_json();
    return to_json(st);
  }
};

Daemon::Daemon(Config cfg) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(cfg);
}

Daemon::~Daemon() {
  stop();
}

int Daemon::admin_port() const {
  return impl_->admin ? impl_->admin->port() : -1;
}

bool Daemon::start(std::string* error) {
  auto& m = *impl_;
  pipeline::UpdateLoop::Options lo;
  lo.registry = m.registry.get();
  lo.expected_kinds = expected_kinds(m.cfg);
  m.loop = std::make_unique<pipeline::UpdateLoop>(lo);
  if (m.cfg.dataplane == "nftables" && !m.start_proxy(error)) return false;
  if (!m.cfg.dns_listen.empty() && !m.start_dns(error)) return false;
  if (!m.cfg.feed_listen.empty() && !m.start_feed(error)) return false;
  if (!m.start_drain(error)) return false;
  m.loop->on_publish([](const model::SnapshotPtr& s) {
    spdlog::debug("published generation {} ({} services, synced={})", s->generation,
                  s->services.size(), s->synced);
  });
  m.loop->start();

  AdminServer::Handlers h;
  h.healthz = [&m] { return m.healthz(); };
  h.livez = [] { return Probe{true, "ok"}; };
  h.readyz = [&m] { return m.readyz(); };
  h.debug_state = [&m] { return m.debug_state(); };
  m.admin = std::make_unique<AdminServer>(std::move(h), m.registry.get());
  if (!m.cfg.admin_listen.empty() && !m.admin->start(m.cfg.admin_listen, error)) return false;

  auto post = [loop = m.loop.get()](model::Event ev) { loop->post(std::move(ev)); };
  auto src = make_source(m.cfg, post, m.registry.get(), error);
  if (!src) return false;
  m.source = std::move(src);
  if (!m.source->start(error)) return false;
  spdlog::info("endpointd running on node {} ({})", m.cfg.node_name, m.source->describe());
  return true;
}

void Daemon::stop() {
  if (!impl_) return;
  auto& m = *impl_;
  // The dataplane is left as it is: traffic keeps flowing while the agent restarts.
  if (m.source) m.source->stop();
  if (m.admin) m.admin->stop();
  if (m.loop) m.loop->stop();
  if (m.drain) m.drain->stop();
  if (m.netlink) m.netlink->set_quiet_full_sync({}, {});
  m.monitor.reset();
  if (m.dns_sink) m.dns_sink->stop();
  if (m.feed_sink) m.feed_sink->stop();
}

namespace {

// The addresses NodePorts may be served on: this host's global unicast addresses. (The
// planner narrows them with --nodeport-addresses.)
std::vector<model::IpAddr> host_addresses() {
  std::vector<model::IpAddr> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    std::optional<model::IpAddr> ip;
    if (a->ifa_addr->sa_family == AF_INET) {
      sockaddr_in sin{};
      std::memcpy(&sin, a->ifa_addr, sizeof sin);
      uint8_t b[4];
      std::memcpy(b, &sin.sin_addr, sizeof b);
      ip = model::IpAddr::from_bytes(model::IpFamily::kV4, b);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      sockaddr_in6 sin6{};
      std::memcpy(&sin6, a->ifa_addr, sizeof sin6);
      ip = model::IpAddr::from_bytes(model::IpFamily::kV6, sin6.sin6_addr.s6_addr);
      if (ip->data()[0] == 0xfe && (ip->data()[1] & 0xc0) == 0x80) continue;  // link-local
    }
    if (ip && !ip->is_loopback() && !ip->is_unspecified()) out.push_back(*ip);
  }
  freeifaddrs(list);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

bool Daemon::Impl::start_proxy(std::string* error) {
  auto be = proxy::NetlinkBackend::open();
  if (!be) {
    *error = "nftables: " + be.error();
    return false;
  }
  netlink = std::move(*be);
  proxy::ProxySink::Options po;
  po.registry = registry.get();
  po.node.node_name = cfg.node_name;
  po.node.node_ips = host_addresses();
  for (const auto& c : cfg.cluster_cidr)
    po.node.cluster_cidrs.push_back(*model::IpPrefix::parse(c));
  for (const auto& c : cfg.nodeport_addresses)
    po.node.node_port_addresses.push_back(*model::IpPrefix::parse(c));
  po.node.masquerade_all = cfg.masquerade_all;
  conntrack = proxy::make_netlink_conntrack();
  po.conntrack = conntrack.get();
  proxy::HealthCheckOptions ho;
  ho.proxy_healthy = [this] { return !proxy_sink || proxy_sink->healthy(); };
  health_checks = std::make_unique<proxy::HealthCheckServer>(ho);
  po.health_checks = health_checks.get();
  proxy_sink = std::make_unique<proxy::ProxySink>(netlink.get(), &board, po);
  loop->add_sink(proxy_sink.get());
  loop->on_publish([sink = proxy_sink.get()](const model::SnapshotPtr&) { sink->note_queued(); });
  // Someone else changing endpointd's tables gets a full resync.
  auto mon = proxy::Monitor::start(netlink->port_id(),
                                   [sink = proxy_sink.get()] { sink->request_resync(); });
  if (mon) {
    monitor = std::move(*mon);
    // Full syncs with the monitor out of its group: the kernel then builds no notification per
    // element of endpointd's own batch (100,000 of them at 10k services).
    netlink->set_quiet_full_sync([m = monitor](bool on) { return m->listen(on); },
                                 [m = monitor] { m->report_foreign(); });
  } else {
    spdlog::warn(
        "nftables monitor unavailable ({}): changes made by others are repaired only at "
        "the next full sync",
        mon.error());
  }
  return true;
}

bool Daemon::Impl::start_drain(std::string* error) {
  drain::CoordinatorOptions co;
  co.machine.node_name = cfg.node_name;
  co.machine.peer_timeout = std::chrono::milliseconds(cfg.drain_peer_timeout_ms);
  co.machine.peer_policy =
      cfg.drain_peer_policy == "wait" ? drain::PeerPolicy::kWait : drain::PeerPolicy::kProceed;
  co.machine.default_release_after = cfg.drain_release_after == "removed"
                                         ? drain::ReleaseAfter::kRemoved
                                         : drain::ReleaseAfter::kDrained;
  co.peer_listen = cfg.drain_peer_listen;
  co.peer_port = static_cast<uint16_t>(cfg.drain_peer_port);
  co.drain_socket = cfg.drain_socket;
  co.registry = registry.get();
  if (!cfg.drain_socket.empty()) {
    // The socket's directory is what the chart mounts into pods; make it when running bare.
    std::error_code ec;
    auto dir = std::filesystem::path(cfg.drain_socket).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  }
  if (!conntrack) conntrack = proxy::make_netlink_conntrack();
  drain::Coordinator::DnsExpiry expiry;
  if (dns_sink)
    expiry = [s = dns_sink.get()](const model::IpAddr& a) { return s->last_answer_expiry(a); };
  drain = std::make_unique<drain::Coordinator>(&board, conntrack.get(), expiry, co);
  if (!drain->start(error)) {
    *error = "drain: " + *error;
    return false;
  }
  loop->on_publish([d = drain.get()](const model::SnapshotPtr& s) { d->on_snapshot(s); });
  return true;
}

bool Daemon::Impl::start_feed(std::string* error) {
  feed::FeedOptions o;
  o.listen = cfg.feed_listen;
  o.zone = cfg.dns_zone;
  feed_sink = std::make_unique<feed::FeedSink>(o, &board, registry.get());
  if (auto err = feed_sink->start()) {
    *error = "feed: " + *err;
    return false;
  }
  loop->add_sink(feed_sink.get());
  spdlog::info("feed (endpointd.v1 and xDS) on {} (port {})", cfg.feed_listen, feed_sink->port());
  return true;
}

bool Daemon::Impl::start_dns(std::string* error) {
  dns::DnsOptions o;
  o.listen = cfg.dns_listen;
  o.zone = cfg.dns_zone;
  o.upstreams = cfg.dns_upstream;
  o.ttl = static_cast<uint32_t>(cfg.dns_ttl);
  o.pod_mode = dns::parse_pod_mode(cfg.dns_pod_records).value_or(dns::PodMode::kDisabled);
  for (const auto& c : cfg.dns_forward_allow) o.forward_allow.push_back(*model::IpPrefix::parse(c));
  dns_sink = std::make_unique<dns::DnsSink>(o, &board, registry.get());
  if (auto err = dns_sink->start()) {
    *error = "DNS: " + *err;
    return false;
  }
  loop->add_sink(dns_sink.get());
  spdlog::info("DNS on {} (port {}) for zone {}", cfg.dns_listen, dns_sink->port(), cfg.dns_zone);
  return true;
}

}  // namespace endpointd::daemon
