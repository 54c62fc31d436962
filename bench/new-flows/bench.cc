// new_flows_bench: what the late-sender watch (proxy/new_flows.h) costs the agent, run by
// bench/new-flows/run inside a network namespace while datapath_probe makes connections.
//
//   new_flows_bench --watch IP[,IP...] --seconds S
//
// Opens the watch on the addresses, takes its queue every 100 ms (the coordinator's kLatePoll)
// for S seconds, and prints this process's CPU (its event reader included) and the watch's
// counters: cpu_s=.. taken=.. seen=.. dropped=.. overruns=.. filtered_here=.. kernel_filter=0|1
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "proxy/new_flows.h"

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  std::string watch;
  double seconds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--watch") {
      watch = v;
    } else if (k == "--seconds") {
      seconds = std::atof(v.c_str());
    } else {
      std::fprintf(stderr, "new_flows_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::set<endpointd::model::IpAddr> addresses;
  std::stringstream list(watch);
  for (std::string a; std::getline(list, a, ',');) {
    auto ip = endpointd::model::IpAddr::parse(a);
    if (!ip) {
      std::fprintf(stderr, "new_flows_bench: --watch: %s is no address\n", a.c_str());
      return 2;
    }
    addresses.insert(*ip);
  }
  auto w = endpointd::proxy::NewFlowWatch::open();
  if (!w) {
    std::fprintf(stderr, "new_flows_bench: %s\n", w.error().c_str());
    return 1;
  }
  if (auto st = (*w)->watch(addresses); !st) {
    std::fprintf(stderr, "new_flows_bench: %s\n", st.error().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  double cpu0 = cpu_seconds();
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  size_t taken = 0;
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    taken += (*w)->take().size();
  }
  auto s = (*w)->stats();
  std::printf(
      "cpu_s=%.3f taken=%zu seen=%llu dropped=%llu overruns=%llu filtered_here=%llu "
      "kernel_filter=%d\n",
      cpu_seconds() - cpu0, taken, static_cast<unsigned long long>(s.seen),
      static_cast<unsigned long long>(s.dropped), static_cast<unsigned long long>(s.overruns),
      static_cast<unsigned long long>(s.filtered_here), s.kernel_filter ? 1 : 0);
  return 0;
}
