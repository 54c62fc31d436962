// The API client's waits between attempts: full-jitter exponential backoff with Retry-After
// honoured, and the random share that spreads a cluster's agents over a window.
#pragma once

#include <chrono>
#include <optional>
#include <random>

#include "watcher/kube_client.h"

namespace endpointd::watcher {

// A uniform random share of `d` (full jitter).
std::chrono::milliseconds spread(std::chrono::milliseconds d, std::mt19937_64& rng);

// The wait after `failures` failures in a row: Retry-After when the server said (up to
// retry_after_max), else a spread of min(backoff_max, backoff_initial * 2^failures).
std::chrono::milliseconds backoff_delay(const KubeClientConfig& config, int failures,
                                        std::optional<std::chrono::seconds> retry_after,
                                        std::mt19937_64& rng);

}  // namespace endpointd::watcher
