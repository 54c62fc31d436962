// The Kubernetes watch wire format: newline-delimited JSON events in a streamed response body,
// and the Status objects the API server answers errors with. No I/O here, so the parsing is
// tested (and fuzzed) on bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "model/event.h"
#include "model/result.h"
#include "watcher/decode.h"

namespace simdjson::dom {
class parser;
}

namespace endpointd::watcher {

// Reassembles lines from a body that arrives in arbitrary pieces. A line that is still
// incomplete when the stream ends is simply never delivered.
class LineBuffer {
 public:
  explicit LineBuffer(size_t max_line) : max_line_(max_line) {}
  // Calls on_line for each complete non-empty line (without the newline); stops early when
  // on_line returns false. Returns false when on_line asked to stop or when an incomplete
  // line grew beyond max_line (the stream cannot be trusted any more).
  bool feed(std::string_view data, const std::function<bool(std::string_view)>& on_line);
  void clear() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

 private:
  size_t max_line_;
  std::string pending_;
};

// A Kubernetes Status object (error responses, ERROR watch events).
struct ApiStatus {
  int64_t code = 0;
  std::string reason;
  std::string message;
  // 410 Gone / reason Expired / "too old resource version": the client must relist.
  bool expired() const;
};
// Reads a Status out of an error response body; an empty Status when the body is not one.
ApiStatus parse_status(std::string_view body, simdjson::dom::parser& parser);

enum class WatchEventType : uint8_t { kAdded, kModified, kDeleted, kBookmark, kError };
std::string_view to_string(WatchEventType t);

struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  // object.metadata.resourceVersion, read without decoding the object, so a malformed object
  // still advances the watch position.
  std::string resource_version;
  // metadata.namespace / metadata.name as read from the JSON (for removals and log lines).
  model::ObjectKey key;
  // ADDED / MODIFIED / DELETED: the decoded object, or why it could not be decoded.
  std::optional<model::Object> object;
  std::string decode_error;
  // ERROR: the Status.
  ApiStatus status;
  // BOOKMARK: annotated "k8s.io/initial-events-end": "true", the end of the state a watch with
  // sendInitialEvents=true (WatchList) began with; the bookmark's resourceVersion is that
  // state's.
  bool initial_events_end = false;
};

// Parses one line of a watch stream. An error means the line is not a watch event at all
// (bad JSON, no type, unknown type); a malformed *object* is reported in decode_error.
Result<WatchEvent> parse_watch_event(std::string_view line, model::ObjectKind kind,
                                     simdjson::dom::parser& parser);

}  // namespace endpointd::watcher
