// Small files read whole: certificates, keys, tokens.
#pragma once

#include <string>

#include "model/result.h"

namespace endpointd::model {

// The file's text; an error (the system's reason) when it cannot be read or is empty.
Result<std::string> read_small_file(const std::string& path);

}  // namespace endpointd::model
