// A response as bytes (status line, headers, body), apart from any socket: the loop's answers
// and the worker's both go through these.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "httpd/server_internal.h"

namespace endpointd::httpd {

namespace {

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "";
  }
}

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

namespace {

// The framing headers only the server writes.
bool server_header(std::string_view name) {
  for (std::string_view h : {"content-type", "content-length", "transfer-encoding", "connection"})
    if (iequals(name, h)) return true;
  return false;
}

bool header_safe(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

}  // namespace

// The status line and headers; the body follows unless the request was HEAD.
std::string response_head(int status, std::string_view content_type,
                          std::optional<size_t> content_length, bool chunked, bool close,
                          const std::vector<std::pair<std::string, std::string>>& extra) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  if (header_safe(content_type)) h += "Content-Type: " + std::string(content_type) + "\r\n";
  if (content_length) h += "Content-Length: " + std::to_string(*content_length) + "\r\n";
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  if (close) h += "Connection: close\r\n";
  for (const auto& [name, value] : extra) {
    if (name.empty() || !header_safe(name) || !header_safe(value) ||
        name.find(':') != std::string::npos || server_header(name))
      continue;
    h += name + ": " + value + "\r\n";
  }
  h += "\r\n";
  return h;
}

std::string serialize(const Response& r, bool head_only, bool close) {
  std::string out = response_head(r.status, r.content_type, r.body.size(), false, close, r.headers);
  if (!head_only) out += r.body;
  return out;
}

Response text(int status, std::string body) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace endpointd::httpd
