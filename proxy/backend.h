// The seam between the proxy sink and the kernel: a backend programs table models and
// table changes. The netlink backend does it for real; tests use a recording fake.
#pragma once

#include <cstddef>
#include <vector>

#include "model/result.h"
#include "proxy/table.h"

namespace endpointd::proxy {

struct BatchStats {
  size_t messages = 0;  // netlink messages in the batch (begin/end excluded)
  size_t bytes = 0;
  size_t elements = 0;  // set elements added or deleted (a full sync sends only what differs)
  // Full syncs: sets whose elements were listed, and sets left alone because the kernel's
  // content digest for them was the table's (not listed).
  size_t sets_listed = 0;
  size_t sets_unchanged = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Makes the kernel's endpointd tables equal to `tables` without flushing them: objects are
  // created when missing, replaced in place, and whatever endpointd no longer has is removed,
  // all in one atomic batch. Used at start, after an error and after a foreign change.
  virtual Result<BatchStats> full_sync(const std::vector<const Table*>& tables) = 0;
  // One atomic batch carrying `changes` (every family).
  virtual Result<BatchStats> apply(const std::vector<TableChanges>& changes) = 0;
  // Whether the kernel's sets have room for `changes`: a set made with a size holds at most
  // that many elements. When not, the caller makes a full sync instead (which makes the set
  // anew, larger).
  virtual bool fits(const std::vector<TableChanges>& changes) const {
    (void)changes;
    return true;
  }
};

}  // namespace endpointd::proxy
