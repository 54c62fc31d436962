// The DNS sink: zone building off the hot path, atomic swap, acknowledgement, drain support.
#include "dns/sink.h"

#include <charconv>

#include <spdlog/spdlog.h>

namespace endpointd::dns {

std::optional<std::pair<std::string, uint16_t>> parse_listen(const std::string& s) {
  std::string host = s;
  std::string port = "53";
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos) return std::nullopt;
    host = s.substr(1, close - 1);
    if (close + 1 < s.size()) {
      if (s[close + 1] != ':') return std::nullopt;
      port = s.substr(close + 2);
    }
  } else if (std::count(s.begin(), s.end(), ':') == 1) {
    host = s.substr(0, s.find(':'));
    port = s.substr(s.find(':') + 1);
  }
  unsigned p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || p > 65535) return std::nullopt;
  if (!model::IpAddr::parse(host)) return std::nullopt;
  return std::make_pair(host, static_cast<uint16_t>(p));
}

DnsSink::DnsSink(DnsOptions opts, pipeline::AckBoard* board, prometheus::Registry* registry)
    : opts_(std::move(opts)), board_(board), metrics_(std::make_unique<Metrics>(registry)) {
  zone_opts_.zone = opts_.zone;
  zone_opts_.ttl = opts_.ttl;
  zone_opts_.negative_ttl = opts_.negative_ttl;
  zone_opts_.pod_mode = opts_.pod_mode;
  zones_.publish(Zone::unsynced(zone_opts_));
  if (opts_.forward_allow.empty())
    for (const char* p : {"127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                          "::1/128", "fc00::/7"})
      opts_.forward_allow.push_back(*model::IpPrefix::parse(p));
  if (board_) board_->add("dns");
}

DnsSink::~DnsSink() { stop(); }

std::optional<std::string> DnsSink::start() {
  auto listen = parse_listen(opts_.listen);
  if (!listen) return "dns: bad listen address '" + opts_.listen + "'";
  if (!name_from_text(opts_.zone)) return "dns: bad zone '" + opts_.zone + "'";
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
    if (auto err = forwarder_->start()) return "dns: " + *err;
  }
  ServerOptions so;
  so.listen_address = listen->first;
  so.port = listen->second;
  so.workers = opts_.workers;
  so.tcp_max_connections = opts_.tcp_max_connections;
  so.tcp_idle_timeout = opts_.tcp_idle_timeout;
  so.forward_allow = opts_.forward_allow;
  server_ = std::make_unique<Server>(so, &zones_, forwarder_.get(), metrics_.get());
  if (auto err = server_->start()) {
    server_.reset();
    return err;
  }
  spdlog::info("dns: serving {} on {} port {} ({} workers)", opts_.zone, listen->first, server_->port(),
               opts_.workers);
  return std::nullopt;
}

void DnsSink::stop() {
  if (server_) server_->stop();  // stops the forwarder too
  if (forwarder_) forwarder_->stop();
}

void DnsSink::apply(const model::SnapshotPtr& snap, const model::Delta&) {
  // The zone is rebuilt whole: encoding is cheap next to the hashing it needs anyway, and a
  // rebuilt zone can never drift from its snapshot.
  auto t0 = Clock::now();
  ZonePtr z = Zone::build(*snap, zone_opts_);
  ZonePtr old = zones_.load();
  zones_.publish(z);
  metrics_->programming(std::chrono::duration<double>(Clock::now() - t0).count());
  {
    std::lock_guard lk(mu_);
    if (old) retired_.push_back(std::move(old));
    harvest(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
  }
  if (board_) board_->applied("dns", snap);
}

void DnsSink::harvest(int64_t now_ns) {
  for (auto it = retired_.begin(); it != retired_.end();) {
    // Only we hold it: no worker can stamp it any more, its record is final.
    if (it->use_count() == 1) {
      for (const auto& [a, ns] : (*it)->served_addresses()) {
        int64_t& d = departed_[a];
        d = std::max(d, ns);
      }
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
  int64_t horizon = now_ns - int64_t{opts_.ttl} * 1'000'000'000;
  for (auto it = departed_.begin(); it != departed_.end();) {
    if (it->second < horizon) it = departed_.erase(it);
    else ++it;
  }
}

std::optional<DnsSink::Clock::time_point> DnsSink::last_answer_expiry(const model::IpAddr& a) {
  int64_t best = 0;
  {
    std::lock_guard lk(mu_);
    harvest(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
    if (auto it = departed_.find(a); it != departed_.end()) best = it->second;
    for (const auto& z : retired_)
      if (auto ns = z->last_served_ns(a)) best = std::max(best, *ns);
  }
  if (ZonePtr z = zones_.load())
    if (auto ns = z->last_served_ns(a)) best = std::max(best, *ns);
  if (best == 0) return std::nullopt;
  return Clock::time_point(std::chrono::nanoseconds(best)) + std::chrono::seconds(opts_.ttl);
}

}  // namespace endpointd::dns
