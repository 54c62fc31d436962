// `endpointd render` and `endpointd run --cleanup`: one-shot commands around the dataplane.
#pragma once

#include <iosfwd>
#include <string>

#include "daemon/config.h"

namespace endpointd::daemon {

// Reads the manifest directory once and prints, in `nft -f` syntax, the tables endpointd
// would program for this node. Returns the process exit status.
int render(const Config& cfg, std::ostream& out, std::ostream& err);

// Deletes endpointd's nftables tables (ip and ip6 endpointd). Returns the exit status.
int cleanup(const Config& cfg, std::ostream& err);
// `endpointd run --init-only`: the conntrack sysctls written (each logged); 0, or 1 with the
// setting that could not be written on `err`.
int init_only(const Config& cfg, std::ostream& err);

}  // namespace endpointd::daemon
