// YAML → JSON conversion on yaml-cpp's node tree.
#include "watcher/yaml_json.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <map>
#include <sstream>

#include <charconv>
#include <cstdio>

namespace endpointd::watcher {

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

struct Failure {
  std::string message;
};

// Writes JSON straight from yaml-cpp's parse events: no node tree, and aliases replayed from
// the text their anchor produced, with the total output capped so that an alias bomb ends in
// an error instead of exhausting memory.
class JsonWriter : public YAML::EventHandler {
 public:
  static constexpr size_t kMaxOutput = 16 * 1024 * 1024;
  static constexpr size_t kMaxDepth = 64;

  std::string out;
  bool had_content = false;
  int first_pos = -1;  // stream position of the document's first node
  int first_line = 0;

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t anchor) override {
    begin_value(m, false);
    out += "null";
    end_value(anchor);
  }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) fail(m, "alias to an unknown anchor");
    begin_value(m, key_expected() && it->second.front() == '"');
    out += it->second;
    end_value(0);
  }
  void OnScalar(const YAML::Mark& m, const std::string& tag, YAML::anchor_t anchor,
                const std::string& v) override {
    bool key = key_expected();
    begin_value(m, true);
    if (key || tag != "?") {
      append_json_string(out, v);
    } else if (v == "null" || v == "Null" || v == "NULL" || v == "~" || v.empty()) {
      out += "null";
    } else if (v == "true" || v == "True" || v == "TRUE") {
      out += "true";
    } else if (v == "false" || v == "False" || v == "FALSE") {
      out += "false";
    } else if (is_integer(v)) {
      out += (v[0] == '+') ? v.substr(1) : v;
    } else if (is_float(v)) {
      out += v;
    } else {
      append_json_string(out, v);
    }
    end_value(anchor);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(m, '[', anchor);
  }
  void OnSequenceEnd() override { close(']'); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(m, '{', anchor);
  }
  void OnMapEnd() override { close('}'); }

 private:
  struct Frame {
    char kind;  // '[' or '{'
    size_t count = 0;
    size_t start = 0;
    YAML::anchor_t anchor = 0;
  };

  [[noreturn]] static void fail(const YAML::Mark& m, const std::string& what) {
    throw Failure{"line " + std::to_string(m.line + 1) + ": " + what};
  }
  bool key_expected() const {
    return !stack_.empty() && stack_.back().kind == '{' && stack_.back().count % 2 == 0;
  }
  void begin_value(const YAML::Mark& m, bool scalar_key_ok) {
    if (!had_content) {
      first_pos = m.pos;
      first_line = m.line;
    }
    had_content = true;
    if (out.size() > kMaxOutput) fail(m, "the document expands beyond 16 MiB (aliases?)");
    if (stack_.empty()) return;
    Frame& f = stack_.back();
    if (f.kind == '{') {
      if (f.count % 2 == 0) {
        if (!scalar_key_ok) fail(m, "a map key that is not a string");
        if (f.count) out.push_back(',');
      } else {
        out.push_back(':');
      }
    } else if (f.count) {
      out.push_back(',');
    }
    value_start_ = out.size();
  }
  void end_value(YAML::anchor_t anchor) {
    if (anchor) anchors_[anchor] = out.substr(value_start_);
    if (!stack_.empty()) ++stack_.back().count;
  }
  void open(const YAML::Mark& m, char kind, YAML::anchor_t anchor) {
    begin_value(m, false);
    if (stack_.size() >= kMaxDepth) fail(m, "nesting deeper than 64 levels");
    stack_.push_back({kind, 0, out.size(), anchor});
    out.push_back(kind);
  }
  void close(char c) {
    Frame f = stack_.back();
    stack_.pop_back();
    out.push_back(c);
    value_start_ = f.start;
    end_value(f.anchor);
  }

  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, std::string> anchors_;
  size_t value_start_ = 0;
};

}  // namespace

Result<std::vector<std::string>> yaml_to_json_documents(std::string_view yaml) {
  std::vector<std::string> docs;
  std::istringstream in{std::string(yaml)};
  try {
    YAML::Parser parser(in);
    int last_null_pos = -2;
    for (;;) {
      JsonWriter w;
      if (!parser.HandleNextDocument(w)) break;
      if (!w.had_content) continue;
      if (w.out == "null") {
        // yaml-cpp 0.7 reports a null document without consuming anything for some malformed
        // input (a stray ','), and would do so forever: a second null document at the same
        // position is that, not an empty document.
        if (w.first_pos == last_null_pos)
          return Error{"YAML: line " + std::to_string(w.first_line + 1) +
                       ": a token that cannot start a value"};
        last_null_pos = w.first_pos;
        continue;
      }
      docs.push_back(std::move(w.out));
    }
  } catch (const YAML::Exception& e) {
    return Error{"YAML: line " + std::to_string(e.mark.line + 1) + ": " + e.msg};
  } catch (const Failure& f) {
    return Error{"YAML: " + f.message};
  }
  return docs;
}

}  // namespace endpointd::watcher
