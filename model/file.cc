#include "model/file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace endpointd::model {

Result<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{std::strerror(errno)};
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Error{"read error"};
  if (ss.str().empty()) return Error{"the file is empty"};
  return ss.str();
}

}  // namespace endpointd::model
