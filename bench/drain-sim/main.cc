// bench/drain-sim: many seeds of the drain simulation (tests/drain/sim/sim.h) on every core;
// prints the safety and liveness counts, the fault mix and the first failing seeds.
//
//   drain_sim --from 1 --seeds 1000000 [--threads N]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/drain/sim/sim.h"

int main(int argc, char** argv) {
  uint64_t from = 1, seeds = 10000;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--from"))
      from = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--seeds"))
      seeds = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: drain_sim [--from N] [--seeds N] [--threads N]\n");
      return 2;
    }
  }
  std::atomic<uint64_t> next{from};
  std::mutex mu;
  uint64_t done = 0, safety = 0, liveness = 0, confirmed = 0, unconfirmed = 0, long_seeds = 0;
  // What the check excused (sim.h's Report), and what it counted beside.
  std::map<std::string, uint64_t> exempt, counted;
  std::map<std::string, uint64_t> faults;
  std::vector<uint64_t> failing;
  double long_secs = 0, short_secs = 0;  // time in seeds with a long horizon, and the others
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (uint64_t s; (s = next.fetch_add(1)) < from + seeds;) {
        auto t = std::chrono::steady_clock::now();
        auto r = endpointd::drain::sim::run(s);
        double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        std::lock_guard lock(mu);
        (r.long_horizon ? long_secs : short_secs) += took;
        ++done;
        safety += r.safety.size();
        liveness += r.liveness.size();
        confirmed += r.releases_confirmed;
        unconfirmed += r.releases_unconfirmed;
        long_seeds += r.long_horizon;
        exempt["fallback_after_view"] += r.fallback_after_view;
        exempt["node_after_view"] += r.node_after_view;
        exempt["node_deleted_routes"] += r.node_deleted_routes;
        exempt["eds_panic_assumed_off"] += r.eds_panic_assumed_off;
        exempt["forgotten_subscriber_routes"] += r.forgotten_subscriber_routes;
        counted["feed_eds_only"] += r.feed_eds_only;
        counted["feed_upstream_only"] += r.feed_upstream_only;
        counted["ips_reused"] += r.ips_reused;
        counted["late_unconfirmed"] += r.late_unconfirmed;
        counted["silent_at_budget"] += r.silent_at_budget;
        for (const auto& [k, n] : r.faults) faults[k] += n;
        if (!r.ok() && failing.size() < 20) failing.push_back(s);
      }
    });
  }
  for (auto& t : pool) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
  std::printf("seeds %llu..%llu (%llu, %llu of them long) in %.1f s on %u threads, %.1f s CPU\n",
              static_cast<unsigned long long>(from),
              static_cast<unsigned long long>(from + seeds - 1),
              static_cast<unsigned long long>(done), static_cast<unsigned long long>(long_seeds),
              secs, threads, cpu);
  std::printf("time in seeds: %.1f s in the long ones, %.1f s in the others (%.1f ms a seed)\n",
              long_secs, short_secs,
              done > long_seeds ? 1000 * short_secs / static_cast<double>(done - long_seeds) : 0.0);
  std::printf("releases: %llu confirmed, %llu unconfirmed\n",
              static_cast<unsigned long long>(confirmed),
              static_cast<unsigned long long>(unconfirmed));
  std::printf("safety violations (a false \"confirmed\"): %llu\n",
              static_cast<unsigned long long>(safety));
  std::printf("liveness misses (a fault-free drain not confirmed in time): %llu\n",
              static_cast<unsigned long long>(liveness));
  std::printf("exemptions the check made (sim.h, Report):\n");
  for (const auto& [k, n] : exempt)
    std::printf("  %-32s %llu\n", k.c_str(), static_cast<unsigned long long>(n));
  std::printf("counted beside:\n");
  for (const auto& [k, n] : counted)
    std::printf("  %-32s %llu\n", k.c_str(), static_cast<unsigned long long>(n));
  std::printf("faults injected:\n");
  for (const auto& [k, n] : faults)
    std::printf("  %-32s %llu\n", k.c_str(), static_cast<unsigned long long>(n));
  if (!failing.empty()) {
    std::printf(
        "failing seeds (replay: ENDPOINTD_SIM_SEED=N drain_sim_test "
        "--gtest_filter=DrainSim.Replay):");
    for (auto s : failing) std::printf(" %llu", static_cast<unsigned long long>(s));
    std::printf("\n");
  }
  return safety ? 1 : 0;
}
