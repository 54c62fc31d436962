// The drain action: what tells the application to drain its own connections once its endpoint
// is removed everywhere (stage 2) and before stage 3 waits for conntrack to empty. Chosen by
// the prestop client's --drain-action flag or the pod's endpointd.io/drain-action annotation,
// run by the prestop client inside the container (its processes, files and loopback):
//
//   exec:nginx -s quit                 a command, words split on spaces (no shell)
//   signal:QUIT                        a signal to the container's main process (PID 1)
//   signal:QUIT:/run/nginx.pid         a signal to the process a pidfile names
//   http:http://127.0.0.1:9901/drain_listeners?graceful
//                                      an HTTP POST (a 2xx answer is success)
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "model/result.h"

namespace endpointd::drain {

// The pod annotation naming the drain action (the client's flag wins).
inline constexpr const char* kDrainActionAnnotation = "endpointd.io/drain-action";

struct DrainAction {
  enum class Kind { kExec, kSignal, kHttp };
  Kind kind = Kind::kExec;
  std::vector<std::string> argv;  // exec
  int signal = 0;                 // signal
  std::string pidfile;            // signal: empty is PID 1
  std::string url;                // http
  std::string spec;               // as written
};

// "SIGQUIT" for SIGQUIT; the number for a signal without a name here.
std::string signal_name(int sig);

// Parses a drain action; the error names what was wrong with it.
Result<DrainAction> parse_drain_action(std::string_view spec);

// Runs it, bounded by `timeout`: an exec is killed when it runs over. Returns what happened
// ("exit 0 after 12 ms", "SIGQUIT sent to pid 1", "HTTP 200") or the error.
Result<std::string> run_drain_action(const DrainAction& action, std::chrono::milliseconds timeout);

}  // namespace endpointd::drain
