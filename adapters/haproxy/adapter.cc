// endpointd-haproxy's pure logic: mappings, the folded feed state, desired servers, the diff.
#include "adapters/haproxy/adapter.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "model/ip.h"

namespace endpointd::haproxy {
namespace {

// HAProxy accepts letters, digits and ".-_:" in proxy and server names; the adapter writes
// the names it builds into commands separated by spaces and "/", so it holds backends to that.
bool valid_name(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_' || c == ':';
  });
}

// Ready beats drain beats maint when one address:port shows up twice.
int rank(ServerState s) {
  switch (s) {
    case ServerState::kReady:
      return 2;
    case ServerState::kDrain:
      return 1;
    case ServerState::kMaint:
      return 0;
  }
  return 0;
}

}  // namespace

Result<Mapping> parse_mapping(std::string_view flag) {
  auto bad = [&](const std::string& why) {
    return Error{"--backend " + std::string(flag) + ": " + why +
                 " (expected NAMESPACE/SERVICE:PORT=BACKEND, e.g. demo/web:80=be_web)"};
  };
  size_t eq = flag.rfind('=');
  if (eq == std::string_view::npos) return bad("no '=BACKEND'");
  std::string_view left = flag.substr(0, eq);
  Mapping m;
  m.backend = std::string(flag.substr(eq + 1));
  size_t slash = left.find('/');
  size_t colon = left.rfind(':');
  if (slash == std::string_view::npos) return bad("no NAMESPACE/");
  if (colon == std::string_view::npos || colon < slash) return bad("no ':PORT'");
  m.ns = std::string(left.substr(0, slash));
  m.service = std::string(left.substr(slash + 1, colon - slash - 1));
  std::string_view port = left.substr(colon + 1);
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), m.port);
  if (ec != std::errc() || p != port.data() + port.size() || m.port == 0 || m.port > 65535)
    return bad("the port must be a number from 1 to 65535");
  if (m.ns.empty() || m.service.empty()) return bad("empty namespace or service");
  if (!valid_name(m.backend))
    return bad("the backend name is empty or has characters HAProxy rejects");
  return m;
}

Status check_mappings(const std::vector<Mapping>& mappings) {
  if (mappings.empty()) return Error{"no --backend given: nothing to do"};
  std::set<std::string> seen;
  for (const auto& m : mappings) {
    if (!seen.insert(m.backend).second)
      return Error{"--backend: backend " + m.backend + " is mapped twice"};
  }
  return {};
}

v1::Subscribe subscription(const std::vector<Mapping>& mappings, const std::string& client_name) {
  v1::Subscribe s;
  s.set_client_name(client_name);
  for (const auto& m : mappings) {
    auto* sel = s.add_selectors();
    sel->set_namespace_(m.ns);
    sel->set_name(m.service);
    sel->set_port(m.port);
  }
  return s;
}

void fold(FeedState& state, const v1::WatchResponse& response) {
  if (response.full()) {
    state.services.clear();
    state.complete = true;
  }
  for (const auto& r : response.removed()) state.services.erase({r.namespace_(), r.name()});
  for (const auto& s : response.services()) state.services[{s.namespace_(), s.name()}] = s;
  state.version = response.version();
}

std::string_view to_string(ServerState s) {
  switch (s) {
    case ServerState::kReady:
      return "ready";
    case ServerState::kDrain:
      return "drain";
    case ServerState::kMaint:
      return "maint";
  }
  return "?";
}

std::optional<ServerState> server_state(v1::Routing routing) {
  switch (routing) {
    case v1::ROUTED:
    case v1::ROUTED_FALLBACK:
      return ServerState::kReady;
    case v1::DRAINING:
      return ServerState::kDrain;
    case v1::NOT_ROUTED:
      return ServerState::kMaint;
    default:
      return std::nullopt;
  }
}

std::string server_name(std::string_view canonical_addr, uint32_t port) {
  std::string name(canonical_addr);
  std::replace(name.begin(), name.end(), ':', '-');
  return name + "_" + std::to_string(port);
}

Desired desired(const FeedState& state, const std::vector<Mapping>& mappings) {
  Desired out;
  for (const auto& m : mappings) {
    auto& backend = out.backends[m.backend];
    auto it = state.services.find({m.ns, m.service});
    if (it == state.services.end()) continue;
    for (const auto& port : it->second.ports()) {
      // HAProxy balances TCP; a UDP or SCTP port of the same number is not for it.
      if (port.port() != m.port || port.protocol() != v1::TCP) continue;
      for (const auto& e : port.endpoints()) {
        auto ip = model::IpAddr::parse(e.address());
        auto state = server_state(e.routing());
        if (!ip || e.port() == 0 || e.port() > 65535 || !state) {
          out.skipped.push_back(
              m.ns + "/" + m.service + ":" + std::to_string(m.port) + " endpoint " + e.address() +
              ":" + std::to_string(e.port()) +
              (state ? "" : " (no routing verdict: an agent older than this adapter)"));
          continue;
        }
        DesiredServer s;
        s.addr = ip->str();
        s.port = e.port();
        s.state = *state;
        auto [slot, added] = backend.emplace(server_name(s.addr, s.port), s);
        if (!added && rank(s.state) > rank(slot->second.state)) slot->second.state = s.state;
      }
    }
  }
  return out;
}

ServerState observed_state(uint32_t admin_state) {
  if (admin_state &
      (kAdminForcedMaint | kAdminInheritedMaint | kAdminConfigMaint | kAdminResolutionMaint))
    return ServerState::kMaint;
  if (admin_state & (kAdminForcedDrain | kAdminInheritedDrain)) return ServerState::kDrain;
  return ServerState::kReady;
}

bool owned(const ServerRow& row, uint32_t id_base) {
  return row.forced_id && row.id >= id_base;
}

std::string command(const std::string& backend, const Action& a) {
  const std::string target = backend + "/" + a.server;
  // An IPv6 address goes in brackets so that its port stays separate.
  const bool v6 = a.addr.find(':') != std::string::npos;
  const std::string addr = v6 ? "[" + a.addr + "]" : a.addr;
  switch (a.kind) {
    case Action::Kind::kAdd:
      return "add server " + target + " " + addr + ":" + std::to_string(a.port) + " id " +
             std::to_string(a.id);
    case Action::Kind::kSetAddr:
      return "set server " + target + " addr " + a.addr + " port " + std::to_string(a.port);
    case Action::Kind::kSetState:
      return "set server " + target + " state " + std::string(to_string(a.state));
    case Action::Kind::kDelete:
      return "del server " + target;
  }
  return "";
}

Assessment assess(const DesiredBackend& want, const std::vector<ServerRow>& have,
                  uint32_t id_base) {
  Assessment out;
  out.converged = true;
  std::map<std::string_view, const ServerRow*> by_name;
  std::set<uint32_t> ids;
  for (const auto& r : have) {
    by_name.emplace(r.name, &r);
    ids.insert(r.id);
  }
  uint32_t next_id = id_base;
  auto fresh_id = [&] {
    while (ids.count(next_id)) ++next_id;
    ids.insert(next_id);
    return next_id;
  };

  for (const auto& [name, s] : want) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      out.converged = false;
      out.actions.push_back({Action::Kind::kAdd, name, s.addr, s.port, fresh_id(), {}});
      if (s.state != ServerState::kMaint)
        out.actions.push_back({Action::Kind::kSetState, name, {}, 0, 0, s.state});
      continue;
    }
    const ServerRow& r = *it->second;
    if (!owned(r, id_base)) {
      out.collisions.push_back(name);
      continue;
    }
    if (r.addr != s.addr || r.port != s.port) {
      out.converged = false;
      out.actions.push_back({Action::Kind::kSetAddr, name, s.addr, s.port, 0, {}});
    }
    if (observed_state(r.admin_state) != s.state) {
      out.converged = false;
      out.actions.push_back({Action::Kind::kSetState, name, {}, 0, 0, s.state});
    }
  }

  for (const auto& r : have) {
    if (!owned(r, id_base) || want.count(r.name)) continue;
    if (observed_state(r.admin_state) != ServerState::kMaint) {
      out.converged = false;
      out.actions.push_back({Action::Kind::kSetState, r.name, {}, 0, 0, ServerState::kMaint});
    } else {
      ++out.pending_deletions;
    }
    // Deleted in the same pass when HAProxy allows it; else the next pass tries again.
    out.actions.push_back({Action::Kind::kDelete, r.name, {}, 0, 0, {}});
  }
  return out;
}

}  // namespace endpointd::haproxy
