// Zone programming time at scale: a full build of the benchmark cluster, then single
// endpoint changes applied as deltas (the sink's path: build, swap in). Prints a Markdown
// table. Usage: zone_build [services] [endpoints-per-service] [changes]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <time.h>

#include "bench/dns/cluster.h"
#include "dns/zone.h"

using namespace endpointd;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// CPU time of this thread: what the work costs, without the time other processes on a shared
// machine took the core.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

size_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoul(line.c_str() + 6, nullptr, 10);
  return 0;
}

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 10000;
  int e = argc > 2 ? std::atoi(argv[2]) : 10;
  int changes = argc > 3 ? std::atoi(argv[3]) : 1000;
  size_t rss0 = rss_kib();
  auto snap = bench::bench_snapshot(n, e);
  size_t rss1 = rss_kib();
  dns::ZoneBuilder builder(dns::ZoneOptions{});
  auto t0 = Clock::now();
  dns::ZonePtr zone = builder.apply(snap, model::diff(nullptr, *snap));
  double full_ms = ms_since(t0);
  size_t rss2 = rss_kib();
  std::vector<double> headless, clusterip, headless_cpu, clusterip_cpu;
  size_t shards = 0;
  for (int c = 0; c < changes; ++c) {
    // One endpoint of one service turns terminating (alternately a headless service, whose
    // records change, and a ClusterIP one, whose records do not but whose state does).
    int i = (c * 7919) % n;
    if (c % 2 == 0)
      i -= i % 10;
    else if (i % 10 == 0)
      i += 1;
    auto next = std::make_shared<model::Snapshot>(*snap);
    next->generation = snap->generation + 1;
    next->services = snap->services.with(
        {{bench::bench_service(i, e).get()->key(), bench::bench_service(i, e, 1)}});
    model::Delta d = model::diff(snap.get(), *next);
    auto t = Clock::now();
    double c0 = cpu_ms();
    zone = builder.apply(next, d);
    builder.harvest(0);
    (i % 10 == 0 ? headless_cpu : clusterip_cpu).push_back(cpu_ms() - c0);
    (i % 10 == 0 ? headless : clusterip).push_back(ms_since(t));
    shards += builder.last_stats().shards;
    snap = next;
  }
  std::printf(
      "| services | endpoints | names | full build ms | RSS snapshot MiB | RSS zone MiB "
      "|\n|---|---|---|---|---|---|\n");
  std::printf("| %d | %d | %zu | %.1f | %.1f | %.1f |\n\n", n, n * e, zone->name_count(), full_ms,
              static_cast<double>(rss1 - rss0) / 1024, static_cast<double>(rss2 - rss1) / 1024);
  std::printf(
      "| one endpoint change, %d changes | p50 ms | p99 ms | max ms | CPU p50 ms | CPU p99 ms |\n"
      "|---|---|---|---|---|---|\n",
      changes);
  if (!headless.empty())
    std::printf("| headless service | %.3f | %.3f | %.3f | %.3f | %.3f |\n", pct(headless, 0.5),
                pct(headless, 0.99), pct(headless, 1.0), pct(headless_cpu, 0.5),
                pct(headless_cpu, 0.99));
  if (!clusterip.empty())
    std::printf("| ClusterIP service | %.3f | %.3f | %.3f | %.3f | %.3f |\n", pct(clusterip, 0.5),
                pct(clusterip, 0.99), pct(clusterip, 1.0), pct(clusterip_cpu, 0.5),
                pct(clusterip_cpu, 0.99));
  std::printf("\nindex shards copied per change: %.1f of %zu\n",
              static_cast<double>(shards) / changes, dns::Zone::kShards);
  return 0;
}
