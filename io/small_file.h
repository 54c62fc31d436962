// Small files read whole: certificates, keys, tokens. The one file read drain/ and feed/ share,
// kept out of model/, which does no I/O. Header-only: one function, no library of its own.
#pragma once

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "model/result.h"

namespace endpointd::io {

// The file's text; an error (the system's reason) when it cannot be read or is empty.
inline Result<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{std::strerror(errno)};
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Error{"read error"};
  if (ss.str().empty()) return Error{"the file is empty"};
  return ss.str();
}

}  // namespace endpointd::io
