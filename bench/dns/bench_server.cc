// Serves the DNS benchmark's cluster (see gen_zone.py: the same records) with endpointd's
// DNS sink until SIGINT/SIGTERM. Usage: bench_server PORT [services] [endpoints-per-service]
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <unistd.h>

#include "dns/sink.h"

using namespace endpointd;

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

std::string eip(int i, int j, int e) {
  int k = i * e + j;
  return "10." + std::to_string(128 + k / 65536) + "." + std::to_string((k / 256) % 256) + "." +
         std::to_string(k % 256);
}
}  // namespace

int main(int argc, char** argv) {
  int port = argc > 1 ? std::atoi(argv[1]) : 5300;
  int n = argc > 2 ? std::atoi(argv[2]) : 10000;
  int e = argc > 3 ? std::atoi(argv[3]) : 10;
  auto snap = std::make_shared<model::Snapshot>();
  snap->generation = 1;
  snap->synced = true;
  std::vector<model::ServiceStatePtr> services;
  for (int i = 0; i < n; ++i) {
    auto st = std::make_shared<model::ServiceState>();
    st->service.key = {"ns" + std::to_string(i % 100), "svc" + std::to_string(i)};
    st->service.headless = i % 10 == 0;
    if (!st->service.headless)
      st->service.cluster_ips.push_back(model::IpAddr::v4((10u << 24) | (96u << 16) | static_cast<uint32_t>(i)));
    model::ServicePort p;
    p.name = "http";
    p.port = 80;
    st->service.ports.push_back(p);
    for (int j = 0; j < e; ++j) {
      model::MergedEndpoint m;
      m.address = *model::IpAddr::parse(eip(i, j, e));
      m.hostname = "ep-" + std::to_string(j);
      m.ports.push_back({"http", model::Protocol::kTCP, 8080, ""});
      st->endpoints.push_back(std::move(m));
    }
    services.push_back(std::move(st));
  }
  std::sort(services.begin(), services.end(), [](const auto& a, const auto& b) { return a->key() < b->key(); });
  snap->services = std::move(services);
  dns::DnsOptions o;
  o.listen = "127.0.0.1:" + std::to_string(port);
  o.forwarding = false;
  o.workers = 1;
  dns::DnsSink sink(o, nullptr, nullptr);
  if (auto err = sink.start()) {
    std::fprintf(stderr, "%s\n", err->c_str());
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  sink.apply(snap, model::Delta{});
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "bench_server: zone of %zu names built in %.1f ms, serving on %d\n", sink.zone()->name_count(),
               ms, port);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  while (!g_stop) pause();
  sink.stop();
  return 0;
}
