// libFuzzer target: `endpointd run --config FILE` as the daemon reads it — endpointd's own keys
// or a KubeProxyConfiguration (kubeadm's kube-proxy ConfigMap, converted with its report),
// decoded and checked into a Config. Any file must give a Config or an error; never a crash or
// an exception, and a Config only with values in their documented ranges.
#include <cstdint>

#include "daemon/config.h"
#include "tests/fuzz/memfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // yaml-cpp's own recursion is not what is under test
  using namespace endpointd::daemon;
  auto cfg = load_config({{"config", {endpointd::fuzz::as_file(data, size)}}});
  if (!cfg) return 0;
  if (cfg->watch_timeout.count() < 10 || cfg->watch_timeout.count() > 3600) __builtin_trap();
  if (cfg->list_page_size < 1 || cfg->list_page_size > 10000) __builtin_trap();
  if (cfg->dns_ttl.count() < 0 || cfg->dns_ttl.count() > 3600) __builtin_trap();
  if (cfg->drain_fan_in < 2 || cfg->drain_fan_in > 64) __builtin_trap();
  if (cfg->drain_peer_port == 0) __builtin_trap();
  if (!cfg->source_dir.empty() && !cfg->kubeconfig.empty()) __builtin_trap();
  return 0;
}
