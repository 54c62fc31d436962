// Timestamps as the Kubernetes API writes them. Parsing only: model/ reads no clock.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace endpointd::model {

// "2006-01-02T15:04:05Z" (RFC 3339; fractions and "+07:00" offsets accepted). nullopt when the
// text is not such a time.
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(const std::string& s);

// A duration as Kubernetes configuration writes it (Go's "24h0m0s", "1h", "1m30s", "300ms",
// "0s"), or a bare number of seconds. Fractions of a second are dropped. nullopt when the text
// is neither, or negative.
std::optional<std::chrono::seconds> parse_go_duration(const std::string& s);

// Go's time.String() layout, "2006-01-02 15:04:05.999999999 +0000 UTC", always in UTC: what
// kube-proxy's /healthz and /livez bodies carry, so that scripts reading them keep working.
std::string go_time_string(std::chrono::system_clock::time_point t);

}  // namespace endpointd::model
