// endpointd-drain-agent: the node agent's drain wiring for the drain-ordering tests, the same
// pieces `endpointd run` composes (source → update loop → proxy sink → coordinator, peer
// server, prestop socket), plus `prestop` as the pods' client. It writes the coordinator's
// drains_json to --state-out whenever it changes, so the test can read every timeline.
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <thread>

#include "daemon/config.h"
#include "daemon/conntrack_flows.h"
#include "daemon/sources.h"
#include "drain/coordinator.h"
#include "pipeline/ack_board.h"
#include "pipeline/update_loop.h"
#include "proxy/conntrack.h"
#include "proxy/netlink.h"
#include "proxy/sink.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace endpointd;
  if (argc > 1 && std::string(argv[1]) == "prestop") return drain::prestop_main(argc - 1, argv + 1);
  daemon::Config cfg;
  drain::CoordinatorOptions co;
  // The test agent runs from a manifest directory in namespaces the test made: plaintext peers
  // (the mutual-TLS path is tested in drain_peer_tls_test and daemon_drain_test).
  co.peer_insecure = true;
  std::string state_out;
  bool no_conntrack = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--source-dir")
      cfg.source_dir = v;
    else if (k == "--node-name")
      cfg.node_name = v;
    else if (k == "--cluster-cidr") {
      auto p = model::IpPrefix::parse(v);
      if (!p) {
        std::cerr << "--cluster-cidr: \"" << v << "\" is not a CIDR\n";
        return 2;
      }
      cfg.cluster_cidr.push_back(*p);
    } else if (k == "--drain-socket")
      co.drain_socket = v;
    else if (k == "--peer-port")
      co.peer_port = static_cast<uint16_t>(std::stoi(v));
    else if (k == "--peer-listen")
      co.peer_listen = v;
    else if (k == "--peer-timeout-ms")
      co.machine.peer_timeout = std::chrono::milliseconds(std::stoi(v));
    else if (k == "--peer-policy")
      co.machine.peer_policy = v == "wait" ? drain::PeerPolicy::kWait : drain::PeerPolicy::kProceed;
    else if (k == "--state-out")
      state_out = v;
    else if (k == "--conntrack")
      no_conntrack = v == "off";
    else {
      std::cerr << "unknown flag " << k << "\n";
      return 2;
    }
  }
  co.machine.node_name = cfg.node_name;
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  auto registry = std::make_shared<prometheus::Registry>();
  pipeline::AckBoard board;
  pipeline::UpdateLoop::Options lo;
  lo.registry = registry.get();
  lo.expected_kinds = daemon::expected_kinds(cfg);
  pipeline::UpdateLoop loop(lo);
  auto be = proxy::NetlinkBackend::open();
  if (!be) {
    std::cerr << "nftables: " << be.error() << "\n";
    return 1;
  }
  auto netlink = std::move(*be);
  proxy::ProxySink::Options po;
  po.registry = registry.get();
  po.node.node_name = cfg.node_name;
  po.node.cluster_cidrs = cfg.cluster_cidr;
  proxy::ProxySink sink(netlink.get(), &board, po);
  loop.add_sink(&sink);
  auto conntrack = proxy::make_netlink_conntrack();
  daemon::ConntrackFlows flows(conntrack.get());
  co.registry = registry.get();
  drain::Coordinator coordinator(&board, no_conntrack ? nullptr : &flows, co);
  loop.on_publish([&](const model::SnapshotPtr& s) { coordinator.on_snapshot(s); });
  if (auto st = coordinator.start(); !st) {
    std::cerr << st.error() << "\n";
    return 1;
  }
  loop.start();
  auto made = daemon::make_source(
      cfg, [&](model::Event ev) { loop.post(std::move(ev)); }, registry.get());
  if (!made) {
    std::cerr << "source: " << made.error() << "\n";
    return 1;
  }
  auto source = std::move(*made);
  if (auto st = source->start(); !st) {
    std::cerr << "source: " << st.error() << "\n";
    return 1;
  }
  std::string last;
  auto dump = [&] {
    if (state_out.empty()) return;
    std::string j = coordinator.drains_json();
    if (j == last) return;
    last = j;
    std::ofstream(state_out + ".tmp") << j;
    std::rename((state_out + ".tmp").c_str(), state_out.c_str());
  };
  while (!g_stop) {
    dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  source->stop();
  loop.stop();
  dump();
  coordinator.stop();
  return 0;
}
