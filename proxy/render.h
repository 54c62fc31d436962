// Prints the table model in `nft -f` syntax: what `endpointd render` shows and what the
// golden tests load with nft to compare against what the netlink backend programmed.
#pragma once

#include <string>

#include "proxy/table.h"

namespace endpointd::proxy {

// "table ip endpointd { ... }" for one family.
std::string render(const Table& t);
// One rule, as `nft list` prints it (no indentation, no newline).
std::string render_rule(IpFamily f, const Rule& r);

}  // namespace endpointd::proxy
