// Metrics on prometheus-cpp, served by cpp-httplib with one worker thread.
#include "adapters/haproxy/metrics.h"

#include <httplib.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

namespace endpointd::haproxy {
namespace {

prometheus::Gauge& gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Counter& counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

Metrics::Metrics()
    : registry(std::make_shared<prometheus::Registry>()),
      received_version(
          gauge(*registry, "endpointd_haproxy_received_version", "Newest version the feed sent")),
      acked_version(gauge(*registry, "endpointd_haproxy_acked_version",
                          "Newest version acknowledged to the feed (HAProxy showed it applied)")),
      syncs_applied(counter(*registry, "endpointd_haproxy_syncs_applied_total",
                            "Passes over HAProxy whose read-back matched the desired servers")),
      syncs_failed(counter(*registry, "endpointd_haproxy_syncs_failed_total",
                           "Passes over HAProxy that did not converge (retried, no ack)")),
      commands(counter(*registry, "endpointd_haproxy_commands_total",
                       "Runtime-API commands sent to change servers")),
      runtime_errors(
          counter(*registry, "endpointd_haproxy_runtime_errors_total",
                  "Runtime-API calls without an answer, or answers reporting a failure")),
      collisions(gauge(*registry, "endpointd_haproxy_name_collisions",
                       "Endpoints whose server name is taken by a server the adapter did not add")),
      collisions_seen(counter(*registry, "endpointd_haproxy_name_collisions_total",
                              "Server name collisions, each counted when first seen")),
      pending_deletions(gauge(*registry, "endpointd_haproxy_pending_deletions",
                              "Removed endpoints in maint whose server still has connections")),
      skipped_endpoints(
          counter(*registry, "endpointd_haproxy_skipped_endpoints_total",
                  "Endpoints the feed sent that cannot be servers (bad address/port)")),
      feed_streams(
          counter(*registry, "endpointd_haproxy_feed_streams_total", "Feed streams opened")),
      feed_stream_errors(counter(*registry, "endpointd_haproxy_feed_stream_errors_total",
                                 "Feed streams that ended or could not be opened")) {}

MetricsServer::MetricsServer(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)), server_(std::make_unique<httplib::Server>()) {
  // One worker: a scrape now and then, never a crowd.
  server_->new_task_queue = [] { return new httplib::ThreadPool(1); };
  server_->set_read_timeout(5, 0);
  server_->set_write_timeout(5, 0);
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(registry_->Collect()),
                    "text/plain; version=0.0.4");
  });
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
}

MetricsServer::~MetricsServer() {
  stop();
}

Status MetricsServer::start(const model::HostPort& listen) {
  std::string host = listen.host.empty() ? "0.0.0.0" : listen.host;
  int port = listen.port == 0
                 ? server_->bind_to_any_port(host.c_str())
                 : (server_->bind_to_port(host.c_str(), listen.port) ? listen.port : -1);
  if (port < 0) return Error{"metrics: cannot bind " + listen.str()};
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  spdlog::info("metrics on http://{}:{}/metrics", host, port);
  return {};
}

void MetricsServer::stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace endpointd::haproxy
