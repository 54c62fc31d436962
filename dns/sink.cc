// The DNS sink: zone building off the hot path, atomic swap, acknowledgement, drain support.
#include "dns/sink.h"

#include <charconv>

#include <spdlog/spdlog.h>

#include "model/hostport.h"

namespace endpointd::dns {

namespace {

ZoneOptions zone_options(const DnsOptions& o) {
  ZoneOptions z;
  z.zone = o.zone;
  z.ttl = o.ttl;
  z.negative_ttl = o.negative_ttl;
  z.pod_mode = o.pod_mode;
  z.loadbalance = o.loadbalance;
  z.endpoint_pod_names = o.endpoint_pod_names;
  z.no_endpoints = o.no_endpoints;
  z.ignore_empty_service = o.ignore_empty_service;
  z.namespaces = o.namespaces;
  return z;
}

}  // namespace

DnsSink::DnsSink(DnsOptions opts, pipeline::AckBoard* board, prometheus::Registry* registry)
    : opts_(std::move(opts)),
      zone_opts_(zone_options(opts_)),
      max_ttl_(opts_.ttl),
      board_(board),
      metrics_(std::make_unique<Metrics>(registry, "dns://" + opts_.listen)),
      builder_(zone_opts_) {
  zones_.publish(Zone::unsynced(zone_opts_));
  if (opts_.forward_allow.empty())
    for (const char* p : {"127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                          "100.64.0.0/10", "::1/128", "fc00::/7"})
      opts_.forward_allow.push_back(*model::IpPrefix::parse(p));
  if (board_) board_->add("dns", model::RouteView::kDns);
}

DnsSink::~DnsSink() {
  stop();
}

Status DnsSink::start() {
  // The server binds an address: a bare port or a host name is not enough.
  auto listen = model::parse_host_port(opts_.listen, 53);
  if (!listen || !model::IpAddr::parse(listen->host))
    return Error{"dns: bad listen address '" + opts_.listen +
                 "': not ADDR, ADDR:PORT or [IPv6]:PORT"};
  if (!name_from_text(opts_.zone)) return Error{"dns: bad zone '" + opts_.zone + "'"};
  if (opts_.forwarding) {
    ForwarderOptions fo;
    fo.upstreams = opts_.upstreams;
    fo.timeout = opts_.forward_timeout;
    fo.tries = opts_.forward_tries;
    fo.max_inflight = opts_.forward_max_inflight;
    fo.cache_entries = opts_.cache_entries;
    fo.cache_max_ttl = opts_.cache_max_ttl;
    forwarder_ = std::make_unique<Forwarder>(fo);
    forwarder_->set_metrics(metrics_.get());
    if (auto st = forwarder_->start(); !st) return prefixed("dns", st.error());
  }
  ServerOptions so;
  so.listen_address = listen->host;
  so.port = listen->port;
  so.workers = opts_.workers;
  so.tcp_max_connections = opts_.tcp_max_connections;
  so.tcp_idle_timeout = opts_.tcp_idle_timeout;
  so.forward_allow = opts_.forward_allow;
  server_ = std::make_unique<Server>(so, &zones_, forwarder_.get(), metrics_.get());
  if (auto st = server_->start(); !st) {
    server_.reset();
    return st;
  }
  spdlog::info("dns: serving {} on {} port {} ({} workers)", opts_.zone, listen->host,
               server_->port(), opts_.workers);
  return {};
}

void DnsSink::stop() {
  if (server_) server_->stop();  // stops the forwarder too
  if (forwarder_) forwarder_->stop();
}

void DnsSink::apply(const model::SnapshotPtr& snap, const model::Delta& delta) {
  // Only the services the delta names are rebuilt; everything else is shared with the zone
  // the workers serve now.
  auto t0 = Clock::now();
  {
    std::lock_guard lk(mu_);
    zones_.publish(builder_.apply(snap, delta));
    metrics_->programming(std::chrono::duration<double>(Clock::now() - t0).count());
    builder_.harvest(horizon_ns());
  }
  if (board_) board_->applied("dns", snap);
}

Status DnsSink::reconfigure(const DnsOptions& next) {
  std::lock_guard lk(mu_);
  if (next.zone != opts_.zone)
    return Error{"dns: the zone changed from " + opts_.zone + " to " + next.zone +
                 ": that needs a restart"};
  ZoneOptions z = zone_options(next);
  opts_.ttl = next.ttl;
  opts_.negative_ttl = next.negative_ttl;
  opts_.pod_mode = next.pod_mode;
  opts_.loadbalance = next.loadbalance;
  opts_.endpoint_pod_names = next.endpoint_pod_names;
  opts_.no_endpoints = next.no_endpoints;
  opts_.ignore_empty_service = next.ignore_empty_service;
  opts_.namespaces = next.namespaces;
  max_ttl_ = std::max(max_ttl_, next.ttl);
  zone_opts_ = z;
  auto t0 = Clock::now();
  zones_.publish(builder_.reconfigure(std::move(z)));
  metrics_->programming(std::chrono::duration<double>(Clock::now() - t0).count());
  spdlog::info("dns: options reloaded, zone {} built again", opts_.zone);
  return {};
}

DnsOptions DnsSink::options() const {
  std::lock_guard lk(mu_);
  return opts_;
}

int64_t DnsSink::horizon_ns() const {
  auto now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  return now - int64_t{max_ttl_} * 1'000'000'000;
}

std::optional<DnsSink::Clock::time_point> DnsSink::last_answer_expiry(const model::IpAddr& a) {
  std::optional<int64_t> ns;
  uint32_t ttl = 0;
  {
    std::lock_guard lk(mu_);
    builder_.harvest(horizon_ns());
    ns = builder_.last_served_ns(a);
    ttl = max_ttl_;
  }
  if (!ns) return std::nullopt;
  return Clock::time_point(std::chrono::nanoseconds(*ns)) + std::chrono::seconds(ttl);
}

}  // namespace endpointd::dns
