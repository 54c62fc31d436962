// The one table of `endpointd run`'s options: each option's name (the flag's long name and the
// config file key), kind, default, range, help and KubeProxyConfiguration key. The CLI11 flags,
// the config decoder, `run --write-config-to` and README's option list are all made from it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config.h"
#include "daemon/option_decoder.h"

namespace endpointd::daemon {

// How an option's value is written.
enum class OptionKind : uint8_t {
  kText,      // a string as given (a path, a name)
  kSwitch,    // true or false; on the command line a flag without a value
  kBool,      // true or false, given as a value
  kInteger,   // a whole number in lo..hi
  kChoice,    // one of `choices`
  kListen,    // ADDR:PORT; empty: off
  kList,      // several values: repeated, a YAML list, or comma-separated
  kDuration,  // a duration as Go writes it (24h0m0s), or seconds
};

struct Option {
  std::string name;  // the flag's long name, without "--"
  OptionKind kind = OptionKind::kText;
  std::string value;  // how the documentation writes its value: "DIR", "ADDR:PORT", ...
  std::string help;   // `endpointd run --help`, and README's meaning
  // README only: what the one line of help leaves out.
  std::string details;
  // The config file key: the name, or empty when it is read from the command line only.
  std::string file_key;
  // The KubeProxyConfiguration key(s) converted to it (daemon/kubeproxy_config.h); empty: none.
  std::string kube_proxy;
  // A plain scalar: a KubeProxyConfiguration value that is not empty becomes this option's as it
  // is, and the conversion takes it from here. Otherwise the conversion has code of its own.
  bool kube_proxy_plain = false;
  // Written by --write-config-to; false for the file itself, the one-shot actions, old names.
  bool written = true;
  int64_t lo = 0, hi = 0;            // kInteger: the range
  std::vector<std::string> choices;  // kChoice: the values, as written
  // The default as a value (Config{}'s member as written; empty: none), and when that says
  // too little, in words ("$NODE_NAME, else the host name").
  std::string default_value;
  std::string default_note;
  // When the default follows another option: the value it took in a decoded Config, which
  // --write-config-to writes for it (default_value is the default of the default).
  std::function<std::string(const Config&)> derived;
  // Reads the option's value (from the Decoder) into the Config, with its checks.
  std::function<void(Decoder&, Config&)> decode;
};

// Every option of `endpointd run`, in the order of its --help.
const std::vector<Option>& run_options();
const Option* find_run_option(std::string_view name);

// README's option list: the Markdown between `<!-- options:begin -->` and `<!-- options:end -->`
// (`endpointd options --markdown`; scripts/gen-options puts it into README.md).
std::string options_markdown();
inline constexpr std::string_view kOptionsBegin = "<!-- options:begin -->";
inline constexpr std::string_view kOptionsEnd = "<!-- options:end -->";

}  // namespace endpointd::daemon
