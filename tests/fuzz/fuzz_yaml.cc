// libFuzzer target: manifests as a user writes them: YAML → JSON → decoder.
#include <cstdint>
#include <string_view>

#include "watcher/decode.h"
#include "watcher/yaml_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // yaml-cpp's own recursion is not what is under test
  std::string_view in(reinterpret_cast<const char*>(data), size);  // fuzzer bytes as text
  auto docs = endpointd::watcher::yaml_to_json_documents(in);
  if (!docs) return 0;
  for (const auto& d : *docs) (void)endpointd::watcher::decode_json(d);
  return 0;
}
