// An HTTP/1.x request head as endpointd's admin server sees it, and its parser (pure: no I/O),
// kept apart from the server so tests and fuzzers can feed it bytes directly.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "model/result.h"

namespace endpointd::httpd {

struct Request {
  std::string method;  // as sent: "GET", "HEAD", ...
  std::string path;    // the target before '?', not decoded (routes match it exactly)
  std::string query;   // the raw query string after '?', "" if none
  std::map<std::string, std::string> headers;  // lower-case names; repeats joined with ", "
  std::string peer;                            // the client's IP address ("127.0.0.1", "::1")
  int version_minor = 1;                       // HTTP/1.<version_minor>

  // The first query parameter with this name, percent-decoded ('+' is a space); "" if absent.
  std::string param(std::string_view name) const;
  // A header's value by lower-case name; "" if absent.
  std::string header(std::string_view lower_name) const;
};

// Percent-decoding of a query component ('+' becomes a space); a malformed escape stays as is.
std::string percent_decode(std::string_view s);

// Parses a request head: the request line and the header lines, each ended by CRLF, without
// the empty line that ends the head. Strict on purpose (this server only needs what curl,
// kubelet and Prometheus send): a bare CR or LF, a line folded onto the previous one, a header
// name outside RFC 9110's token characters or a version other than HTTP/1.0 and 1.1 is an
// error, whose message says what was wrong.
Result<Request> parse_request_head(std::string_view head);

}  // namespace endpointd::httpd
