// HAProxy's runtime API (the stats socket) as endpointd-haproxy uses it: one command per
// connection, bounded by a timeout, and the parser of `show servers state`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/result.h"

namespace endpointd::haproxy {

// The seam between the adapter and HAProxy: tests put a fake behind it.
class RuntimeApi {
 public:
  virtual ~RuntimeApi() = default;
  // Sends one command and returns HAProxy's answer. An Error means the command may or may not
  // have run (no answer, socket gone, timeout); the message names the socket and the command.
  // An answer that reports a failure ("No such server.") is a value: the caller judges it.
  virtual Result<std::string> call(const std::string& command) = 0;
  // "HAProxy runtime API <socket>", for messages about answers.
  virtual std::string describe() const = 0;
};

// The runtime API on a unix socket (`stats socket PATH level admin` in haproxy.cfg). Every
// call opens a connection, writes the command, and reads the answer until HAProxy closes the
// connection, all within `timeout`.
class SocketRuntime : public RuntimeApi {
 public:
  SocketRuntime(std::string path, std::chrono::milliseconds timeout);
  Result<std::string> call(const std::string& command) override;
  std::string describe() const override { return "HAProxy runtime API " + path_; }

 private:
  std::string path_;
  std::chrono::milliseconds timeout_;
};

// srv_admin_state bits of `show servers state` (management.txt, format version 1).
inline constexpr uint32_t kAdminForcedMaint = 0x01;
inline constexpr uint32_t kAdminInheritedMaint = 0x02;
inline constexpr uint32_t kAdminConfigMaint = 0x04;
inline constexpr uint32_t kAdminForcedDrain = 0x08;
inline constexpr uint32_t kAdminInheritedDrain = 0x10;
inline constexpr uint32_t kAdminResolutionMaint = 0x20;

// One server line of `show servers state`: the columns the adapter reads.
struct ServerRow {
  std::string name;          // srv_name
  std::string addr;          // srv_addr
  uint32_t port = 0;         // srv_port
  uint32_t id = 0;           // srv_id
  bool forced_id = false;    // srv_f_forced_id: the id was given (config `id` or `add server`)
  uint32_t admin_state = 0;  // srv_admin_state, a mask of the kAdmin* bits
};

// Parses the answer to `show servers state <backend>`: format version 1, a `#` header line
// naming the columns (looked up by name, so added columns do not matter), then one line per
// server. Anything else (HAProxy's "Can't find backend.", a truncated answer, another format
// version) is an Error that quotes it.
Result<std::vector<ServerRow>> parse_servers_state(std::string_view text);

}  // namespace endpointd::haproxy
