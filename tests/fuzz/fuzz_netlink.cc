// libFuzzer target: the kernel's netlink replies as endpointd reads them — the chain and set
// names of a dump, the ruleset generation, the elements of a set (proxy/netlink.h). Only the kernel
// can answer that socket, so this is robustness: whatever the bytes, no crash and no read past
// them.
#include <linux/netfilter/nf_tables.h>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "proxy/netlink.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // Netlink buffers are 4-byte aligned; the fuzzer's bytes are copied into one that is.
  std::vector<uint32_t> aligned((size - 1 + 3) / 4 + 1);
  std::memcpy(aligned.data(), data + 1, size - 1);
  const void* buf = aligned.data();
  size_t len = size - 1;
  switch (data[0] % 4) {
    case 0:
    case 1: {
      std::vector<std::string> names;
      uint16_t type = data[0] % 3 == 0 ? NFT_MSG_GETCHAIN : NFT_MSG_GETSET;
      endpointd::proxy::parse_dump_names(buf, len, 0, 0, type, names);
      for (const auto& n : names)
        if (n.size() > len) __builtin_trap();  // a name can only come from the bytes
      break;
    }
    case 3: {
      std::vector<endpointd::proxy::KernelElement> elements;
      endpointd::proxy::parse_set_elements(buf, len, 0, 0, elements);
      for (const auto& e : elements) {
        // Everything read comes from the bytes.
        if (e.key.size() + e.key_end.size() + e.data.size() + e.chain.size() > len)
          __builtin_trap();
      }
      break;
    }
    default: {
      std::optional<uint32_t> id;
      endpointd::proxy::parse_generation(buf, len, 0, 0, id);
      break;
    }
  }
  return 0;
}
