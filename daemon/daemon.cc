// The daemon's parts and their order: sinks and the update loop first, then the admin server,
// then the source, so that nothing a source says is lost.
#include "daemon/daemon.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>

#include "daemon/admin.h"
#include "daemon/conntrack_flows.h"
#include "daemon/events.h"
#include "daemon/health.h"
#include "daemon/kube_request.h"
#include "daemon/peer_auth.h"
#include "daemon/peer_plan.h"
#include "daemon/sources.h"
#include "daemon/state_json.h"
#include "dns/sink.h"
#include "drain/coordinator.h"
#include "feed/feed.h"
#include "pipeline/ack_board.h"
#include "pipeline/update_loop.h"
#include "proxy/address_monitor.h"
#include "proxy/conntrack.h"
#include "proxy/conntrack_sysctl.h"
#include "proxy/dataplane.h"
#include "proxy/node_local_address.h"

namespace endpointd::daemon {

namespace {

// The DNS sink's options from a Config: at start, and again at each reload (only the zone's
// options change then: DnsSink::reconfigure).
dns::DnsOptions dns_options(const Config& cfg) {
  dns::DnsOptions o;
  o.listen = cfg.dns_listen ? cfg.dns_listen->str() : std::string();
  o.zone = cfg.dns_zone;
  o.extra_zones = cfg.dns_extra_zones;
  for (const auto& u : cfg.dns_upstream) o.upstreams.push_back(u.str());
  o.ttl = static_cast<uint32_t>(cfg.dns_ttl.count());
  o.negative_ttl = static_cast<uint32_t>(cfg.dns_negative_ttl.count());
  o.pod_mode = cfg.dns_pod_records;
  o.loadbalance = cfg.dns_loadbalance;
  o.endpoint_pod_names = cfg.dns_endpoint_pod_names;
  o.no_endpoints = cfg.dns_noendpoints;
  o.ignore_empty_service = cfg.dns_ignore_empty_service;
  o.namespaces = cfg.dns_namespaces;
  o.forward_allow = cfg.dns_forward_allow;
  o.cache_entries = cfg.dns_cache_size;
  o.cache_max_ttl = static_cast<uint32_t>(cfg.dns_cache_max_ttl.count());
  o.cache_denial_max_ttl = static_cast<uint32_t>(cfg.dns_cache_denial_max_ttl.count());
  return o;
}

}  // namespace

struct Daemon::Impl {
  Config cfg;
  std::atomic<bool> lameduck{false};  // shutting down: readiness fails
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  pipeline::AckBoard board;
  std::unique_ptr<pipeline::UpdateLoop> loop;
  std::unique_ptr<watcher::Source> source;
  std::unique_ptr<AdminServer> admin;
  std::unique_ptr<AdminServer> health;
  // The listeners' drops, as counters (brought up to date before each scrape).
  prometheus::Family<prometheus::Counter>* listener_drops = nullptr;
  std::map<std::pair<std::string, std::string>, uint64_t> listener_drops_seen;
  std::unique_ptr<proxy::Dataplane> dataplane;
  std::unique_ptr<dns::DnsSink> dns_sink;
  // Puts the node-local DNS address back when something takes it off the node (an operator's
  // `ip addr flush`, a network agent that owns the interfaces), as NodeLocal DNSCache does.
  std::unique_ptr<proxy::AddressMonitor> node_local_watch;
  std::unique_ptr<feed::FeedSink> feed_sink;
  // Without the nftables dataplane, drain/ still counts flows in conntrack.
  std::unique_ptr<proxy::Conntrack> own_conntrack;
  std::unique_ptr<ConntrackFlows> flows;
  // New connections to this node's terminating pods (observed removal); null when connection
  // tracking's events cannot be read here.
  std::unique_ptr<ConntrackNewFlows> new_flows;
  std::unique_ptr<drain::Coordinator> drain;
  // What this node keeps for drains across restarts (--drain-state-file; in memory without).
  std::unique_ptr<drain::NodeStateFile> node_state;
  // Events on pods this node drains (API sources only).
  std::unique_ptr<KubeRequester> event_api;
  std::unique_ptr<EventRecorder> events;
  std::unique_ptr<DrainEventPoller> event_poller;
  // The first synced snapshot published: the Events poller's baseline.
  std::mutex first_synced_mu;
  model::SnapshotPtr first_synced;
  std::atomic<bool> has_first_synced{false};
  Status start_events();

  Status start_proxy();
  Status start_dns();
  Result<std::optional<std::string>> node_local_dns();
  Status start_feed();
  Status start_drain();

  std::chrono::system_clock::time_point started_at = std::chrono::system_clock::now();

  // kube-proxy's probe counters, by HTTP code.
  prometheus::Family<prometheus::Counter>* healthz_total = nullptr;
  prometheus::Family<prometheus::Counter>* livez_total = nullptr;

  // When the newest snapshot was published (steady clock, as a count), for a daemon without
  // consumers.
  std::atomic<int64_t> last_published{0};

  // When the dataplane (without one: any consumer; without any: the update loop) last applied
  // an update, on the wall clock; zero before the first.
  std::chrono::system_clock::time_point last_updated() const {
    pipeline::AckBoard::Clock::time_point newest{};
    auto entries = board.entries();
    for (const auto& e : entries)
      if (!dataplane || e.consumer == "proxy") newest = std::max(newest, e.applied_at);
    if (entries.empty())
      newest = pipeline::AckBoard::Clock::time_point(
          pipeline::AckBoard::Clock::duration(last_published.load()));
    if (newest == pipeline::AckBoard::Clock::time_point{}) return {};
    return std::chrono::system_clock::now() -
           std::chrono::duration_cast<std::chrono::system_clock::duration>(
               pipeline::AckBoard::Clock::now() - newest);
  }

  HealthInputs health_inputs() {
    HealthInputs in;
    in.now = std::chrono::system_clock::now();
    in.last_updated = last_updated();
    in.dataplane_behind = dataplane && !dataplane->healthy();
    in.livez_timeout = cfg.livez_timeout;
    return in;
  }

  Probe healthz() {
    HealthInputs in = health_inputs();
    auto snap = loop->current();
    in.node = snap->find_node(cfg.node_name);
    Probe p = healthz_probe(in);
    healthz_total->Add({{"code", p.ok ? "200" : "503"}}).Increment();
    return p;
  }

  Probe livez() {
    HealthInputs in = health_inputs();
    auto w = loop->longest_wait(std::chrono::steady_clock::now());
    in.waiting_in = w.where;
    in.waited = w.age;
    Probe p = livez_probe(in);
    livez_total->Add({{"code", p.ok ? "200" : "503"}}).Increment();
    return p;
  }

  Probe readyz() {
    if (lameduck.load()) {
      return {false,
              "shutting down: DNS answers for " + std::to_string(cfg.dns_lameduck.count()) +
                  " s more (lameduck), then the agent stops",
              ""};
    }
    auto snap = loop->current();
    if (!snap->synced)
      return {false, "not synced: the first full list of cluster state has not arrived", ""};
    for (const auto& e : board.entries())
      if (!e.snapshot || !e.snapshot->synced)
        return {false, "sink " + e.consumer + " has not applied the first synced state", ""};
    if (auto warn = peer_insecure_warning(cfg); !warn.empty()) return {true, "ok; " + warn, ""};
    return {true, "ok", ""};
  }

  void debug_state(const StateQuery& q, const std::function<bool(std::string_view)>& out) {
    DebugState st;
    st.snapshot = loop->current();
    st.node_name = cfg.node_name;
    st.sinks = board.entries();
    if (source) {
      st.source_errors = source->errors();
      st.source = source->describe();
    }
    if (feed_sink) st.feed_subscribers = feed_sink->subscribers();
    if (drain) {
      st.drains_json = drain->drains_json();
      st.drain_cluster_json = drain->cluster_json();
    }
    write_json(st, q, out);
  }

  // endpointd_http_connections_dropped_total{server,reason}: what each listener refused or
  // cut off (connection caps, slow or oversized requests, stalled readers, busy, no token).
  void count_listener_drops() {
    if (!listener_drops)
      listener_drops = &prometheus::BuildCounter()
                            .Name("endpointd_http_connections_dropped_total")
                            .Help(
                                "Requests or connections the health and admin servers "
                                "refused or cut off, by reason")
                            .Register(*registry);
    for (AdminServer* s : {health.get(), admin.get()}) {
      if (!s) continue;
      httpd::Stats st = s->stats();
      for (auto [reason, n] :
           {std::pair<const char*, uint64_t>{"connection_cap", st.rejected_connection_cap},
            {"peer_cap", st.rejected_peer_cap},
            {"header_timeout", st.header_timeouts},
            {"write_timeout", st.write_timeouts},
            {"oversized", st.oversized_requests},
            {"bad_request", st.bad_requests},
            {"busy", st.busy},
            {"unauthorized", st.unauthorized}}) {
        uint64_t& seen = listener_drops_seen[{s->name(), reason}];
        auto& c = listener_drops->Add({{"server", s->name()}, {"reason", reason}});
        if (n > seen) c.Increment(static_cast<double>(n - seen));
        seen = n;
      }
    }
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

int Daemon::health_port() const {
  return impl_->health ? impl_->health->port() : -1;
}

int Daemon::dns_port() const {
  return impl_->dns_sink ? impl_->dns_sink->port() : -1;
}

Status Daemon::reload(const Config& next) {
  auto& m = *impl_;
  if (!m.dns_sink) return {};
  if (next.dns_listen.has_value() != m.cfg.dns_listen.has_value())
    return Error{"reload: turning DNS on or off (dns-listen) needs a restart"};
  if (next.dns_node_local_address != m.cfg.dns_node_local_address)
    return Error{"reload: changing dns-node-local-address needs a restart"};
  if (auto st = m.dns_sink->reconfigure(dns_options(next)); !st)
    return prefixed("reload", st.error());
  if (m.node_state)
    if (auto st = m.node_state->set_dns_ttl(dns_options(next).ttl); !st)
      spdlog::warn("drain state file: {}; a restart may not know this TTL", st.error());
  return {};
}

std::chrono::milliseconds Daemon::begin_lameduck() {
  impl_->lameduck = true;
  if (!impl_->dns_sink) return std::chrono::milliseconds(0);
  return impl_->cfg.dns_lameduck;
}

Status Daemon::start() {
  auto& m = *impl_;
  // A manifest directory naming no other node needs no peer port (daemon/peer_plan.h).
  if (peer_plan_needs_nodes(m.cfg)) {
    auto plan = plan_peers(m.cfg, manifest_node_names(m.cfg.source_dir));
    if (!plan) return Error{plan.error()};
    if (!plan->listen) {
      spdlog::info("{}", plan->note);
      m.cfg.drain_peer_listen = std::nullopt;
    }
  }
  // kube-proxy's conntrack settings, before any traffic is programmed; a setting that cannot
  // be written stops the start (it was asked for), naming it and its file.
  if (auto ct = proxy::apply_conntrack_sysctls(m.cfg.conntrack); !ct) {
    return Error{"conntrack: " + ct.error()};
  } else if (!ct->read_only_sys.empty()) {
    spdlog::warn("conntrack: {}", ct->read_only_sys);
  }
  m.node_state = std::make_unique<drain::NodeStateFile>(m.cfg.drain_state_file);
  if (!m.node_state->load_error().empty())
    spdlog::warn(
        "drain state file: {}; starting without it (the nodes an earlier process saw running an "
        "agent and its DNS TTL are not known)",
        m.node_state->load_error());
  pipeline::UpdateLoop::Options lo;
  lo.registry = m.registry.get();
  lo.expected_kinds = expected_kinds(m.cfg);
  m.loop = std::make_unique<pipeline::UpdateLoop>(lo);
  if (m.cfg.dataplane == Dataplane::kNftables) {
    if (auto st = m.start_proxy(); !st) return st;
  }
  if (m.cfg.dns_listen) {
    if (auto st = m.start_dns(); !st) return st;
  }
  if (m.cfg.feed_listen) {
    if (auto st = m.start_feed(); !st) return st;
  }
  if (auto st = m.start_drain(); !st) return st;
  // With an API source: the cluster programming latency always, Events unless turned off.
  if (m.cfg.source_dir.empty()) {
    if (auto st = m.start_events(); !st) return st;
  }
  m.loop->on_publish([&m](const model::SnapshotPtr& s) {
    m.last_published = pipeline::AckBoard::Clock::now().time_since_epoch().count();
    spdlog::debug("published generation {} ({} services, synced={})", s->generation,
                  s->services.size(), s->synced);
  });
  m.loop->start();

  m.healthz_total = &prometheus::BuildCounter()
                         .Name("kubeproxy_proxy_healthz_total")
                         .Help("/healthz answers, by HTTP code")
                         .Register(*m.registry);
  m.livez_total = &prometheus::BuildCounter()
                       .Name("kubeproxy_proxy_livez_total")
                       .Help("/livez answers, by HTTP code")
                       .Register(*m.registry);
  AdminServer::Handlers h;
  h.healthz = [&m] { return m.healthz(); };
  h.livez = [&m] { return m.livez(); };
  h.readyz = [&m] { return m.readyz(); };
  h.debug_state = [&m](const StateQuery& q, const std::function<bool(std::string_view)>& out) {
    m.debug_state(q, out);
  };
  h.before_scrape = [&m] {
    m.count_listener_drops();
    if (m.dns_sink) m.dns_sink->fold_metrics();  // its threads' counts, folded at the scrape
  };
  if (m.cfg.admin_listen) {
    std::string token;
    if (!m.cfg.admin_token_file.empty()) {
      auto t = read_token_file(m.cfg.admin_token_file);
      if (!t) return Error{t.error()};
      token = std::move(*t);
    } else if (!m.cfg.admin_listen->loopback()) {
      spdlog::warn(
          "admin server on {} beyond loopback without --admin-token-file: /metrics and "
          "/debug/state (pod names, UIDs, addresses) are open to anyone who can reach it",
          m.cfg.admin_listen->str());
    }
    m.admin = std::make_unique<AdminServer>(AdminServer::Role::kAdmin, h, m.registry.get(), token);
    if (auto st = m.admin->start(*m.cfg.admin_listen); !st) return st;
  }
  // The probes on their own listener, unless it is the admin server's address.
  bool same = m.cfg.admin_listen && m.cfg.health_listen && m.cfg.health_listen->port != 0 &&
              *m.cfg.health_listen == *m.cfg.admin_listen;
  if (m.cfg.health_listen && !same) {
    m.health = std::make_unique<AdminServer>(AdminServer::Role::kHealth, h, nullptr);
    if (auto st = m.health->start(*m.cfg.health_listen); !st) return st;
  }

  auto post = [loop = m.loop.get()](model::Event ev) { loop->post(std::move(ev)); };
  auto src = make_source(m.cfg, post, m.registry.get());
  if (!src) return Error{src.error()};
  m.source = std::move(*src);
  if (auto st = m.source->start(); !st) return st;
  spdlog::info("endpointd running on node {} ({})", m.cfg.node_name, m.source->describe());
  return {};
}

void Daemon::stop() {
  if (!impl_) return;
  auto& m = *impl_;
  // The dataplane is left as it is: traffic keeps flowing while the agent restarts.
  if (m.source) m.source->stop();
  if (m.admin) m.admin->stop();
  if (m.health) m.health->stop();
  if (m.loop) m.loop->stop();
  m.event_poller.reset();
  if (m.events) m.events->stop();
  if (m.drain) m.drain->stop();
  m.node_local_watch.reset();
  if (m.dns_sink) m.dns_sink->stop();
  if (m.feed_sink) m.feed_sink->stop();
}

Status Daemon::Impl::start_proxy() {
  proxy::DataplaneOptions o;
  o.registry = registry.get();
  o.node.node_name = cfg.node_name;
  o.node.cluster_cidrs = cfg.cluster_cidr;
  o.node.detect_local = cfg.detect_local_mode;
  o.node.local_interface = cfg.detect_local_mode == proxy::DetectLocal::kBridgeInterface
                               ? cfg.pod_bridge_interface
                               : cfg.pod_interface_name_prefix;
  o.node.service_cidrs = cfg.service_cidr;
  o.node.node_port_addresses = cfg.nodeport_addresses;
  o.node.masquerade_all = cfg.masquerade_all;
  if (cfg.dns_node_local_address) {  // notrack rules for its queries and answers
    o.node.dns_node_local = cfg.dns_node_local_address;
    o.node.dns_node_local_port = cfg.dns_listen->port;
  }
  o.process_start = started_at;  // trigger times before it are not this process's to measure
  auto dp = proxy::Dataplane::start(std::move(o), &board);
  if (!dp) return Error{dp.error()};
  dataplane = std::move(*dp);
  loop->add_sink(dataplane->sink());
  loop->on_publish([sink = dataplane->sink()](const model::SnapshotPtr&) { sink->note_queued(); });
  return {};
}

Status Daemon::Impl::start_drain() {
  drain::CoordinatorOptions co;
  co.machine.node_name = cfg.node_name;
  co.machine.peer_timeout = cfg.drain_peer_timeout;
  co.machine.peer_policy = cfg.drain_peer_policy;
  co.machine.default_release_after = cfg.drain_release_after;
  co.machine.quiet = cfg.drain_quiet;
  co.machine.members_service = cfg.drain_members_service;
  co.peer_listen = cfg.drain_peer_listen ? cfg.drain_peer_listen->str() : std::string();
  co.peer_port = cfg.drain_peer_port;
  co.watermark = cfg.drain_watermark;
  co.aggregator.fan_in = cfg.drain_fan_in;
  co.aggregator.silence = cfg.drain_liveness;
  co.aggregator.heartbeat = std::max(std::chrono::milliseconds(50), cfg.drain_liveness / 3);
  co.aggregator.probe = std::max(std::chrono::milliseconds(50), cfg.drain_liveness / 5);
  co.peer_tls = {cfg.drain_peer_ca, cfg.drain_peer_cert, cfg.drain_peer_key};
  if (auto st = add_peer_identity(cfg, registry.get(), &co.peer_tls); !st)
    return prefixed("drain", st.error());
  co.peer_insecure = cfg.drain_peer_insecure;
  co.drain_socket = cfg.drain_socket;
  co.registry = registry.get();
  co.node_state = node_state.get();
  if (!cfg.drain_socket.empty()) {
    // The socket's directory is what the chart mounts into pods; make it when running bare.
    std::error_code ec;
    auto dir = std::filesystem::path(cfg.drain_socket).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  }
  proxy::Conntrack* conntrack = dataplane ? dataplane->conntrack() : nullptr;
  if (!conntrack) {
    own_conntrack = proxy::make_netlink_conntrack();
    conntrack = own_conntrack.get();
  }
  flows = std::make_unique<ConntrackFlows>(conntrack);
  // Observed removal: whoever still opens connections to a pod after its removal is named on
  // its drain (drain/late.h). Without ctnetlink events here, said once and left out.
  if (auto watch = proxy::NewFlowWatch::open(); watch) {
    new_flows = std::make_unique<ConntrackNewFlows>(std::move(*watch));
    co.new_flows = new_flows.get();
  } else {
    spdlog::warn(
        "drain: new connections to terminating pods are not observed (late senders go "
        "unnamed): {}",
        watch.error());
  }
  drain = std::make_unique<drain::Coordinator>(&board, flows.get(), co);
  if (auto st = drain->start(); !st) return prefixed("drain", st.error());
  loop->on_publish([d = drain.get()](const model::SnapshotPtr& s) { d->on_snapshot(s); });
  return {};
}

Status Daemon::Impl::start_events() {
  if (cfg.events) {
    auto cluster = cluster_config(cfg.kubeconfig);
    if (!cluster) return prefixed("events", cluster.error());
    event_api = std::make_unique<KubeRequester>(std::move(*cluster));
    EventRecorderOptions eo;
    eo.node = cfg.node_name;
    eo.registry = registry.get();
    events = std::make_unique<EventRecorder>(
        eo,
        [api = event_api.get()](std::string_view method, const std::string& path,
                                const std::string& body, std::string_view type,
                                std::chrono::milliseconds timeout) -> Result<EventRecorder::Reply> {
          auto r = api->request(method, path, body, timeout, type);
          if (!r) return Error{r.error()};
          return EventRecorder::Reply{r->status};
        });
  }
  DrainEventPoller::Inputs in;
  in.drains_json = [this] { return drain->drains_json(); };
  in.cluster_json = [this] { return drain->cluster_json(); };
  in.version = [this] { return drain->state_version(); };
  in.snapshot = [this] { return loop->current(); };
  in.first_synced = [this] {
    std::lock_guard lock(first_synced_mu);
    return first_synced;
  };
  loop->on_publish([this](const model::SnapshotPtr& s) {
    if (!s->synced || has_first_synced.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(first_synced_mu);
    first_synced = s;
    has_first_synced = true;
  });
  in.node = cfg.node_name;
  in.cluster_programming =
      &prometheus::BuildHistogram()
           .Name("endpointd_cluster_programming_duration_seconds")
           .Help(
               "From an EndpointSlice's last-change-trigger-time to the cluster watermark "
               "covering it (every member node's consumers and feed subscribers route the "
               "change), per endpoint of this node that turned ready or stopped being ready; "
               "measured to within 100 ms.")
           .Register(*registry)
           .Add({}, PropagationEvents::buckets());
  in.started = started_at;
  event_poller = std::make_unique<DrainEventPoller>(std::move(in), events.get());
  return {};
}

Status Daemon::Impl::start_feed() {
  feed::FeedOptions o;
  o.listen = cfg.feed_listen->str();
  o.zone = cfg.dns_zone;
  o.tls_cert_file = cfg.feed_tls_cert;
  o.tls_key_file = cfg.feed_tls_key;
  o.tls_client_ca_file = cfg.feed_client_ca;
  o.subscriber_grace = cfg.feed_subscriber_grace;
  o.state_file = cfg.feed_state_file;
  if (o.tls_cert_file.empty() && !cfg.feed_listen->loopback()) {
    spdlog::warn(
        "feed on {} beyond loopback in plaintext: set --feed-tls-cert, --feed-tls-key "
        "and --feed-client-ca so that only your proxies subscribe",
        o.listen);
  }
  feed_sink = std::make_unique<feed::FeedSink>(o, &board, registry.get());
  if (auto st = feed_sink->start(); !st) return prefixed("feed", st.error());
  loop->add_sink(feed_sink.get());
  spdlog::info("feed (endpointd.v1 and xDS) on {} (port {})", o.listen, feed_sink->port());
  return {};
}

Status Daemon::Impl::start_dns() {
  dns::DnsOptions o = dns_options(cfg);
  // The TTLs an earlier process's answers may still be cached under, then this one's.
  auto wall = std::chrono::system_clock::now();
  auto steady = std::chrono::steady_clock::now();
  for (const auto& h : node_state->loaded().dns_ttls)
    o.ttl_holds.push_back({h.ttl_s, steady + (h.until - wall)});
  if (auto st = node_state->set_dns_ttl(o.ttl); !st)
    spdlog::warn("drain state file: {}; a restart may not know this TTL", st.error());
  if (cfg.dns_node_local_address) {
    auto also = node_local_dns();
    if (!also) return Error{also.error()};
    if (*also) o.also_listen.push_back(**also);
  }
  dns_sink = std::make_unique<dns::DnsSink>(o, &board, registry.get());
  if (auto st = dns_sink->start(); !st) return prefixed("DNS", st.error());
  loop->add_sink(dns_sink.get());
  spdlog::info("DNS on {} (port {}) for zone {}", o.listen, dns_sink->port(), cfg.dns_zone);
  return {};
}

// NodeLocal DNSCache's shape: the address on a dummy interface of this node (`lo` where the
// kernel has no dummy driver), answered by the DNS sink beside --dns-listen, its queries kept
// out of conntrack by the dataplane's notrack chains. The address the sink must listen on as
// well, or nothing when a wildcard --dns-listen already answers on it.
Result<std::optional<std::string>> Daemon::Impl::node_local_dns() {
  const model::IpAddr& addr = *cfg.dns_node_local_address;
  auto where = proxy::ensure_node_local_address(addr);
  if (!where) return prefixed("node-local DNS", where.error());
  auto watch = proxy::AddressMonitor::start([addr] {
    auto have = proxy::host_addresses();
    if (std::find(have.begin(), have.end(), addr) != have.end()) return;
    if (auto again = proxy::ensure_node_local_address(addr); again)
      spdlog::warn("node-local DNS: {} was taken off the node; put back on {}", addr.str(), *again);
    else
      spdlog::error("node-local DNS: {} was taken off the node and cannot be put back: {}",
                    addr.str(), again.error());
  });
  if (watch)
    node_local_watch = std::move(*watch);
  else
    spdlog::warn("node-local DNS on {}: not watched, nothing puts it back if it is removed: {}",
                 addr.str(), watch.error());
  if (!dataplane)
    spdlog::warn(
        "node-local DNS on {}: without the nftables dataplane there are no notrack rules, so "
        "its queries go through conntrack",
        addr.str());
  // A wildcard --dns-listen already answers on it (and holds the TCP port): [::] covers IPv4
  // too, as the kernel's default dual-stack sockets do.
  auto listen = model::IpAddr::parse(cfg.dns_listen->host);
  if (listen && (*listen == addr || (listen->is_unspecified() &&
                                     (listen->family() == addr.family() || listen->is_v6())))) {
    spdlog::info("node-local DNS on {} (interface {}), answered by the server on {}", addr.str(),
                 *where, cfg.dns_listen->str());
    return std::optional<std::string>();
  }
  spdlog::info("node-local DNS on {} (interface {})", addr.str(), *where);
  return std::optional<std::string>(model::HostPort{addr.str(), cfg.dns_listen->port}.str());
}

}  // namespace endpointd::daemon
