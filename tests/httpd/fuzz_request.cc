// libFuzzer target for the request-head parser: any bytes, no crash, and an accepted head
// names a path that starts with '/'.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "httpd/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view head(reinterpret_cast<const char*>(data), size);
  auto r = endpointd::httpd::parse_request_head(head);
  if (r.ok()) {
    if (r->path.empty() || r->path.front() != '/') std::abort();
    (void)r->param("a");
  }
  (void)endpointd::httpd::percent_decode(head);
  return 0;
}
