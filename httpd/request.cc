// The request-head parser and query decoding.
#include "httpd/request.h"

#include <optional>

namespace endpointd::httpd {

namespace {

// RFC 9110's tchar: what a method or a header name may contain.
bool is_token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_token_char(c)) return false;
  return true;
}

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<int> hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return std::nullopt;
}

Status parse_request_line(std::string_view line, Request& r) {
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return Error{"request line has no target"};
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return Error{"request line has no version"};
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method)) return Error{"bad method"};
  if (target.empty() || target.front() != '/') return Error{"target is not an absolute path"};
  for (char c : target) {
    auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) return Error{"control character or space in the target"};
  }
  if (version == "HTTP/1.1") {
    r.version_minor = 1;
  } else if (version == "HTTP/1.0") {
    r.version_minor = 0;
  } else {
    return Error{"unsupported version"};
  }
  r.method = std::string(method);
  size_t q = target.find('?');
  r.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
  return {};
}

Status parse_header_line(std::string_view line, Request& r) {
  if (line.front() == ' ' || line.front() == '\t') return Error{"folded header line"};
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return Error{"header line without a colon"};
  std::string_view name = line.substr(0, colon);
  if (!is_token(name)) return Error{"bad header name"};
  std::string_view value = trim(line.substr(colon + 1));
  for (char c : value) {
    auto u = static_cast<unsigned char>(c);
    if (u == 0 || u == '\r' || u == '\n') return Error{"control character in a header value"};
  }
  std::string key;
  key.reserve(name.size());
  for (char c : name) key.push_back(lower(c));
  auto [it, fresh] = r.headers.try_emplace(std::move(key), value);
  if (!fresh) {
    it->second += ", ";
    it->second += value;
  }
  return {};
}

}  // namespace

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < s.size() && hex_value(s[i + 1]) && hex_value(s[i + 2])) {
      out.push_back(static_cast<char>(*hex_value(s[i + 1]) * 16 + *hex_value(s[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string Request::param(std::string_view name) const {
  std::string_view rest = query;
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    size_t eq = pair.find('=');
    std::string_view key = pair.substr(0, eq);
    if (percent_decode(key) != name) continue;
    return eq == std::string_view::npos ? std::string() : percent_decode(pair.substr(eq + 1));
  }
  return {};
}

std::string Request::header(std::string_view lower_name) const {
  auto it = headers.find(std::string(lower_name));
  return it == headers.end() ? std::string() : it->second;
}

Result<Request> parse_request_head(std::string_view head) {
  Request r;
  bool first = true;
  while (!head.empty()) {
    size_t end = head.find("\r\n");
    std::string_view line = head.substr(0, end);
    head = end == std::string_view::npos ? std::string_view() : head.substr(end + 2);
    if (line.find_first_of("\r\n") != std::string_view::npos) return Error{"bare CR or LF"};
    if (line.empty()) return Error{first ? "empty request line" : "empty header line"};
    Status s = first ? parse_request_line(line, r) : parse_header_line(line, r);
    if (!s) return Error{s.error()};
    first = false;
  }
  if (first) return Error{"empty request"};
  return r;
}

}  // namespace endpointd::httpd
