// Helpers over the event and object variants.
#include "model/event.h"

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

}  // namespace endpointd::model
