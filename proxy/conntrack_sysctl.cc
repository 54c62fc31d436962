// Conntrack sysctls as kube-proxy sets them (see conntrack_sysctl.h).
#include "proxy/conntrack_sysctl.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace endpointd::proxy {
namespace {

constexpr const char* kNetfilter = "/net/netfilter/";
constexpr const char* kHashsize = "/nf_conntrack/parameters/hashsize";

std::string errno_text(int err) {
  return std::strerror(err);
}

// The number in a sysctl or module parameter file, or an error naming the file.
Result<uint64_t> read_number(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error{"cannot read " + path + ": " + errno_text(errno)};
  char buf[64];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int err = errno;
  close(fd);
  if (n < 0) return Error{"cannot read " + path + ": " + errno_text(err)};
  const char* begin = buf;
  const char* end = buf + n;
  while (begin < end && (*begin == ' ' || *begin == '\t')) ++begin;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(begin, end, v);
  if (ec != std::errc{} || ptr == begin) return Error{"cannot parse the number in " + path};
  return v;
}

// Writes `value` and a newline; 0 on success, else the errno.
int write_number(const std::string& path, uint64_t value) {
  int fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return errno;
  std::string text = std::to_string(value) + "\n";
  ssize_t n = write(fd, text.data(), text.size());
  int err = n < 0 ? errno : (static_cast<size_t>(n) != text.size() ? EIO : 0);
  if (close(fd) != 0 && err == 0) err = errno;
  return err;
}

bool read_only_fs(const std::string& path) {
  struct statvfs st {};
  return statvfs(path.c_str(), &st) == 0 && (st.f_flag & ST_RDONLY) != 0;
}

unsigned online_cpus() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<unsigned>(n) : 1;
}

class Writer {
 public:
  explicit Writer(const std::string& proc_sys) : proc_sys_(proc_sys) {}

  // net.netfilter.<name> = value, unless it already is.
  Status set(const std::string& name, uint64_t value) {
    std::string path = proc_sys_ + kNetfilter + name;
    std::string key = "net.netfilter." + name;
    auto current = read_number(path);
    if (current && *current == value) return {};
    // kube-proxy writes even when the read failed; the write then says what is wrong.
    if (int err = write_number(path, value)) {
      return Error{"conntrack: cannot set " + key + "=" + std::to_string(value) + ": write " +
                   path + ": " + errno_text(err)};
    }
    spdlog::info("conntrack: set {}={} (was {})", key, value,
                 current ? std::to_string(*current) : std::string("unreadable"));
    written.push_back(key + "=" + std::to_string(value));
    return {};
  }

  std::vector<std::string> written;

 private:
  const std::string& proc_sys_;
};

}  // namespace

uint64_t conntrack_max_for(const ConntrackSysctls& s, unsigned cpus) {
  if (!s.max_per_core || *s.max_per_core == 0) return 0;
  uint64_t scaled = uint64_t{*s.max_per_core} * std::max(cpus, 1u);
  return std::max<uint64_t>(scaled, s.min.value_or(0));
}

Result<ConntrackSysctlsApplied> apply_conntrack_sysctls(const ConntrackSysctls& s,
                                                        const std::string& proc_sys,
                                                        const std::string& sys_module,
                                                        unsigned cpus) {
  ConntrackSysctlsApplied out;
  Writer w(proc_sys);
  if (cpus == 0) cpus = online_cpus();

  if (uint64_t max = conntrack_max_for(s, cpus); max > 0) {
    if (auto st = w.set("nf_conntrack_max", max); !st) return Error{st.error()};
    // The hash table: raised to max/4 when smaller, never lowered. Reading it first also keeps
    // a namespace where it is already large enough from failing (only the host's network
    // namespace may write it).
    std::string path = sys_module + kHashsize;
    auto hashsize = read_number(path);
    if (!hashsize)
      return Error{"conntrack: hashsize for nf_conntrack_max=" + std::to_string(max) + ": " +
                   hashsize.error()};
    uint64_t want = max / 4;
    if (*hashsize < want) {
      int err = read_only_fs(path) ? EROFS : write_number(path, want);
      if (err == EROFS) {
        out.read_only_sys = "conntrack: " + sys_module +
                            " is on a read-only file system: cannot raise the hash table (" + path +
                            ") from " + std::to_string(*hashsize) + " to " + std::to_string(want) +
                            " for nf_conntrack_max=" + std::to_string(max) +
                            "; mount /sys read-write";
        spdlog::warn("{}", out.read_only_sys);
      } else if (err != 0) {
        return Error{"conntrack: cannot set hashsize=" + std::to_string(want) + ": write " + path +
                     ": " + errno_text(err)};
      } else {
        spdlog::info("conntrack: set hashsize={} (was {}) in {}", want, *hashsize, path);
        w.written.push_back("hashsize=" + std::to_string(want));
      }
    }
  }

  auto seconds = [](const std::optional<std::chrono::seconds>& d) -> uint64_t {
    return d && d->count() > 0 ? static_cast<uint64_t>(d->count()) : 0;
  };
  struct Timeout {
    const char* name;
    uint64_t value;
  };
  const Timeout settings[] = {
      {"nf_conntrack_tcp_timeout_established", seconds(s.tcp_established_timeout)},
      {"nf_conntrack_tcp_timeout_close_wait", seconds(s.tcp_close_wait_timeout)},
      {"nf_conntrack_tcp_be_liberal", s.tcp_be_liberal ? 1u : 0u},
      {"nf_conntrack_udp_timeout", seconds(s.udp_timeout)},
      {"nf_conntrack_udp_timeout_stream", seconds(s.udp_stream_timeout)},
  };
  for (const auto& t : settings) {
    if (t.value == 0) continue;
    if (auto st = w.set(t.name, t.value); !st) return Error{st.error()};
  }
  out.written = std::move(w.written);
  return out;
}

}  // namespace endpointd::proxy
