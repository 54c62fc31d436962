// Caller identification from /proc. The addresses come from the caller's own network
// namespace as the kernel shows it through /proc/<pid>/net, which follows the pid's namespace.
#include "drain/identify.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

namespace endpointd::drain {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::optional<ino_t> inode_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return st.st_ino;
}

bool is_hex(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

std::string Caller::describe() const {
  std::string a;
  for (const auto& ip : addresses) a += (a.empty() ? "" : ",") + ip.str();
  return "pid " + std::to_string(pid) + " (uid " + std::to_string(uid) + ", addresses [" + a + "]" +
         (host_netns ? ", host network namespace" : "") +
         (pod_uid.empty() ? "" : ", cgroup pod " + pod_uid) + ")";
}

std::vector<model::IpAddr> parse_fib_trie_local(const std::string& text) {
  // "   |-- 10.244.1.10\n      /32 host LOCAL": the address line precedes its LOCAL leaf.
  std::vector<model::IpAddr> out;
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line)) {
    auto pos = line.find("|-- ");
    if (pos != std::string::npos) {
      last = line.substr(pos + 4);
      while (!last.empty() && std::isspace(static_cast<unsigned char>(last.back())))
        last.pop_back();
      continue;
    }
    if (line.find("/32 host LOCAL") != std::string::npos && !last.empty()) {
      auto ip = model::IpAddr::parse(last);
      if (ip && !ip->is_loopback() && std::find(out.begin(), out.end(), *ip) == out.end())
        out.push_back(*ip);
    }
  }
  return out;
}

std::vector<model::IpAddr> parse_if_inet6(const std::string& text) {
  // "fd000000000000000000000000000001 02 40 00 80 eth0": 32 hex digits, index, prefix, scope.
  std::vector<model::IpAddr> out;
  std::istringstream in(text);
  std::string hex, idx, plen, scope;
  std::string rest;
  while (in >> hex >> idx >> plen >> scope) {
    std::getline(in, rest);
    if (hex.size() != 32) continue;
    if (scope != "00") continue;  // global only: not link-local, not host
    uint8_t b[16];
    bool ok = true;
    for (int i = 0; i < 16 && ok; ++i) {
      if (!is_hex(hex[2 * i]) || !is_hex(hex[2 * i + 1]))
        ok = false;
      else
        b[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    }
    if (!ok) continue;
    auto ip = model::IpAddr::from_bytes(model::IpFamily::kV6, b);
    if (!ip.is_loopback()) out.push_back(ip);
  }
  return out;
}

std::string pod_uid_from_cgroup(const std::string& text) {
  // cgroupfs: ".../kubepods/burstable/pod<uid>/<container>"; systemd:
  // ".../kubepods-burstable-pod<uid with _>.slice/...".
  size_t pos = 0;
  while ((pos = text.find("pod", pos)) != std::string::npos) {
    pos += 3;
    if (text.size() < pos + 36) break;
    std::string cand = text.substr(pos, 36);
    bool ok = true;
    for (size_t i = 0; i < 36 && ok; ++i) {
      char c = cand[i];
      if (i == 8 || i == 13 || i == 18 || i == 23) {
        if (c != '-' && c != '_') ok = false;
        cand[i] = '-';
      } else if (!is_hex(c)) {
        ok = false;
      }
    }
    if (ok) return cand;
  }
  return {};
}

Caller describe_pid(pid_t pid, const std::string& proc) {
  Caller c;
  c.pid = pid;
  std::string base = proc + "/" + std::to_string(pid);
  c.addresses = parse_fib_trie_local(read_file(base + "/net/fib_trie"));
  for (auto& a : parse_if_inet6(read_file(base + "/net/if_inet6"))) c.addresses.push_back(a);
  c.pod_uid = pod_uid_from_cgroup(read_file(base + "/cgroup"));
  auto mine = inode_of(proc + "/self/ns/net");
  auto theirs = inode_of(base + "/ns/net");
  c.host_netns = mine && theirs && *mine == *theirs;
  return c;
}

Result<Caller> caller_of_socket(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0)
    return Error{"no peer credentials on the connection"};
  Caller c = describe_pid(cred.pid);
  c.uid = cred.uid;
  return c;
}

Result<const model::Pod*> match_pod(const model::Snapshot& snap, const std::string& node,
                                    const Caller& c) {
  if (!c.pod_uid.empty()) {
    for (const auto& p : snap.pods) {
      if (p->uid != c.pod_uid) continue;
      if (p->node_name != node) {
        return Error{"caller " + c.describe() + " is pod " + p->key.str() + " of node " +
                     p->node_name + ", not of node " + node};
      }
      return p.get();
    }
  }
  if (!c.host_netns) {
    for (const auto& a : c.addresses)
      if (const model::Pod* p = snap.find_node_pod(node, a)) return p;
  }
  return Error{"caller " + c.describe() + " is not a pod on node " + node +
               (c.host_netns ? ": it runs in the node's own network namespace"
                             : ": no pod of this node has its addresses")};
}

}  // namespace endpointd::drain
