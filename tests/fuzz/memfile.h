// For targets whose parser takes a path: the input is written to one anonymous in-memory
// file, reopened by the parser through /proc/self/fd, so each run costs no disk I/O.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace endpointd::fuzz {

// The path of a file that now holds exactly `data`.
inline const std::string& as_file(const uint8_t* data, size_t size) {
  static const int fd = [] {
    int f = memfd_create("endpointd-fuzz", MFD_CLOEXEC);
    if (f < 0) std::abort();
    return f;
  }();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (ftruncate(fd, 0) != 0) std::abort();
  for (size_t off = 0; off < size;) {
    ssize_t n = pwrite(fd, data + off, size - off, static_cast<off_t>(off));
    if (n <= 0) std::abort();
    off += static_cast<size_t>(n);
  }
  return path;
}

}  // namespace endpointd::fuzz
