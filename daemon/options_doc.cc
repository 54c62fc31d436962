// README's list of `endpointd run` options, made from the option table (daemon/options.h).
#include <string>

#include "daemon/options.h"

namespace endpointd::daemon {

namespace {

std::string cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    if (c == '\n') c = ' ';
    out += c;
  }
  return out;
}

std::string code(const std::string& s) {
  return s.empty() ? std::string() : "`" + s + "`";
}

}  // namespace

std::string options_markdown() {
  std::string out =
      "| option | default | values | KubeProxyConfiguration | meaning |\n"
      "|---|---|---|---|---|\n";
  for (const auto& o : run_options()) {
    std::string flag = "`--" + o.name + (o.value.empty() ? "" : " " + o.value) + "`";
    std::string def = code(o.default_value);
    if (!o.default_note.empty()) def = o.default_note;
    if (def.empty() && o.kind == OptionKind::kSwitch) def = "off";
    std::string values;
    switch (o.kind) {
      case OptionKind::kInteger:
        values = std::to_string(o.lo) + ".." + std::to_string(o.hi);
        break;
      case OptionKind::kChoice:
        for (const auto& c : o.choices) values += (values.empty() ? "" : ", ") + code(c);
        break;
      case OptionKind::kBool:
        values = "`true`, `false`";
        break;
      case OptionKind::kListen:
        values = "empty: off";
        break;
      case OptionKind::kList:
        values = "a list, or comma-separated";
        break;
      case OptionKind::kDuration:
        values = "at most 720h";
        break;
      case OptionKind::kText:
      case OptionKind::kSwitch:
        break;
    }
    std::string kp;
    for (size_t start = 0; !o.kube_proxy.empty() && start <= o.kube_proxy.size();) {
      auto comma = o.kube_proxy.find(", ", start);
      kp += (kp.empty() ? "" : ", ") +
            code(o.kube_proxy.substr(start, comma == std::string::npos ? comma : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 2;
    }
    std::string meaning = o.help + (o.help.empty() || o.help.back() == '.' ? "" : ".");
    if (!o.details.empty()) meaning += " " + o.details;
    if (o.file_key.empty()) meaning += " Command line only.";
    out += "| " + cell(flag) + " | " + cell(def) + " | " + cell(values) + " | " + cell(kp) + " | " +
           cell(meaning) + " |\n";
  }
  return out;
}

}  // namespace endpointd::daemon
