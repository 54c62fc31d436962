// The node-local DNS address on this node (--dns-node-local-address): a dummy interface,
// `endpointd-dns`, holds it, as NodeLocal DNSCache's `nodelocaldns` does, so that pods reach it
// through the node and the DNS server can bind it. rtnetlink requests are built as bytes here
// (tested without root) and sent by ensure_/remove_node_local_address.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "model/ip.h"
#include "model/result.h"

namespace endpointd::proxy {

inline constexpr const char* kNodeLocalInterface = "endpointd-dns";

// RTM_NEWLINK: a dummy link `name`, up (NLM_F_CREATE without EXCL: a link already there is
// brought up and left as it is).
std::string new_dummy_link_request(std::string_view name, uint32_t seq);
// RTM_NEWADDR: `a` as a /32 (/128) on interface `ifindex` (NLM_F_REPLACE: already there is
// no error; IPv6 without duplicate address detection, so it is usable at once).
std::string new_address_request(uint32_t ifindex, const model::IpAddr& a, uint32_t seq);
// RTM_DELLINK of `name`; RTM_DELADDR of `a` (/32, /128) from `ifindex`.
std::string del_link_request(std::string_view name, uint32_t seq);
std::string del_address_request(uint32_t ifindex, const model::IpAddr& a, uint32_t seq);

// In the calling thread's network namespace: makes kNodeLocalInterface (if missing), brings it
// up and puts `a` on it. A kernel without the dummy driver (CONFIG_DUMMY) gets the address on
// `lo` instead: packets to it are delivered the same. Returns the interface that holds it.
Result<std::string> ensure_node_local_address(const model::IpAddr& a);
// Deletes kNodeLocalInterface and takes `a` off `lo`; what is not there is no error.
Status remove_node_local_address(const model::IpAddr& a);

}  // namespace endpointd::proxy
