// Decoding Kubernetes objects (JSON, as the API serves them) into model types. One decoding
// path for everything: the API client and the manifest directory (YAML is converted to JSON
// first) both come through here.
#pragma once

#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/event.h"
#include "model/result.h"

namespace simdjson::dom {
class element;
}

namespace endpointd::watcher {

// Objects larger than this are refused before parsing (the API server's own limit is 1.5 MiB
// per object; a manifest file may hold many).
inline constexpr size_t kMaxObjectBytes = 3 * 1024 * 1024;

struct Decoded {
  model::Object object;
  // Things that did not stop the object from being used: unknown fields, ignored values.
  std::vector<std::string> warnings;
};

// `hint` gives the kind when the JSON has none (items of a typed list response omit it).
// Errors name the object (kind namespace/name, when those could be read) and the reason.
Result<Decoded> decode_object(const simdjson::dom::element& obj,
                              std::optional<model::ObjectKind> hint = std::nullopt);
Result<Decoded> decode_json(std::string_view json,
                            std::optional<model::ObjectKind> hint = std::nullopt);

// "Service", "EndpointSlice", "Node", "Pod" (and their plural resource names).
std::optional<model::ObjectKind> kind_from_name(std::string_view kind);

// A decoded list: the objects that decoded, the errors of those that did not, and the list's
// resourceVersion / continue token.
struct DecodedList {
  std::vector<model::Object> objects;
  std::vector<std::string> errors;
  // namespace/name (name alone for a Node) of the items that did not decode, when readable.
  std::vector<model::ObjectKey> failed;
  std::vector<std::string> warnings;
  std::string resource_version;
  std::string continue_token;
};
// `padded`: at least kJsonPadding readable bytes follow `json` (a response body read with
// room to spare): it is parsed where it is, not copied into a padded buffer first.
inline constexpr size_t kJsonPadding = 64;
Result<DecodedList> decode_list(std::string_view json, model::ObjectKind kind, bool padded = false);

// A list's metadata alone, read without decoding its items: what the next page's request needs
// while this page is decoded elsewhere. `json` must be padded (kJsonPadding bytes after it).
struct ListMeta {
  std::string resource_version;
  std::string continue_token;
};
Result<ListMeta> peek_list_meta(std::string_view json);

// The API server's protobuf encoding, which kube-proxy asks for too. Only EndpointSlice lists
// are asked for in it (protobuf_list_kind): at start they are most of what an agent reads
// (100,000 endpoints in a 10k-service cluster), and decoding them from JSON was the largest
// part of the time to ready. Watches and the other kinds stay JSON. Pages come as the API
// server writes them: "k8s\0", then a runtime.Unknown wrapping the list.
inline constexpr std::string_view kProtobufContentType = "application/vnd.kubernetes.protobuf";
// The media type of a Content-Type or Accept value, as compared: lower case, without its
// parameters (";charset=utf-8") and surrounding blanks. Inline: the flag's check in daemon/
// config.cc (built alone into the config fuzz target) uses it too.
inline std::string media_type(std::string_view value) {
  value = value.substr(0, value.find(';'));
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!value.empty() && blank(value.front())) value.remove_prefix(1);
  while (!value.empty() && blank(value.back())) value.remove_suffix(1);
  std::string out(value);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
bool protobuf_list_kind(model::ObjectKind kind);
// As decode_list: the objects that decoded and the errors (the same checks and texts as JSON's)
// of those that did not; bytes that are not such a list are an error for the whole page.
Result<DecodedList> decode_list_protobuf(std::string_view body, model::ObjectKind kind);
Result<ListMeta> peek_list_meta_protobuf(std::string_view body, model::ObjectKind kind);
// An error response (a Status) the API server wrote in protobuf, for the log; nullopt when the
// body is not one.
struct StatusFields {
  int64_t code = 0;
  std::string reason;
  std::string message;
};
std::optional<StatusFields> decode_status_protobuf(std::string_view body);

}  // namespace endpointd::watcher
