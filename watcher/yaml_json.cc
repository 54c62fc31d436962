// YAML → JSON conversion on yaml-cpp's node tree.
#include "watcher/yaml_json.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdio>

namespace endpointd::watcher {

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

namespace {

bool is_integer(std::string_view s) {
  if (s.empty()) return false;
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

bool is_float(std::string_view s) {
  if (s.empty()) return false;
  double d;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  return ec == std::errc() && p == s.data() + s.size() &&
         s.find_first_of(".eE") != std::string_view::npos;
}

void emit(const YAML::Node& n, std::string& out, int depth) {
  if (depth > 64) throw std::runtime_error("nesting deeper than 64 levels");
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: out += "null"; return;
    case YAML::NodeType::Scalar: {
      const std::string& v = n.Scalar();
      if (n.Tag() == "?") {  // a plain scalar: resolve its type
        if (v == "null" || v == "Null" || v == "NULL" || v == "~") { out += "null"; return; }
        if (v == "true" || v == "True" || v == "TRUE") { out += "true"; return; }
        if (v == "false" || v == "False" || v == "FALSE") { out += "false"; return; }
        if (is_integer(v)) {
          out += (v[0] == '+') ? v.substr(1) : v;
          return;
        }
        if (is_float(v)) { out += v; return; }
      }
      append_json_string(out, v);
      return;
    }
    case YAML::NodeType::Sequence: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : n) {
        if (!first) out.push_back(',');
        first = false;
        emit(e, out, depth + 1);
      }
      out.push_back(']');
      return;
    }
    case YAML::NodeType::Map: {
      out.push_back('{');
      bool first = true;
      for (const auto& kv : n) {
        if (!first) out.push_back(',');
        first = false;
        if (kv.first.Type() != YAML::NodeType::Scalar) throw std::runtime_error("a map key that is not a scalar");
        append_json_string(out, kv.first.Scalar());
        out.push_back(':');
        emit(kv.second, out, depth + 1);
      }
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

Result<std::vector<std::string>> yaml_to_json_documents(std::string_view yaml) {
  std::vector<std::string> docs;
  try {
    for (const auto& doc : YAML::LoadAll(std::string(yaml))) {
      if (doc.IsNull()) continue;
      std::string out;
      emit(doc, out, 0);
      docs.push_back(std::move(out));
    }
  } catch (const YAML::Exception& e) {
    return Error{"YAML: line " + std::to_string(e.mark.line + 1) + ": " + e.msg};
  } catch (const std::exception& e) {
    return Error{std::string("YAML: ") + e.what()};
  }
  return docs;
}

}  // namespace endpointd::watcher
