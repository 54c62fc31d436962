// libFuzzer target: the /proc text that identifies a prestop caller (drain/identify.h): its
// network namespace's fib_trie and if_inet6, which the caller's pod shapes by the addresses it
// configures, and its cgroup path. No mountinfo parser exists in endpointd.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>

#include "drain/identify.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);  // fuzzer bytes as text
  using namespace endpointd::drain;
  auto v4 = parse_fib_trie_local(in);
  for (size_t i = 0; i < v4.size(); ++i) {
    if (v4[i].is_loopback()) __builtin_trap();
    if (std::find(v4.begin() + static_cast<long>(i) + 1, v4.end(), v4[i]) != v4.end())
      __builtin_trap();  // each address once
  }
  for (const auto& a : parse_if_inet6(in))
    if (a.is_loopback()) __builtin_trap();
  std::string uid = pod_uid_from_cgroup(in);
  if (!uid.empty()) {
    if (uid.size() != 36) __builtin_trap();
    for (size_t i = 0; i < uid.size(); ++i) {
      bool dash = i == 8 || i == 13 || i == 18 || i == 23;
      if (dash ? uid[i] != '-' : !std::isxdigit(static_cast<unsigned char>(uid[i])))
        __builtin_trap();
    }
  }
  return 0;
}
