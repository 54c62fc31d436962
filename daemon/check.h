// `endpointd check`: the preflight a user runs on a node before swapping kube-proxy out, with
// the same flags (and --config) as `endpointd run`. One line per check, ok / FAIL / skip, and
// what to do about a failure: nftables (a scratch table made and deleted in the current network
// namespace), conntrack, sysctls, the API server and the RBAC verbs the agent needs
// (SelfSubjectAccessReview), the drain socket's directory, clock skew against the API's Date.
#pragma once

#include <chrono>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "model/result.h"

namespace CLI {
class App;
}

namespace endpointd::daemon {

struct CheckLine {
  enum class State { kOk, kFail, kSkip };
  State state = State::kOk;
  std::string name;    // "nftables", "rbac list services", …
  std::string detail;  // what was found
  std::string fix;     // with kFail: what to do
};

// What the checks touch, injectable for tests.
struct CheckEnv {
  // Makes and deletes a scratch nftables table named so in the caller's network namespace.
  std::function<Status(const std::string& table)> nft_scratch;
  // Opens (and closes) the ctnetlink event socket the drain's late-sender watch reads; unset:
  // not checked.
  std::function<Status()> conntrack_events;
  std::string proc_sys = "/proc/sys";
  std::function<std::chrono::system_clock::time_point()> now;
  std::chrono::seconds max_clock_skew{5};
};
CheckEnv default_check_env();

// The resources the agent lists and watches with this configuration, as (group, resource).
std::vector<std::pair<std::string, std::string>> watched_resources(const Config& cfg);

std::vector<CheckLine> run_checks(const Config& cfg, const CheckEnv& env);
std::string render_checks(const std::vector<CheckLine>& lines, bool colour);

// The netlink scratch-table probe: creates table `ip <name>` with a nat base chain (the hooks
// endpointd's table uses), then deletes it.
Status nft_scratch_table(const std::string& name);

// `endpointd check` with the run flags on `cmd`: 0 when every check passed, 1 on any failure,
// 2 when the flags themselves are wrong.
int check_main(CLI::App& cmd, std::chrono::seconds max_skew, std::ostream& out, std::ostream& err);

}  // namespace endpointd::daemon
