// Admin endpoints on cpp-httplib; metrics in Prometheus text format from prometheus-cpp.
#include "daemon/admin.h"

#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>

#include "model/hostport.h"

namespace endpointd::daemon {

namespace {

// process_resident_memory_bytes, as Prometheus' process collectors name it.
std::string process_metrics() {
  long pages = 0, resident = 0;
  std::ifstream statm("/proc/self/statm");
  statm >> pages >> resident;
  double rss = static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                "# TYPE process_resident_memory_bytes gauge\n"
                "process_resident_memory_bytes %.0f\n",
                rss);
  return buf;
}

void probe(httplib::Response& res, const std::function<Probe()>& fn) {
  Probe p = fn ? fn() : Probe{};
  res.status = p.ok ? 200 : 503;
  res.set_content(p.detail.empty() ? (p.ok ? "ok\n" : "not ok\n") : p.detail + "\n", "text/plain");
}

}  // namespace

AdminServer::AdminServer(Handlers h, prometheus::Registry* registry)
    : handlers_(std::move(h)), registry_(registry), server_(std::make_unique<httplib::Server>()) {
  server_->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    probe(res, handlers_.healthz);
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    probe(res, handlers_.readyz);
  });
  server_->Get("/livez", [this](const httplib::Request&, httplib::Response& res) {
    probe(res, handlers_.livez);
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string body;
    if (registry_) body = prometheus::TextSerializer().Serialize(registry_->Collect());
    body += process_metrics();
    res.set_content(body, "text/plain; version=0.0.4");
  });
  server_->Get("/debug/state", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(handlers_.debug_state ? handlers_.debug_state() : "{}", "application/json");
  });
}

AdminServer::~AdminServer() {
  stop();
}

Status AdminServer::start(const model::HostPort& listen) {
  std::string host = listen.host.empty() ? "0.0.0.0" : listen.host;
  int port = listen.port;
  if (port == 0) {
    port_ = server_->bind_to_any_port(host.c_str());
  } else {
    port_ = server_->bind_to_port(host.c_str(), port) ? port : -1;
  }
  if (port_ < 0) return Error{"admin server cannot bind " + listen.str()};
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  spdlog::info("admin server on {}:{}", host, port_);
  return {};
}

void AdminServer::stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace endpointd::daemon
