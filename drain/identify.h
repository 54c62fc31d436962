// Who is calling the prestop socket: the kernel's answer (SO_PEERCRED → pid → the pid's
// network namespace addresses and cgroup), never anything the caller sends.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "model/ip.h"
#include "model/result.h"
#include "model/snapshot.h"

namespace endpointd::drain {

struct Caller {
  pid_t pid = 0;
  uid_t uid = 0;
  std::vector<model::IpAddr> addresses;  // local addresses of its network namespace, no loopback
  std::string pod_uid;                   // from its cgroup path, empty when none is there
  bool host_netns = false;               // shares the agent's network namespace
  std::string describe() const;
};

// The pid at the other end of a connected unix socket.
Result<Caller> caller_of_socket(int fd);
// Reads the pid's addresses and cgroup from `proc` ("/proc").
Caller describe_pid(pid_t pid, const std::string& proc = "/proc");

// Parsers of /proc text, exposed for tests.
std::vector<model::IpAddr> parse_fib_trie_local(const std::string& text);
std::vector<model::IpAddr> parse_if_inet6(const std::string& text);
std::string pod_uid_from_cgroup(const std::string& text);

// The pod on `node` that the caller is: by cgroup pod UID when there is one, else by a
// network-namespace address equal to a pod IP (host-network pods are matched by UID only).
// An error saying why when none is (never a null pod).
Result<const model::Pod*> match_pod(const model::Snapshot& snap, const std::string& node,
                                    const Caller& c);

}  // namespace endpointd::drain
