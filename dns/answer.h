// Answers one parsed query from a zone into a caller's buffer: the hot path of the server.
// No allocation, no lock, no exception.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "dns/message.h"
#include "dns/zone.h"

namespace endpointd::dns {

struct Reply {
  enum class Action : uint8_t { kSend, kForward, kDrop };
  Action action = Action::kDrop;
  size_t size = 0;
  uint16_t rcode = 0;
  bool truncated = false;
  // kSend of an ExternalName's CNAME to a name outside the zone, asked for A or AAAA: that
  // name (wire form). The server may complete the reply with the name's records from the
  // forwarder (chase_query, chase_reply); sent as it is, it is the CNAME alone.
  std::string_view chase;
};

// `limit`: the most the client accepts (its UDP size, or 65535 over TCP). `now_ns`: the
// steady_clock time stamped on the record set served, for drain support.
Reply answer(const Zone& zone, std::span<const uint8_t> pkt, const Query& q, uint8_t* out,
             size_t cap, size_t limit, int64_t now_ns);

// The two halves of answer(), for a worker that looks up a whole batch of queries before it
// writes any reply, so that the cache misses of the batch's lookups overlap.
// wants_lookup: whether the answer to `q` comes from the zone (a well-formed query of class
// IN or ANY, not a zone transfer); answer_lookup: answer() for such a query, given
// zone.lookup(q.qname_lower, q.qtype).
bool wants_lookup(const Query& q);
Reply answer_lookup(const Zone& zone, const Zone::Lookup& lk, std::span<const uint8_t> pkt,
                    const Query& q, uint8_t* out, size_t cap, size_t limit, int64_t now_ns);
// Starts loading what answer_lookup() will read of `lk` (its record set and the first bytes
// of its body).
void prefetch_answer(const Zone::Lookup& lk);

// The query the forwarder asks for an ExternalName's target (`target`: Reply::chase) on behalf
// of `q`: the same type, ID and EDNS, recursion desired.
Query chase_query(const Query& q, std::string_view target);
// One reply of the CNAME reply `cname` (answer_lookup's, for `q`) followed by the A, AAAA and
// CNAME records of the upstream's answer to chase_query(): CoreDNS's answer for an
// ExternalName to an outside name. The rcode stays the CNAME's (NOERROR) whatever the upstream
// said, as CoreDNS's. 0 when `upstream` is not a reply or the whole does not fit `cap`.
size_t chase_reply(const Query& q, std::span<const uint8_t> cname,
                   std::span<const uint8_t> upstream, uint8_t* out, size_t cap);

// A reply carrying only the question (SERVFAIL, REFUSED, ...), never longer than the query
// it answers; header-only when the question would make it longer.
Reply error_reply(std::span<const uint8_t> pkt, const Query& q, uint16_t rcode, uint8_t* out,
                  size_t cap);

}  // namespace endpointd::dns
