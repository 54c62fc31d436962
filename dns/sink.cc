// The DNS sink: zone building off the hot path, atomic swap, acknowledgement, drain support.
#include "dns/sink.h"

#include <charconv>

#include <spdlog/spdlog.h>

#include "model/hostport.h"

namespace endpointd::dns {

namespace {

// The options of the zone `index` (0: DnsOptions::zone, then the extra zones in order).
ZoneOptions zone_options(const DnsOptions& o, size_t index = 0) {
  ZoneOptions z;
  z.zone = index == 0 ? o.zone : o.extra_zones[index - 1];
  z.reverse = index == 0;
  for (size_t i = 0; i <= o.extra_zones.size(); ++i)
    if (i != index) z.other_zones.push_back(i == 0 ? o.zone : o.extra_zones[i - 1]);
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

std::string zone_list(const DnsOptions& o) {
  std::string s = o.zone;
  for (const auto& z : o.extra_zones) s += " " + z;
  return s;
}

// Forwarding only for loopback and the private ranges unless told otherwise: the agent is
// never an open resolver.
DnsOptions with_defaults(DnsOptions o) {
  if (o.forward_allow.empty())
    for (const char* p : {"127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                          "100.64.0.0/10", "::1/128", "fc00::/7"})
      o.forward_allow.push_back(*model::IpPrefix::parse(p));
  return o;
}

}  // namespace

DnsSink::DnsSink(DnsOptions opts, pipeline::AckBoard* board, prometheus::Registry* registry)
    : opts_(with_defaults(std::move(opts))),
      max_ttl_(opts_.ttl),
      ttl_now_(opts_.ttl),
      ttl_holds_(opts_.ttl_holds),
      board_(board),
      registry_(registry),
      metrics_(std::make_unique<Metrics>(registry, "dns://" + opts_.listen)) {
  std::vector<ZonePtr> unsynced;
  for (size_t i = 0; i <= opts_.extra_zones.size(); ++i) {
    builders_.push_back(std::make_unique<ZoneBuilder>(zone_options(opts_, i)));
    unsynced.push_back(Zone::unsynced(zone_options(opts_, i)));
  }
  publish(std::move(unsynced));
  for (const auto& h : ttl_holds_)
    if (h.until > Clock::now()) max_ttl_ = std::max(max_ttl_, h.ttl);
  answers_ = std::make_shared<pipeline::AnswerExpiry>();
  if (board_) {
    board_->add("dns", model::RouteView::kDns);
    // The TTL drain waits out for answers already given: one value, the DNS sink's.
    board_->set_cache_ttl("dns", std::chrono::seconds(max_ttl_));
    board_->set_answers("dns", answers_);
  }
}

DnsSink::~DnsSink() {
  stop();
}

Status DnsSink::start() {
  // Each server binds an address: a bare port or a host name is not enough.
  std::vector<std::string> texts{opts_.listen};
  texts.insert(texts.end(), opts_.also_listen.begin(), opts_.also_listen.end());
  std::vector<model::HostPort> listens;
  for (const auto& text : texts) {
    auto hp = model::parse_host_port(text, 53);
    if (!hp || !model::IpAddr::parse(hp->host))
      return Error{"dns: bad listen address '" + text + "': not ADDR, ADDR:PORT or [IPv6]:PORT"};
    listens.push_back(*hp);
  }
  if (!name_from_text(opts_.zone)) return Error{"dns: bad zone '" + opts_.zone + "'"};
  for (const auto& z : opts_.extra_zones)
    if (!name_from_text(z)) return Error{"dns: bad zone '" + z + "'"};
  if (opts_.forwarding) {
    ForwarderOptions fo;
    fo.upstreams = opts_.upstreams;
    fo.timeout = opts_.forward_timeout;
    fo.tries = opts_.forward_tries;
    fo.max_inflight = opts_.forward_max_inflight;
    fo.cache_entries = opts_.cache_entries;
    fo.cache_max_ttl = opts_.cache_max_ttl;
    fo.cache_denial_max_ttl = opts_.cache_denial_max_ttl;
    forwarder_ = std::make_unique<Forwarder>(fo);
    forwarder_->set_metrics(metrics_.get());
    if (auto st = forwarder_->start(); !st) return prefixed("dns", st.error());
  }
  for (const auto& hp : listens) {
    ServerOptions so;
    so.listen_address = hp.host;
    so.port = hp.port;
    so.workers = opts_.workers;
    so.tcp_max_connections = opts_.tcp_max_connections;
    so.tcp_idle_timeout = opts_.tcp_idle_timeout;
    so.forward_allow = opts_.forward_allow;
    Listener l;
    // CoreDNS's metrics get a server label per address, as a server block of its own would.
    if (!servers_.empty()) l.metrics = std::make_unique<Metrics>(registry_, "dns://" + hp.str());
    l.server = std::make_unique<Server>(so, &zones_, forwarder_.get(),
                                        l.metrics ? l.metrics.get() : metrics_.get());
    if (auto st = l.server->start(); !st) {
      stop();
      servers_.clear();
      return st;
    }
    spdlog::info("dns: serving {} on {} port {} ({} workers)", opts_.zone, hp.host,
                 l.server->port(), opts_.workers);
    servers_.push_back(std::move(l));
  }
  {
    std::lock_guard lk(mu_);
    ticking_ = true;
  }
  ticker_ = std::thread([this] { tick_loop(); });
  return {};
}

void DnsSink::update_max_ttl(Clock::time_point now) {
  std::erase_if(ttl_holds_, [&](const DnsOptions::TtlHold& h) { return h.until <= now; });
  uint32_t m = ttl_now_;
  for (const auto& h : ttl_holds_) m = std::max(m, h.ttl);
  if (m == max_ttl_) return;
  max_ttl_ = m;
  if (board_) board_->set_cache_ttl("dns", std::chrono::seconds(max_ttl_));
}

void DnsSink::tick_loop() {
  std::unique_lock lk(mu_);
  while (ticking_) {
    tick_cv_.wait_for(lk, kAnswersTick);
    if (!ticking_) break;
    // A held TTL whose last answer expired no longer counts.
    if (!ttl_holds_.empty()) update_max_ttl(Clock::now());
    harvest();
    publish_answers();
  }
}

void DnsSink::stop() {
  {
    std::lock_guard lk(mu_);
    ticking_ = false;
  }
  tick_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  // A server's stop stops the forwarder they share (its last callbacks send on that server's
  // sockets), so every server stops before the forwarder's callbacks could reach a stopped one.
  for (auto& l : servers_) l.server->stop();
  if (forwarder_) forwarder_->stop();
  fold_metrics();
}

void DnsSink::fold_metrics() {
  metrics_->fold();
  for (auto& l : servers_)
    if (l.metrics) l.metrics->fold();
}

void DnsSink::apply(const model::SnapshotPtr& snap, const model::Delta& delta) {
  // Only the services the delta names are rebuilt; everything else is shared with the zone
  // the workers serve now.
  auto t0 = Clock::now();
  {
    std::lock_guard lk(mu_);
    std::vector<ZonePtr> zones;
    for (auto& b : builders_) zones.push_back(b->apply(snap, delta));
    publish(std::move(zones));
    metrics_->programming(std::chrono::duration<double>(Clock::now() - t0).count());
    harvest();
    track_candidates(*snap, delta);
    // Before applied(g): a drain that sees this state also sees what the states before it
    // handed out.
    publish_answers();
  }
  if (board_) board_->applied("dns", snap);
}

void DnsSink::track_candidates(const model::Snapshot& snap, const model::Delta& delta) {
  auto take = [&](const model::ServiceKey& key) {
    const model::ServiceState* st = snap.find(key);
    std::vector<model::IpAddr> v;
    if (st)
      for (const auto& e : st->endpoints)
        if (e.conditions.terminating || !e.conditions.ready) v.push_back(e.address);
    if (v.empty())
      candidates_.erase(key);
    else
      candidates_[key] = std::move(v);
  };
  for (const auto& k : delta.added) take(k);
  for (const auto& k : delta.changed) take(k);
  for (const auto& k : delta.removed) candidates_.erase(k);
  if (delta.pods_changed || delta.from_generation == 0) {
    pod_candidates_.clear();
    for (const auto& p : snap.pods)
      if (p->terminating)
        pod_candidates_.insert(pod_candidates_.end(), p->pod_ips.begin(), p->pod_ips.end());
  }
}

void DnsSink::publish_answers() {
  const int64_t horizon = horizon_ns();
  std::map<model::IpAddr, int64_t> stamps;
  for (auto& b : builders_) b->left_zone_stamps(horizon, stamps);
  // Blocks that left the zone are all in `stamps` already; a candidate adds what the current
  // zone and the pod replies gave (a lookup each, no scan).
  auto candidate = [&](const model::IpAddr& a) {
    for (auto& b : builders_)
      if (int64_t ns = b->live_served_ns(a); ns != 0 && ns >= horizon) {
        int64_t& v = stamps[a];
        v = std::max(v, ns);
      }
  };
  for (const auto& [k, v] : candidates_)
    for (const auto& a : v) candidate(a);
  for (const auto& a : pod_candidates_) candidate(a);
  auto next = std::make_shared<pipeline::AnswerExpiry>();
  for (const auto& [a, ns] : stamps)
    next->until.emplace_hint(
        next->until.end(), a,
        Clock::time_point(std::chrono::nanoseconds(ns)) + std::chrono::seconds(max_ttl_));
  if (answers_ && next->until == answers_->until) return;
  next->as_of = Clock::now();
  answers_ = next;
  if (board_) board_->set_answers("dns", answers_);
}

std::shared_ptr<const pipeline::AnswerExpiry> DnsSink::answers() const {
  std::lock_guard lk(mu_);
  return answers_;
}

Status DnsSink::reconfigure(const DnsOptions& next) {
  if (next.zone != opts_.zone || next.extra_zones != opts_.extra_zones)
    return Error{"dns: the zones changed from " + zone_list(opts_) + " to " + zone_list(next) +
                 ": that needs a restart"};
  std::lock_guard lk(mu_);
  // Answers given under the old TTL live that long still (and a reply in flight a moment
  // longer): the larger of the two counts until then.
  auto now = Clock::now();
  if (next.ttl < ttl_now_)
    ttl_holds_.push_back(
        {ttl_now_, now + std::chrono::seconds(ttl_now_) + std::chrono::seconds(1)});
  ttl_now_ = next.ttl;
  update_max_ttl(now);
  auto t0 = Clock::now();
  std::vector<ZonePtr> zones;
  for (size_t i = 0; i < builders_.size(); ++i)
    zones.push_back(builders_[i]->reconfigure(zone_options(next, i)));
  publish(std::move(zones));
  metrics_->programming(std::chrono::duration<double>(Clock::now() - t0).count());
  publish_answers();
  spdlog::info("dns: options reloaded, zone {} built again", opts_.zone);
  return {};
}

void DnsSink::publish(std::vector<ZonePtr> zones) {
  ZonePtr first = std::move(zones.front());
  zones.erase(zones.begin());
  zones_.publish(Zone::with_also(first, std::move(zones)));
}

void DnsSink::harvest() {
  int64_t horizon = horizon_ns();
  for (auto& b : builders_) b->harvest(horizon);
}

int64_t DnsSink::horizon_ns() const {
  auto now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  return now - int64_t{max_ttl_} * 1'000'000'000;
}

}  // namespace endpointd::dns
