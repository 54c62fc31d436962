// Serves the DNS benchmark's cluster (see gen_zone.py: the same records) with endpointd's
// DNS sink until SIGINT/SIGTERM. Usage: bench_server PORT [services] [endpoints-per-service]
// [workers] [upstream ADDR:PORT [cache-entries]]: with an upstream, names outside the cluster
// zone are forwarded to it (bench/dns/run-forward), else they are REFUSED. Its metrics count
// into a registry, as the daemon's do (nothing serves them).
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <unistd.h>

#include <prometheus/registry.h>

#include "bench/dns/cluster.h"
#include "dns/sink.h"

using namespace endpointd;

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}
}  // namespace

int main(int argc, char** argv) {
  int port = argc > 1 ? std::atoi(argv[1]) : 5300;
  int n = argc > 2 ? std::atoi(argv[2]) : 10000;
  int e = argc > 3 ? std::atoi(argv[3]) : 10;
  int workers = argc > 4 ? std::atoi(argv[4]) : 1;
  auto snap = bench::bench_snapshot(n, e);
  dns::DnsOptions o;
  o.listen = "127.0.0.1:" + std::to_string(port);
  o.workers = workers;
  o.forwarding = argc > 5;
  if (o.forwarding) {
    o.upstreams = {argv[5]};
    o.cache_entries = argc > 6 ? std::strtoul(argv[6], nullptr, 10) : 100000;
  }
  prometheus::Registry registry;
  dns::DnsSink sink(o, nullptr, &registry);
  if (auto st = sink.start(); !st) {
    std::fprintf(stderr, "%s\n", st.error().c_str());
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  sink.apply(snap, model::diff(nullptr, *snap));
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "bench_server: zone of %zu names built in %.1f ms, serving on %d\n",
               sink.zone()->name_count(), ms, port);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  while (!g_stop) pause();
  sink.stop();
  return 0;
}
