// Walking netlink attributes in tests that decode the bytes endpointd sends.
#pragma once

#include <libmnl/libmnl.h>

#include <cstddef>

namespace endpointd::proxy::testing {

// Calls f for each attribute in [p, p+len) (libmnl's walk macros do not compile as C++).
template <typename F>
void each_attr(const void* p, size_t len, F f) {
  auto* a = static_cast<const nlattr*>(p);
  int left = static_cast<int>(len);
  while (mnl_attr_ok(a, left)) {
    f(a);
    left -= static_cast<int>(MNL_ALIGN(a->nla_len));
    a = mnl_attr_next(a);
  }
}

}  // namespace endpointd::proxy::testing
