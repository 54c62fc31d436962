// JSON string literals, for the JSON endpointd writes by hand (/debug/state, logs, drain
// reports, health check answers, YAML converted to JSON).
#pragma once

#include <string>
#include <string_view>

namespace endpointd::model {

// Appends `s` to `out` as a JSON string literal (quotes, backslashes and control characters
// escaped).
void append_json_string(std::string& out, std::string_view s);

// `s` as a JSON string literal.
inline std::string json_string(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

}  // namespace endpointd::model
