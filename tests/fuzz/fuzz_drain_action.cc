// libFuzzer target: the drain action's syntax (a pod annotation, the prestop client's flag and
// the server's "drain <ms left> <spec>" line all end here) and the prestop client's durations.
// An action that parses must be one the runner can take as it is.
#include <cstdint>
#include <string>
#include <string_view>

#include "drain/action.h"
#include "drain/coordinator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);  // fuzzer bytes as text
  using endpointd::drain::DrainAction;
  auto a = endpointd::drain::parse_drain_action(in);
  if (a) {
    if (a->spec != in) __builtin_trap();
    switch (a->kind) {
      case DrainAction::Kind::kExec:
        if (a->argv.empty()) __builtin_trap();
        for (const auto& w : a->argv)
          if (w.empty() || w.find_first_of(" \t") != std::string::npos) __builtin_trap();
        break;
      case DrainAction::Kind::kSignal:
        if (a->signal <= 0) __builtin_trap();
        if (endpointd::drain::signal_name(a->signal).rfind("SIG", 0) != 0) __builtin_trap();
        if (!a->pidfile.empty() && a->pidfile[0] != '/') __builtin_trap();
        break;
      case DrainAction::Kind::kHttp:
        if (a->url.rfind("http://", 0) != 0 && a->url.rfind("https://", 0) != 0) __builtin_trap();
        break;
    }
  }
  if (size <= 64) (void)endpointd::drain::parse_duration(std::string(in));
  return 0;
}
