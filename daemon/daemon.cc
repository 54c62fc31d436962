// The daemon's parts and their order: sinks and the update loop first, then the admin server,
// then the source, so that nothing a source says is lost.
#include "daemon/daemon.h"

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include "daemon/admin.h"
#include "daemon/sources.h"
#include "daemon/state_json.h"
#include "pipeline/ack_board.h"
#include "pipeline/update_loop.h"

namespace endpointd::daemon {

struct Daemon::Impl {
  Config cfg;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  pipeline::AckBoard board;
  std::unique_ptr<pipeline::UpdateLoop> loop;
  std::unique_ptr<Source> source;
  std::unique_ptr<AdminServer> admin;

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
  m.loop->on_publish([](const model::SnapshotPtr& s) {
    spdlog::debug("published generation {} ({} services, synced={})", s->generation,
                  s->services.size(), s->synced);
  });
  m.loop->start();

  AdminServer::Handlers h;
  h.healthz = [] { return Probe{true, "ok"}; };
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
}

}  // namespace endpointd::daemon
