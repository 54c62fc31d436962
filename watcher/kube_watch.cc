// Watch stream framing and event parsing.
#include "watcher/kube_watch.h"

#include <simdjson.h>

namespace endpointd::watcher {

namespace {

std::string_view string_field(const simdjson::dom::element& e, std::string_view key) {
  std::string_view out;
  if (e[key].get(out) != simdjson::SUCCESS) return {};
  return out;
}

}  // namespace

bool LineBuffer::feed(std::string_view data, const std::function<bool(std::string_view)>& on_line) {
  while (!data.empty()) {
    auto nl = data.find('\n');
    if (nl == std::string_view::npos) {
      if (pending_.size() + data.size() > max_line_) {
        pending_.clear();
        return false;
      }
      pending_.append(data);
      return true;
    }
    std::string_view line;
    if (pending_.empty()) {
      line = data.substr(0, nl);
    } else {
      if (pending_.size() + nl > max_line_) {
        pending_.clear();
        return false;
      }
      pending_.append(data.substr(0, nl));
      line = pending_;
    }
    data.remove_prefix(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    bool keep_going = line.find_first_not_of(" \t") == std::string_view::npos || on_line(line);
    pending_.clear();  // `line` may point into pending_: clear only after on_line
    if (!keep_going) return false;
  }
  return true;
}

bool ApiStatus::expired() const {
  return code == 410 || reason == "Expired" || reason == "Gone" ||
         message.find("too old resource version") != std::string::npos;
}

namespace {

ApiStatus status_from(const simdjson::dom::element& obj) {
  ApiStatus st;
  int64_t code = 0;
  if (obj["code"].get(code) == simdjson::SUCCESS) st.code = code;
  st.reason = std::string(string_field(obj, "reason"));
  st.message = std::string(string_field(obj, "message"));
  return st;
}

}  // namespace

ApiStatus parse_status(std::string_view body, simdjson::dom::parser& parser) {
  if (auto pb = decode_status_protobuf(body)) {
    ApiStatus st;
    st.code = pb->code;
    st.reason = std::move(pb->reason);
    st.message = std::move(pb->message);
    return st;
  }
  simdjson::dom::element root;
  if (parser.parse(body.data(), body.size(), true).get(root) != simdjson::SUCCESS) return {};
  if (!root.is_object()) return {};
  return status_from(root);
}

std::string_view to_string(WatchEventType t) {
  switch (t) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
    case WatchEventType::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

Result<WatchEvent> parse_watch_event(std::string_view line, model::ObjectKind kind,
                                     simdjson::dom::parser& parser) {
  if (line.size() > kMaxObjectBytes + 4096) return Error{"watch event too large"};
  simdjson::dom::element root;
  if (auto err = parser.parse(line.data(), line.size(), true).get(root); err != simdjson::SUCCESS) {
    return Error{std::string("watch event is not valid JSON: ") + simdjson::error_message(err)};
  }
  std::string_view type;
  if (root["type"].get(type) != simdjson::SUCCESS) return Error{"watch event has no type"};
  simdjson::dom::element obj;
  if (root["object"].get(obj) != simdjson::SUCCESS || !obj.is_object()) {
    return Error{"watch event has no object"};
  }
  WatchEvent ev;
  if (type == "ADDED") {
    ev.type = WatchEventType::kAdded;
  } else if (type == "MODIFIED") {
    ev.type = WatchEventType::kModified;
  } else if (type == "DELETED") {
    ev.type = WatchEventType::kDeleted;
  } else if (type == "BOOKMARK") {
    ev.type = WatchEventType::kBookmark;
  } else if (type == "ERROR") {
    ev.type = WatchEventType::kError;
    ev.status = status_from(obj);
    return ev;
  } else {
    return Error{"watch event has unknown type '" + std::string(type) + "'"};
  }
  simdjson::dom::element meta;
  if (obj["metadata"].get(meta) == simdjson::SUCCESS && meta.is_object()) {
    ev.resource_version = std::string(string_field(meta, "resourceVersion"));
    ev.key.ns = std::string(string_field(meta, "namespace"));
    ev.key.name = std::string(string_field(meta, "name"));
  }
  if (ev.type == WatchEventType::kBookmark) {
    if (ev.resource_version.empty()) return Error{"BOOKMARK without metadata.resourceVersion"};
    simdjson::dom::element annotations;
    if (meta["annotations"].get(annotations) == simdjson::SUCCESS && annotations.is_object())
      ev.initial_events_end = string_field(annotations, "k8s.io/initial-events-end") == "true";
    return ev;
  }
  if (kind == model::ObjectKind::kNode) ev.key.ns.clear();
  auto decoded = decode_object(obj, kind);
  if (decoded) {
    ev.object = std::move(decoded->object);
  } else {
    ev.decode_error = decoded.error();
  }
  return ev;
}

}  // namespace endpointd::watcher
