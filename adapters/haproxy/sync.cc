// One read → diff → write → read-back pass over every mapped backend.
#include "adapters/haproxy/sync.h"

#include <spdlog/spdlog.h>

#include <optional>
#include <string_view>

namespace endpointd::haproxy {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// HAProxy answers `set server` with nothing when it worked, `add server` and `del server` with
// a sentence (management.txt; the texts of HAProxy 2.6).
bool succeeded(const Action& a, std::string_view answer) {
  std::string_view t = trim(answer);
  switch (a.kind) {
    case Action::Kind::kAdd:
      return t == "New server registered.";
    case Action::Kind::kDelete:
      return t == "Server deleted.";
    case Action::Kind::kSetAddr:
    case Action::Kind::kSetState:
      return t.empty() || t.find("changed from") != std::string_view::npos;
  }
  return false;
}

// `del server` refused because sessions, idle connections or queued requests remain:
// expected while a removed endpoint's connections finish; the next pass tries again.
bool still_busy(std::string_view answer) {
  return answer.find("still has connections") != std::string_view::npos;
}

}  // namespace

SyncReport Syncer::sync(const Desired& desired) {
  SyncReport rep;
  bool all = true;
  auto error = [&](const std::string& message) {
    ++rep.errors;
    if (rep.first_error.empty()) rep.first_error = message;
    spdlog::error("{}", message);
  };
  // A backend's servers; no rows (after logging why) when HAProxy did not answer or the
  // answer is not a server list ("Can't find backend.").
  struct Read {
    bool answered = false;
    std::optional<std::vector<ServerRow>> rows;
  };
  auto read = [&](const std::string& backend) {
    const std::string cmd = "show servers state " + backend;
    Read out;
    auto answer = api_.call(cmd);
    if (!answer) {
      error(answer.error());
      return out;
    }
    out.answered = true;
    auto rows = parse_servers_state(*answer);
    if (!rows) {
      error(api_.describe() + ": `" + cmd + "`: " + rows.error());
      return out;
    }
    out.rows = std::move(*rows);
    return out;
  };

  for (const auto& [backend, want] : desired.backends) {
    Read r = read(backend);
    if (!r.answered) return rep;  // not applied
    if (!r.rows) {
      all = false;
      continue;
    }
    Assessment a = assess(want, *r.rows, id_base_);

    std::set<std::string> now(a.collisions.begin(), a.collisions.end());
    auto& before = collisions_[backend];
    for (const auto& name : now) {
      if (before.count(name)) continue;
      ++rep.new_collisions;
      const auto& s = want.at(name);
      spdlog::error(
          "backend {}: server name {} (endpoint {}:{}) is taken by a server the adapter did not "
          "add (declared in haproxy.cfg?); that endpoint is not managed until the name is free",
          backend, name, s.addr, s.port);
    }
    for (const auto& name : before)
      if (!now.count(name)) spdlog::info("backend {}: server name {} is free again", backend, name);
    before = std::move(now);

    if (!a.actions.empty()) {
      for (const auto& act : a.actions) {
        const std::string cmd = command(backend, act);
        auto answer = api_.call(cmd);
        ++rep.commands;
        if (!answer) {
          error(answer.error());
          return rep;
        }
        if (act.kind == Action::Kind::kDelete && still_busy(*answer)) {
          spdlog::debug("{}: `{}`: {}", api_.describe(), cmd, trim(*answer));
          continue;
        }
        if (!succeeded(act, *answer)) {
          error(api_.describe() + ": `" + cmd + "`: HAProxy answered \"" +
                std::string(trim(*answer)) + "\"");
          continue;
        }
        spdlog::info("haproxy: {}", cmd);
      }
      r = read(backend);
      if (!r.answered) return rep;
      if (!r.rows) {
        all = false;
        continue;
      }
      a = assess(want, *r.rows, id_base_);
      if (!a.converged)
        spdlog::warn("backend {}: HAProxy does not show the desired servers yet; will retry",
                     backend);
    }
    rep.collisions += a.collisions.size();
    rep.pending_deletions += a.pending_deletions;
    if (!a.converged) all = false;
  }
  rep.applied = all;
  return rep;
}

}  // namespace endpointd::haproxy
