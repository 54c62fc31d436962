// libFuzzer target: the kubeconfig reader (its context, cluster and user, base64 data
// fields, files named relative to it). Any file must give a ClusterConfig or an error.
#include <cstdint>
#include <string_view>

#include "tests/fuzz/memfile.h"
#include "watcher/kube_auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // yaml-cpp's own recursion is not what is under test
  using namespace endpointd::watcher;
  auto cfg = from_kubeconfig(endpointd::fuzz::as_file(data, size));
  if (cfg && cfg->server.rfind("https://", 0) != 0 && cfg->server.rfind("http://", 0) != 0)
    __builtin_trap();
  std::string_view in(reinterpret_cast<const char*>(data), size);  // fuzzer bytes as text
  auto b = base64_decode(in);
  if (b && b->size() > in.size()) __builtin_trap();
  return 0;
}
