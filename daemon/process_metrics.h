// The process_* metrics Prometheus' client libraries export (the ones kube-proxy's dashboards
// and alerts read: CPU, memory, file descriptors, start time), and endpointd_build_info, read
// from /proc at each scrape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace endpointd::daemon {

// The fields of a /proc/<pid>/stat line that the metrics use, in clock ticks and bytes.
struct ProcStat {
  uint64_t utime_ticks = 0;
  uint64_t stime_ticks = 0;
  uint64_t start_ticks = 0;  // after boot
  uint64_t vsize_bytes = 0;
  uint64_t rss_pages = 0;
};
// Parses a stat line; fields are counted after the last ')', so a command name holding spaces
// or parentheses cannot shift them. Nothing when the line is not one.
std::optional<ProcStat> parse_proc_stat(std::string_view line);

// The metrics in Prometheus text format: process_cpu_seconds_total, process_open_fds,
// process_max_fds, process_virtual_memory_bytes, process_resident_memory_bytes,
// process_start_time_seconds, endpointd_build_info. A value that cannot be read is left out.
std::string process_metrics();

}  // namespace endpointd::daemon
