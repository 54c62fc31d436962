// endpointd-traffic-agent: one node's proxy as a process of its own, for the restart tests
// (kill -9 and start again): the real ProxySink + NetlinkBackend + Monitor in the network
// namespace it runs in, fed one fixed snapshot given on the command line.
//
//   endpointd-traffic-agent --node-name NAME --node-ip IP --cluster-cidr CIDR
//       --service NAME:VIP:PORT=EP:PORT@NODE[,EP:PORT@NODE...]  (repeatable; TCP; empty list
//       after '=' for a service without endpoints)  [--ready-fd FD]
//
// Writes one byte to --ready-fd once the first full sync committed; runs until SIGTERM/SIGINT.
// Foreign changes to the tables (seen by the monitor) trigger a full resync.
#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/ack_board.h"
#include "proxy/conntrack.h"
#include "proxy/monitor.h"
#include "proxy/netlink.h"
#include "proxy/sink.h"
#include "tests/proxy/fixtures.h"

namespace {

using namespace endpointd;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

// "NAME:VIP:PORT=EP:PORT@NODE,..." -> the service's state.
model::ServiceStatePtr parse_service(const std::string& arg) {
  size_t eq = arg.find('=');
  if (eq == std::string::npos) throw std::runtime_error("--service needs '=': " + arg);
  auto head = split(arg.substr(0, eq), ':');
  if (head.size() != 3) throw std::runtime_error("--service NAME:VIP:PORT: " + arg);
  auto vip = model::IpAddr::parse(head[1]);
  if (!vip) throw std::runtime_error("bad VIP " + head[1]);
  auto svc = proxy::testing::service(head[0], {*vip}, static_cast<uint16_t>(std::stoi(head[2])));
  std::vector<model::MergedEndpoint> eps;
  std::string list = arg.substr(eq + 1);
  if (!list.empty()) {
    for (const auto& item : split(list, ',')) {
      size_t at = item.find('@');
      size_t colon = item.find(':');
      if (at == std::string::npos || colon == std::string::npos || colon > at) {
        throw std::runtime_error("endpoint EP:PORT@NODE: " + item);
      }
      std::string addr = item.substr(0, colon);
      auto port = static_cast<uint16_t>(std::stoi(item.substr(colon + 1, at - colon - 1)));
      if (!model::IpAddr::parse(addr)) throw std::runtime_error("bad endpoint " + addr);
      eps.push_back(proxy::testing::endpoint(addr.c_str(), port, item.substr(at + 1)));
    }
  }
  return proxy::testing::state(svc, std::move(eps));
}

int run(int argc, char** argv) {
  proxy::NodeContext ctx;
  ctx.ipv6 = false;
  std::vector<model::ServiceStatePtr> services;
  int ready_fd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--node-name") {
      ctx.node_name = value();
    } else if (a == "--node-ip") {
      auto ip = model::IpAddr::parse(value());
      if (!ip) throw std::runtime_error("bad --node-ip");
      ctx.node_ips.push_back(*ip);
    } else if (a == "--cluster-cidr") {
      auto p = model::IpPrefix::parse(value());
      if (!p) throw std::runtime_error("bad --cluster-cidr");
      ctx.cluster_cidrs.push_back(*p);
    } else if (a == "--service") {
      services.push_back(parse_service(value()));
    } else if (a == "--ready-fd") {
      ready_fd = std::atoi(value().c_str());
    } else {
      throw std::runtime_error("unknown argument " + a);
    }
  }

  // Block the stop signals before any thread starts, then wait for them with sigwait.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  auto backend = proxy::NetlinkBackend::open();
  if (!backend) throw std::runtime_error("netlink: " + backend.error());
  pipeline::AckBoard board;
  proxy::ProxySink::Options opts;
  opts.node = ctx;
  opts.backoff_min = std::chrono::milliseconds(20);
  opts.backoff_max = std::chrono::milliseconds(500);
  auto conntrack = proxy::make_netlink_conntrack();
  opts.conntrack = conntrack.get();
  proxy::ProxySink sink(backend->get(), &board, opts);
  auto monitor = proxy::Monitor::start((*backend)->port_id(), [&sink, nl = backend->get()] {
    nl->distrust_digests();
    sink.request_resync();
  });
  if (!monitor) throw std::runtime_error("monitor: " + monitor.error());

  auto snap = proxy::testing::snapshot(1, std::move(services));
  sink.apply(snap, model::diff(nullptr, *snap));
  if (!sink.wait_idle(std::chrono::seconds(10)) || !sink.synced()) {
    throw std::runtime_error("the first full sync did not commit");
  }
  spdlog::info("traffic-agent: synced on {}", ctx.node_name);
  if (ready_fd >= 0) {
    char c = 1;
    ssize_t n = write(ready_fd, &c, 1);
    (void)n;
    close(ready_fd);
  }
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("traffic-agent: stopping on signal {}; {} foreign changes, {} full syncs", sig,
               (*monitor)->foreign_changes(), sink.full_syncs());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "endpointd-traffic-agent: %s\n", e.what());
    return 1;
  }
}
