// Assembly of the nftables dataplane (see dataplane.h).
#include "proxy/dataplane.h"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "proxy/address_monitor.h"
#include "proxy/healthcheck.h"
#include "proxy/monitor.h"
#include "proxy/netlink.h"

namespace endpointd::proxy {

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

Result<std::unique_ptr<Dataplane>> Dataplane::start(DataplaneOptions opts,
                                                    pipeline::AckBoard* board) {
  auto be = NetlinkBackend::open();
  if (!be) return prefixed("nftables", be.error());
  std::unique_ptr<Dataplane> dp(new Dataplane());
  dp->netlink_ = std::move(*be);
  ProxySink::Options po;
  po.registry = opts.registry;
  po.process_start = opts.process_start;
  po.node = std::move(opts.node);
  bool from_host = po.node.node_ips.empty();
  if (from_host) po.node.node_ips = host_addresses();
  dp->conntrack_ = make_netlink_conntrack();
  po.conntrack = dp->conntrack_.get();
  HealthCheckOptions ho;
  ho.proxy_healthy = [d = dp.get()] { return !d->sink_ || d->sink_->healthy(); };
  dp->health_checks_ = std::make_unique<HealthCheckServer>(ho);
  po.health_checks = dp->health_checks_.get();
  dp->sink_ = std::make_unique<ProxySink>(dp->netlink_.get(), board, po);
  if (from_host) {
    // NodePorts on addresses chosen by CIDR follow the host's addresses.
    auto am = AddressMonitor::start(
        [sink = dp->sink_.get()] { sink->set_host_addresses(host_addresses()); });
    if (am) {
      dp->addresses_ = std::move(*am);
    } else {
      spdlog::warn(
          "address monitor unavailable ({}): an address added to the host serves NodePorts "
          "only after a restart",
          am.error());
    }
  }
  // Someone else changing endpointd's tables gets a full resync that lists every set (the
  // change may be in a set whose content digest still says otherwise).
  auto mon =
      Monitor::start(dp->netlink_->port_id(), [nl = dp->netlink_.get(), sink = dp->sink_.get()] {
        nl->distrust_digests();
        sink->request_resync();
      });
  if (mon) {
    dp->monitor_ = std::move(*mon);
    // Full syncs with the monitor out of its group: the kernel then builds no notification per
    // element of endpointd's own batch (100,000 of them at 10k services).
    dp->netlink_->set_quiet_full_sync([m = dp->monitor_](bool on) { return m->listen(on); },
                                      [m = dp->monitor_] { m->report_foreign(); });
  } else {
    spdlog::warn(
        "nftables monitor unavailable ({}): changes made by others are repaired only at "
        "the next full sync",
        mon.error());
  }
  return dp;
}

Dataplane::~Dataplane() {
  addresses_.reset();  // it calls into the sink
  // The quiet full sync hooks hold the monitor; drop them before it goes.
  if (netlink_) netlink_->set_quiet_full_sync({}, {});
  monitor_.reset();
}

}  // namespace endpointd::proxy
