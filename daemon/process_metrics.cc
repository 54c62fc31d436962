#include "daemon/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "daemon/version.h"

namespace endpointd::daemon {

std::optional<ProcStat> parse_proc_stat(std::string_view line) {
  auto close = line.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(close + 1);
  // Fields from the third (state) on: utime is the 14th field, stime the 15th, starttime the
  // 22nd, vsize the 23rd, rss the 24th (proc(5)).
  uint64_t at[25] = {};
  int field = 3;
  size_t i = 0;
  while (field <= 24) {
    while (i < rest.size() && rest[i] == ' ') ++i;
    if (i >= rest.size()) return std::nullopt;
    size_t end = rest.find(' ', i);
    if (end == std::string_view::npos) end = rest.size();
    if (field >= 14) {
      auto [p, ec] = std::from_chars(rest.data() + i, rest.data() + end, at[field]);
      if (ec != std::errc() || p != rest.data() + end) return std::nullopt;
    }
    i = end;
    ++field;
  }
  return ProcStat{at[14], at[15], at[22], at[23], at[24]};
}

namespace {

#if defined(__clang__)
constexpr const char* kCompiler = "clang " __clang_version__;
#else
constexpr const char* kCompiler = "gcc " __VERSION__;
#endif
#if defined(__x86_64__)
constexpr const char* kPlatform = "linux/amd64";
#elif defined(__aarch64__)
constexpr const char* kPlatform = "linux/arm64";
#else
constexpr const char* kPlatform = "linux/other";
#endif

std::optional<uint64_t> boot_time_seconds() {
  std::ifstream f("/proc/stat");
  std::string key;
  uint64_t v = 0;
  while (f >> key) {
    if (key == "btime" && (f >> v)) return v;
    f.ignore(4096, '\n');
  }
  return std::nullopt;
}

void gauge(std::ostringstream& out, const char* name, const char* type, const char* help,
           double v) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
      << name << ' ';
  // Whole values (bytes, descriptors) as integers; seconds with microseconds.
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    out << static_cast<int64_t>(v) << '\n';
  else
    out << std::fixed << v << '\n';
  out.unsetf(std::ios::floatfield);
}

}  // namespace

std::string process_metrics() {
  std::ostringstream out;
  out.precision(6);
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  std::string line;
  std::ifstream stat("/proc/self/stat");
  std::getline(stat, line);
  if (auto s = parse_proc_stat(line); s && tick > 0) {
    gauge(out, "process_cpu_seconds_total", "counter",
          "Total user and system CPU time spent in seconds.",
          static_cast<double>(s->utime_ticks + s->stime_ticks) / tick);
    gauge(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
          static_cast<double>(s->vsize_bytes));
    gauge(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
          static_cast<double>(s->rss_pages) * page);
    if (auto boot = boot_time_seconds())
      gauge(out, "process_start_time_seconds", "gauge",
            "Start time of the process since unix epoch in seconds.",
            static_cast<double>(*boot) + static_cast<double>(s->start_ticks) / tick);
  }
  std::error_code ec;
  size_t fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++fds;
  if (!ec && fds > 0)
    gauge(out, "process_open_fds", "gauge", "Number of open file descriptors.",
          static_cast<double>(fds - 1));  // less the one listing the directory
  if (rlimit r; getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    gauge(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
          static_cast<double>(r.rlim_cur));
  out << "# HELP endpointd_build_info The endpointd build: its version, compiler and "
         "platform (1)\n# TYPE endpointd_build_info gauge\nendpointd_build_info{version=\""
      << kVersion << "\",compiler=\"" << kCompiler << "\",platform=\"" << kPlatform << "\"} 1\n";
  return out.str();
}

}  // namespace endpointd::daemon
