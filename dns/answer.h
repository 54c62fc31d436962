// Answers one parsed query from a zone into a caller's buffer: the hot path of the server.
// No allocation, no lock, no exception.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "dns/message.h"
#include "dns/zone.h"

namespace endpointd::dns {

struct Reply {
  enum class Action : uint8_t { kSend, kForward, kDrop };
  Action action = Action::kDrop;
  size_t size = 0;
  uint16_t rcode = 0;
  bool truncated = false;
};

// `limit`: the most the client accepts (its UDP size, or 65535 over TCP). `now_ns`: the
// steady_clock time stamped on the record set served, for drain support.
Reply answer(const Zone& zone, std::span<const uint8_t> pkt, const Query& q, uint8_t* out,
             size_t cap, size_t limit, int64_t now_ns);

// A reply carrying only the question (SERVFAIL, REFUSED, ...), never longer than the query
// it answers; header-only when the question would make it longer.
Reply error_reply(std::span<const uint8_t> pkt, const Query& q, uint16_t rcode, uint8_t* out,
                  size_t cap);

}  // namespace endpointd::dns
