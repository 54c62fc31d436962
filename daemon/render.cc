// One-shot dataplane commands. render goes through the same decoder, Store and planner as the
// daemon, so what it prints is what `endpointd run` would program.
#include "daemon/render.h"

#include <ostream>

#include "pipeline/store.h"
#include "proxy/conntrack_sysctl.h"
#include "proxy/netlink.h"
#include "proxy/node_local_address.h"
#include "proxy/planner.h"
#include "proxy/render.h"
#include "watcher/manifest_source.h"

namespace endpointd::daemon {

int render(const Config& cfg, std::ostream& out, std::ostream& err) {
  if (cfg.source_dir.empty()) {
    err << "endpointd render: --source-dir is required\n";
    return 2;
  }
  pipeline::Store store({model::ObjectKind::kService, model::ObjectKind::kEndpointSlice});
  watcher::ManifestSource src(
      cfg.source_dir, [&](model::Event ev) { store.apply(std::move(ev)); }, nullptr);
  std::error_code ec;
  if (!std::filesystem::is_directory(cfg.source_dir, ec)) {
    err << "endpointd render: " << cfg.source_dir << " is not a readable directory\n";
    return 1;
  }
  src.rescan();
  for (const auto& e : src.errors())
    err << "endpointd render: " << e.file << ": " << e.reason << "\n";
  auto snap = store.build(nullptr);

  proxy::NodeContext ctx;
  ctx.node_name = cfg.node_name;
  ctx.cluster_cidrs = cfg.cluster_cidr;
  ctx.detect_local = cfg.detect_local_mode;
  ctx.local_interface = cfg.detect_local_mode == proxy::DetectLocal::kBridgeInterface
                            ? cfg.pod_bridge_interface
                            : cfg.pod_interface_name_prefix;
  ctx.service_cidrs = cfg.service_cidr;
  ctx.node_port_addresses = cfg.nodeport_addresses;
  ctx.masquerade_all = cfg.masquerade_all;
  proxy::Planner planner(proxy::node_context_from(ctx, *snap));
  planner.reset(*snap);
  for (auto family : planner.families()) out << proxy::render(planner.table(family));
  return 0;
}

int cleanup(const Config& cfg, std::ostream& err) {
  // The node-local DNS address and its interface go with the tables that exempt it from
  // conntrack.
  if (cfg.dns_node_local_address) {
    if (auto st = proxy::remove_node_local_address(*cfg.dns_node_local_address); !st) {
      err << "endpointd: cleanup: node-local DNS address: " << st.error() << "\n";
      return 1;
    }
    err << "endpointd: took " << cfg.dns_node_local_address->str() << " off the node ("
        << proxy::kNodeLocalInterface << " deleted)\n";
  }
  auto be = proxy::NetlinkBackend::open();
  if (!be) {
    err << "endpointd: nftables: " << be.error() << "\n";
    return 1;
  }
  auto r = (*be)->cleanup();
  if (!r) {
    err << "endpointd: cleanup: " << r.error() << "\n";
    return 1;
  }
  err << "endpointd: deleted the ip and ip6 endpointd tables\n";
  return 0;
}

int init_only(const Config& cfg, std::ostream& err) {
  auto ct = proxy::apply_conntrack_sysctls(cfg.conntrack);
  if (!ct) {
    err << "endpointd: init-only: conntrack: " << ct.error() << "\n";
    return 1;
  }
  // Each value written is logged by the writer, with the one it replaced.
  if (!ct->read_only_sys.empty()) err << "endpointd: init-only: " << ct->read_only_sys << "\n";
  err << "endpointd: init-only: " << ct->written.size() << " conntrack settings written"
      << (ct->written.empty() ? " (every one given already in place)" : "") << "\n";
  return 0;
}

}  // namespace endpointd::daemon
