// `endpointd run ARGS...` decoded as main.cc does it: CLI11 parses the flags of the `run`
// subcommand, load_config reads the --config file and decodes both.
#pragma once

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/config.h"

namespace endpointd::daemon::testing {

inline Result<Config> run_args(const std::vector<std::string>& args) {
  CLI::App app;
  auto* run = app.add_subcommand("run");
  add_run_flags(*run);
  std::vector<const char*> argv = {"endpointd", "run"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return Error{std::string("CLI11: ") + e.what()};
  }
  return load_config(raw_flags(*run));
}

// `endpointd run ARGS... --write-config-to F`: the text main.cc writes to F.
inline Result<std::string> write_args(const std::vector<std::string>& args) {
  CLI::App app;
  auto* run = app.add_subcommand("run");
  add_run_flags(*run);
  std::vector<const char*> argv = {"endpointd", "run", "--write-config-to", "/dev/null"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return Error{std::string("CLI11: ") + e.what()};
  }
  auto written = write_config(*run, raw_flags(*run));
  if (!written) return Error{written.error()};
  return written->text;
}

// A file that holds `text` while it lives.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/endpointd-config-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    path_ = tmpl;
    std::ofstream(path_) << text;
  }
  ~TempFile() { unlink(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace endpointd::daemon::testing
