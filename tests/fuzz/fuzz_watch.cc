// libFuzzer target: a watch stream cut into arbitrary pieces, line reassembly and event parsing.
#include <simdjson.h>

#include <cstdint>
#include <string_view>

#include "watcher/kube_watch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  using namespace endpointd::watcher;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);  // fuzzer bytes as text
  size_t piece = 1 + data[0] % 64;
  LineBuffer lines(1 << 20);
  simdjson::dom::parser parser;
  auto kind = static_cast<endpointd::model::ObjectKind>(data[0] % 4);
  for (size_t off = 0; off < in.size(); off += piece) {
    bool ok = lines.feed(in.substr(off, piece), [&](std::string_view line) {
      (void)parse_watch_event(line, kind, parser);
      return true;
    });
    if (!ok) break;
  }
  (void)parse_status(in, parser);
  return 0;
}
