// Backoff and spread for the API client (backoff.h).
#include "watcher/backoff.h"

#include <algorithm>
#include <cstdint>

namespace endpointd::watcher {

using std::chrono::milliseconds;
using std::chrono::seconds;

milliseconds spread(milliseconds d, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> u(0, std::max<int64_t>(d.count(), 0));
  return milliseconds(u(rng));
}

milliseconds backoff_delay(const KubeClientConfig& config, int failures,
                           std::optional<seconds> retry_after, std::mt19937_64& rng) {
  const auto& cfg = config;
  if (retry_after) {
    return std::min<milliseconds>(*retry_after, cfg.retry_after_max);
  }
  int64_t cap = cfg.backoff_initial.count();
  for (int i = 0; i < failures && cap < cfg.backoff_max.count(); ++i) cap *= 2;
  cap = std::min<int64_t>(cap, cfg.backoff_max.count());
  return spread(milliseconds(cap), rng);
}

}  // namespace endpointd::watcher
