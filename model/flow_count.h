// Live connections to one endpoint, as conntrack counts them: what a drain's stage 3 waits on.
// A value type, so the conntrack code (proxy/) can produce it and drain/ can read it without
// either knowing the other.
#pragma once

#include <cstddef>

namespace endpointd::model {

struct FlowCount {
  size_t tcp_established = 0;
  size_t tcp_opening = 0;  // SYN_SENT, SYN_RECV
  size_t tcp_closing = 0;  // FIN_WAIT, CLOSE_WAIT, LAST_ACK (still carrying data or a FIN)
  size_t udp = 0;          // entries until they time out
  size_t sctp = 0;
  // What a drain waits for: everything but TCP's TIME_WAIT/CLOSE leftovers.
  size_t live() const { return tcp_established + tcp_opening + tcp_closing + udp + sctp; }
  friend bool operator==(const FlowCount&, const FlowCount&) = default;
};

}  // namespace endpointd::model
