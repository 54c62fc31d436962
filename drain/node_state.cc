// The node's drain state file (drain/node_state.h): its text, and the file shared by the
// coordinator and the daemon.
#include "drain/node_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

namespace endpointd::drain {

namespace {

constexpr std::string_view kHeader = "endpointd-drain-state 1";

bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > 253) return false;
  for (unsigned char c : n)
    if (c <= ' ' || c >= 0x7f) return false;
  return true;
}

template <typename T>
bool parse_number(std::string_view s, T* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

int64_t unix_ms(WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

}  // namespace

std::string encode_node_state(const NodeState& s) {
  std::string out(kHeader);
  out += '\n';
  for (const auto& a : s.agents) out += "agent " + a + "\n";
  for (const auto& [name, address] : s.members)
    out += "member " + name + " " + (address.empty() ? std::string("-") : address) + "\n";
  for (const auto& h : s.dns_ttls) {
    out += "dns-ttl " + std::to_string(h.ttl_s) + " ";
    out += h.until == WallClock::time_point::max() ? std::string("running")
                                                   : std::to_string(unix_ms(h.until));
    out += '\n';
  }
  return out;
}

Result<NodeState> decode_node_state(const std::string& text) {
  if (text.size() > kNodeStateMaxBytes)
    return Error{"is " + std::to_string(text.size()) + " bytes, over the 4 MiB bound"};
  NodeState s;
  std::istringstream in(text);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::string_view l = line;
    auto bad = [&](const std::string& why) {
      return Error{"line " + std::to_string(n) + ": " + why};
    };
    if (n == 1) {
      if (l != kHeader)
        return bad("not an endpointd drain state file (want \"" + std::string(kHeader) + "\")");
      continue;
    }
    if (l.empty()) continue;
    if (l.starts_with("agent ")) {
      std::string_view name = l.substr(6);
      if (!valid_name(name)) return bad("\"" + std::string(name) + "\" is not a node name");
      if (s.agents.size() >= kNodeStateMaxAgents)
        return bad("more than " + std::to_string(kNodeStateMaxAgents) + " agents");
      s.agents.emplace(name);
    } else if (l.starts_with("member ")) {
      std::string_view rest = l.substr(7);
      auto sp = rest.find(' ');
      if (sp == std::string_view::npos) return bad("member wants a name and an address");
      std::string_view name = rest.substr(0, sp), address = rest.substr(sp + 1);
      if (!valid_name(name) || !valid_name(address))
        return bad("member \"" + std::string(rest.substr(0, 80)) + "\" is not a name and address");
      if (s.members.size() >= kNodeStateMaxAgents)
        return bad("more than " + std::to_string(kNodeStateMaxAgents) + " members");
      s.members[std::string(name)] = address == "-" ? std::string() : std::string(address);
    } else if (l.starts_with("dns-ttl ")) {
      std::string_view rest = l.substr(8);
      auto sp = rest.find(' ');
      if (sp == std::string_view::npos) return bad("dns-ttl wants a TTL and an expiry");
      TtlHold h;
      if (!parse_number(rest.substr(0, sp), &h.ttl_s) || h.ttl_s > 86400)
        return bad("dns-ttl \"" + std::string(rest.substr(0, sp)) + "\" is not 0..86400 seconds");
      std::string_view until = rest.substr(sp + 1);
      if (until != "running") {
        int64_t ms = 0;
        if (!parse_number(until, &ms) || ms < 0)
          return bad("dns-ttl expiry \"" + std::string(until) + "\" is not unix milliseconds");
        h.until = WallClock::time_point(std::chrono::milliseconds(ms));
      }
      if (s.dns_ttls.size() >= kNodeStateMaxTtls)
        return bad("more than " + std::to_string(kNodeStateMaxTtls) + " dns-ttl lines");
      s.dns_ttls.push_back(h);
    } else {
      return bad("unknown line \"" + std::string(l.substr(0, 40)) + "\"");
    }
  }
  if (n == 0) return Error{"is empty"};
  return s;
}

std::vector<TtlHold> inherited_ttls(const NodeState& loaded, WallClock::time_point now) {
  std::vector<TtlHold> out;
  for (auto h : loaded.dns_ttls) {
    // The process that wrote "running" gave answers up to its last moment, at most now.
    if (h.until == WallClock::time_point::max()) h.until = now + std::chrono::seconds(h.ttl_s);
    if (h.until > now && h.ttl_s > 0) out.push_back(h);
  }
  return out;
}

NodeStateFile::NodeStateFile(std::string path, WallClock::time_point now) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::ifstream in(path_);
  if (!in) {
    if (errno != ENOENT) load_error_ = path_ + ": " + std::strerror(errno);
    return;
  }
  std::string text;
  text.resize(kNodeStateMaxBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  auto s = decode_node_state(text);
  if (!s) {
    load_error_ = path_ + ": " + s.error();
    return;
  }
  loaded_ = std::move(*s);
  loaded_.dns_ttls = inherited_ttls(loaded_, now);
  state_ = loaded_;
}

NodeState NodeStateFile::loaded() const {
  std::lock_guard lk(mu_);
  return loaded_;
}

uint64_t NodeStateFile::write_errors() const {
  std::lock_guard lk(mu_);
  return write_errors_;
}

Status NodeStateFile::add_agents(const std::set<std::string>& seen) {
  std::lock_guard lk(mu_);
  bool grew = false;
  std::string refused;
  for (const auto& a : seen) {
    if (state_.agents.count(a) || !valid_name(a)) continue;
    if (state_.agents.size() >= kNodeStateMaxAgents) {
      refused = a;
      continue;
    }
    state_.agents.insert(a);
    grew = true;
  }
  Status st = grew ? write_locked() : Status{};
  if (!refused.empty())
    return Error{path_ + ": more than " + std::to_string(kNodeStateMaxAgents) + " agents; node " +
                 refused + " is not kept across a restart"};
  return st;
}

Status NodeStateFile::set_members(const std::map<std::string, std::string>& members) {
  std::lock_guard lk(mu_);
  if (members == state_.members) return {};
  if (members.size() > kNodeStateMaxAgents)
    return Error{path_ + ": more than " + std::to_string(kNodeStateMaxAgents) +
                 " members; not kept across a restart"};
  state_.members = members;
  return write_locked();
}

Status NodeStateFile::set_dns_ttl(uint32_t ttl_s, WallClock::time_point now) {
  std::lock_guard lk(mu_);
  std::vector<TtlHold> keep;
  for (auto h : state_.dns_ttls) {
    // The TTL in force until now is held one TTL from now; expired holds go.
    if (h.until == WallClock::time_point::max()) {
      if (have_running_ && h.ttl_s == ttl_s) continue;
      h.until = now + std::chrono::seconds(h.ttl_s);
    }
    if (h.until > now && h.ttl_s > ttl_s) keep.push_back(h);
  }
  // Bounded: the longest holds are the ones that matter.
  std::sort(keep.begin(), keep.end(),
            [](const TtlHold& a, const TtlHold& b) { return a.ttl_s > b.ttl_s; });
  if (keep.size() > kNodeStateMaxTtls - 1) keep.resize(kNodeStateMaxTtls - 1);
  keep.push_back({ttl_s, WallClock::time_point::max()});
  have_running_ = true;
  state_.dns_ttls = std::move(keep);
  return write_locked();
}

Status NodeStateFile::write_locked() {
  if (path_.empty()) return {};
  std::string text = encode_node_state(state_);
  std::string tmp = path_ + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  auto fail = [&](const std::string& what) -> Status {
    ++write_errors_;
    return Error{path_ + ": " + what + ": " + std::strerror(errno)};
  };
  if (fd < 0) return fail("cannot create " + tmp);
  size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return fail("write");
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return fail("fsync");
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) return fail("rename");
  return {};
}

}  // namespace endpointd::drain
