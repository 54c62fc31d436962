// The health and admin listeners on httpd/; metrics in Prometheus text format from
// prometheus-cpp.
#include "daemon/admin.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <fstream>

#include "daemon/process_metrics.h"

namespace endpointd::daemon {

namespace {

httpd::Response probe(const std::function<Probe()>& fn) {
  Probe p = fn ? fn() : Probe{};
  httpd::Response r;
  r.status = p.ok ? 200 : 503;
  if (!p.json.empty()) {
    r.content_type = "application/json";
    r.headers.emplace_back("X-Content-Type-Options", "nosniff");
    r.body = p.json;
    return r;
  }
  r.body = p.detail.empty() ? (p.ok ? "ok\n" : "not ok\n") : p.detail + "\n";
  return r;
}

}  // namespace

AdminServer::AdminServer(Role role, Handlers h, prometheus::Registry* registry, std::string token,
                         httpd::Limits limits)
    : role_(role),
      handlers_(std::move(h)),
      registry_(registry),
      server_(limits, role == Role::kHealth ? "health" : "admin") {
  server_.get("/healthz", [this](const httpd::Request&) { return probe(handlers_.healthz); });
  server_.get("/readyz", [this](const httpd::Request&) { return probe(handlers_.readyz); });
  server_.get("/livez", [this](const httpd::Request&) { return probe(handlers_.livez); });
  if (role_ == Role::kHealth) return;
  server_.set_bearer_token(std::move(token));
  server_.get_slow(
      "/metrics",
      [this](const httpd::Request&) {
        if (handlers_.before_scrape) handlers_.before_scrape();
        httpd::Response r;
        if (registry_) r.body = prometheus::TextSerializer().Serialize(registry_->Collect());
        r.body += process_metrics();
        r.content_type = "text/plain; version=0.0.4";
        return r;
      },
      httpd::Access::token);
  // The state is streamed as it is made, one request at a time (the server's one worker).
  server_.get_stream(
      "/debug/state", "application/json",
      [this](const httpd::Request& req, httpd::Writer& w) {
        auto q = parse_state_query(req.param("section"), req.param("service"));
        auto out = [&w](std::string_view piece) { return w.write(piece); };
        if (!q) return;  // answered 400 by the check below
        if (handlers_.debug_state)
          handlers_.debug_state(*q, out);
        else
          out("{}");
      },
      httpd::Access::token,
      [](const httpd::Request& req) {
        auto q = parse_state_query(req.param("section"), req.param("service"));
        httpd::Response r;
        if (!q) {
          r.status = 400;
          r.body = q.error() + "\n";
        }
        return r;
      });
}

AdminServer::~AdminServer() {
  stop();
}

Status AdminServer::start(const model::HostPort& listen) {
  if (auto st = server_.start(listen); !st)
    return Error{std::string(name()) + " server: " + st.error()};
  port_ = server_.port();
  spdlog::info("{} server on {}:{}", name(), listen.host.empty() ? "0.0.0.0" : listen.host, port_);
  return {};
}

void AdminServer::stop() {
  server_.stop();
}

Result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{"admin token file " + path + ": cannot be read"};
  std::string line;
  std::getline(in, line);
  auto b = line.find_first_not_of(" \t\r");
  auto e = line.find_last_not_of(" \t\r");
  if (b == std::string::npos) return Error{"admin token file " + path + ": holds no token"};
  return line.substr(b, e - b + 1);
}

}  // namespace endpointd::daemon
