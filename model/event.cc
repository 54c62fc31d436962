// Helpers over the event and object variants.
#include "model/event.h"

#include <limits>

namespace endpointd::model {

std::string_view to_string(ObjectKind k) {
  switch (k) {
    case ObjectKind::kService:
      return "Service";
    case ObjectKind::kEndpointSlice:
      return "EndpointSlice";
    case ObjectKind::kNode:
      return "Node";
    case ObjectKind::kPod:
      return "Pod";
  }
  return "?";
}

ObjectKind kind_of(const Object& o) {
  return static_cast<ObjectKind>(o.index());
}

std::string key_string(const Object& o) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Node>) {
          return x.name;
        } else {
          return x.key.str();
        }
      },
      o);
}

Result<uint64_t> parse_revision(std::string_view rv) {
  auto bad = [&](const char* why) {
    return Error{"resourceVersion \"" + std::string(rv.substr(0, 64)) + "\": " + why};
  };
  if (rv.empty()) return bad("empty");
  if (rv.size() > 1 && rv[0] == '0') return bad("leading zero");
  uint64_t v = 0;
  for (char c : rv) {
    if (c < '0' || c > '9') return bad("not a decimal number");
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return bad("past 2^64-1");
    v = v * 10 + d;
  }
  if (v == 0) return bad("0 is not a position");
  return v;
}

}  // namespace endpointd::model
