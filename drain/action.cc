// The drain action's syntax (pure); running it is action_run.cc, in the prestop client.
#include "drain/action.h"

#include <csignal>

namespace endpointd::drain {

namespace {

constexpr size_t kMaxSpec = 4096;

struct SignalName {
  const char* name;
  int number;
};
constexpr SignalName kSignals[] = {{"TERM", SIGTERM},  {"QUIT", SIGQUIT}, {"INT", SIGINT},
                                   {"HUP", SIGHUP},    {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
                                   {"WINCH", SIGWINCH}};

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ' ' || c == '\t') {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace

std::string signal_name(int sig) {
  for (const auto& s : kSignals)
    if (s.number == sig) return std::string("SIG") + s.name;
  return std::to_string(sig);
}

Result<DrainAction> parse_drain_action(std::string_view spec) {
  auto bad = [&](const std::string& why) -> Result<DrainAction> {
    return Error{"drain action \"" + std::string(spec.substr(0, 200)) + "\": " + why};
  };
  if (spec.size() > kMaxSpec) return bad("longer than " + std::to_string(kMaxSpec) + " bytes");
  for (char c : spec)
    if (c == '\n' || c == '\r' || c == '\0') return bad("holds a line break or NUL");
  DrainAction a;
  a.spec = std::string(spec);
  auto colon = spec.find(':');
  if (colon == std::string_view::npos)
    return bad("expected exec:COMMAND, signal:NAME[:PIDFILE] or http:URL");
  std::string_view kind = spec.substr(0, colon), rest = spec.substr(colon + 1);
  if (kind == "exec") {
    a.kind = DrainAction::Kind::kExec;
    a.argv = split_words(rest);
    if (a.argv.empty()) return bad("no command after exec:");
    return a;
  }
  if (kind == "signal") {
    a.kind = DrainAction::Kind::kSignal;
    auto c2 = rest.find(':');
    std::string name(rest.substr(0, c2));
    if (c2 != std::string_view::npos) {
      a.pidfile = std::string(rest.substr(c2 + 1));
      if (a.pidfile.empty() || a.pidfile[0] != '/')
        return bad("the pidfile must be an absolute path");
    }
    if (name.rfind("SIG", 0) == 0) name = name.substr(3);
    for (const auto& s : kSignals)
      if (name == s.name) a.signal = s.number;
    if (a.signal == 0)
      return bad("unknown signal \"" + name + "\" (TERM, QUIT, INT, HUP, USR1, USR2, WINCH)");
    return a;
  }
  if (kind == "http") {
    a.kind = DrainAction::Kind::kHttp;
    a.url = std::string(rest);
    if (a.url.rfind("http://", 0) != 0 && a.url.rfind("https://", 0) != 0)
      return bad("the URL must start with http:// or https://");
    return a;
  }
  return bad("unknown kind \"" + std::string(kind.substr(0, 32)) +
             "\" (exec:COMMAND, signal:NAME[:PIDFILE] or http:URL)");
}

}  // namespace endpointd::drain
