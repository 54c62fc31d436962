// What an object must be to be used, shared by the two decoders of API objects (JSON in
// decode.cc, protobuf lists in decode_protobuf.cc): the checks, their defaults and the text of
// their errors, so that an object is refused, or not, for the same reason whichever encoding
// the API server chose. Internal to watcher/.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "model/event.h"

namespace endpointd::watcher::rules {

// Thrown inside the decoders only and caught at their boundary, which puts the object's name
// in front of the reason.
struct DecodeFailure {
  std::string reason;
};

[[noreturn]] inline void fail(std::string reason) {
  throw DecodeFailure{std::move(reason)};
}

// Runs `read` for item `index` of list `list`, whose errors name paths relative to the item
// (".port", ".addresses"): a failure gets the item's path put in front. The path is written
// only when something fails, not for every item read.
template <typename Read>
auto in_item(std::string_view list, size_t index, const Read& read) {
  try {
    return read();
  } catch (DecodeFailure& f) {
    f.reason = std::string(list) + "[" + std::to_string(index) + "]" + f.reason;
    throw;
  }
}

// "EndpointSlice prod/web-abc" (a namespaced kind without a namespace is in "default"),
// "Node n1", "object" when nothing could be read.
std::string describe(std::optional<model::ObjectKind> kind, std::string_view ns,
                     std::string_view name);

// metadata.name: present and at most 253 characters.
void check_name(std::string_view name);

model::IpAddr ip(std::string_view text, std::string_view path);
uint16_t port(int64_t v, std::string_view path, bool allow_zero);
// "" is TCP, as the API defaults it. `path` is the protocol field's owner.
model::Protocol protocol(std::string_view p, std::string_view path);

// --- EndpointSlices ------------------------------------------------------------------------

inline constexpr std::string_view kServiceNameLabel = "kubernetes.io/service-name";
inline constexpr std::string_view kProxyNameLabel = "service.kubernetes.io/service-proxy-name";
inline constexpr std::string_view kTriggerTimeAnnotation =
    "endpoints.kubernetes.io/last-change-trigger-time";
inline constexpr size_t kMaxSliceEndpoints = 1000;

model::AddressType address_type(std::string_view at);
// The endpoint's address `v`, checked against the slice's type (an FQDN slice's are not kept).
void add_address(model::Endpoint& e, model::AddressType type, std::string_view v);
// After the addresses: an IP slice's endpoint has at least one.
void check_addresses(const model::Endpoint& e, model::AddressType type);
// The trigger-time annotation's value; one that does not parse is left out (it only feeds a
// latency metric).
void set_trigger_time(model::EndpointSlice& s, std::string_view value);

}  // namespace endpointd::watcher::rules
