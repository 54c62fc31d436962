// libFuzzer target: the object decoder, with and without a kind hint, and the list metadata
// peek (on a padded copy, as the client reads a page); the same bytes as a protobuf list page
// and Status. Any input must give either a result or
// an error; never a crash, a leak or undefined behaviour.
#include <cstdint>
#include <string>
#include <string_view>

#include "watcher/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);  // fuzzer bytes as text
  using endpointd::model::ObjectKind;
  (void)endpointd::watcher::decode_json(in);
  if (size > 0) {
    auto hint = static_cast<ObjectKind>(data[0] % 4);
    (void)endpointd::watcher::decode_json(in.substr(1), hint);
    (void)endpointd::watcher::decode_list(in.substr(1), hint);
  }
  std::string padded(in);
  padded.append(endpointd::watcher::kJsonPadding, '\0');
  (void)endpointd::watcher::peek_list_meta(std::string_view(padded.data(), size));
  // The protobuf header in front, so that the fuzzer spends its time past it.
  std::string pb = std::string("k8s\0", 4) + std::string(in);
  (void)endpointd::watcher::decode_list_protobuf(pb, ObjectKind::kEndpointSlice);
  (void)endpointd::watcher::peek_list_meta_protobuf(pb, ObjectKind::kEndpointSlice);
  (void)endpointd::watcher::decode_status_protobuf(pb);
  return 0;
}
