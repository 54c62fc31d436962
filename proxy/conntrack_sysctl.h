// kube-proxy's conntrack settings (KubeProxyConfiguration `conntrack`), written to /proc/sys and
// /sys/module the way kube-proxy writes them, so endpointd can replace it on a node unchanged.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/result.h"

namespace endpointd::proxy {

// Each setting left unset (or zero) is not touched, as in kube-proxy.
struct ConntrackSysctls {
  // nf_conntrack_max = max(max_per_core * CPUs, min), set only when max_per_core > 0; `min`
  // alone does nothing (kube-proxy's getConntrackMax).
  std::optional<uint32_t> max_per_core;
  std::optional<uint32_t> min;
  std::optional<std::chrono::seconds> tcp_established_timeout;
  std::optional<std::chrono::seconds> tcp_close_wait_timeout;
  // true writes nf_conntrack_tcp_be_liberal=1; false leaves the node's value (kube-proxy never
  // writes 0).
  bool tcp_be_liberal = false;
  std::optional<std::chrono::seconds> udp_timeout;
  std::optional<std::chrono::seconds> udp_stream_timeout;
};

struct ConntrackSysctlsApplied {
  // "key=value" for every value written, in the order written. A value already in place is not
  // written (and not listed).
  std::vector<std::string> written;
  // Non-empty when the hash table had to grow but /sys is mounted read-only: nf_conntrack_max
  // and the other settings were still applied. kube-proxy reports this as an event and carries
  // on; the caller logs it (it is logged here as a warning too).
  std::string read_only_sys;
};

// Applies `settings` (kube-proxy's setupConntrack):
//  - nf_conntrack_max (proc_sys/net/netfilter/nf_conntrack_max) is set to the computed value
//    when it differs, raised or lowered; then, if sys_module/nf_conntrack/parameters/hashsize is
//    below max/4, it is raised to max/4 (unless the file system is read-only: see above);
//  - the timeouts and tcp_be_liberal under net/netfilter, each written when it differs.
// `cpus` 0: the online CPUs of the host. Each value written is logged. An error names the
// setting and the file that could not be read or written, and stops there.
// nf_conntrack_max and hashsize can be set only from the host's network namespace; the timeouts
// are per network namespace.
Result<ConntrackSysctlsApplied> apply_conntrack_sysctls(
    const ConntrackSysctls& settings, const std::string& proc_sys = "/proc/sys",
    const std::string& sys_module = "/sys/module", unsigned cpus = 0);

// kube-proxy's nf_conntrack_max for `settings` on `cpus` CPUs; 0 when it leaves it alone.
uint64_t conntrack_max_for(const ConntrackSysctls& settings, unsigned cpus);

}  // namespace endpointd::proxy
