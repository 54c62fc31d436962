// How `endpointd run` reads one option's value: from the command line, else the config file,
// with the checks every option of a kind shares and errors that name where the value came from.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/config.h"
#include "model/hostport.h"
#include "model/ip.h"
#include "model/result.h"

namespace endpointd::daemon {

// One setting's value as written, and where it was written.
struct Given {
  std::string origin;  // "--dns-ttl", "config file key dns-ttl", "KubeProxyConfiguration key ..."
  std::vector<std::string> values;  // one per occurrence or list element; commas not yet split
};

// Takes each setting from the command line, else the file; remembers the first error and which
// file keys and flags no setting took. Every error names where the bad value came from.
class Decoder {
 public:
  Decoder(const RawFlags& flags, std::map<std::string, Given> file);

  bool given(const std::string& name) const { return flags_.count(name) || file_.count(name); }
  // Where `name` was given ("--x", "config file key x", ...); empty when it was not.
  std::string origin(const std::string& name) const;
  std::optional<Given> take(const std::string& name);

  void fail(const std::string& message);
  void fail(const Given& g, std::string_view value, const std::string& what);
  // An error about the value one() read last.
  void fail_last(std::string_view value, const std::string& what) { fail(last_, value, what); }
  // Where the value one() read last came from ("--dns-ttl", "config file key dns-ttl", ...).
  const std::string& last_origin() const { return last_.origin; }

  // The one value of a single-valued setting, trimmed, or null (not given, or an error).
  std::optional<std::string> one(const std::string& name);
  std::string text(const std::string& name, std::string def);
  bool boolean(const std::string& name, bool def);
  // `names[i]` gives `values[i]`.
  std::optional<size_t> choice(const std::string& name, const std::vector<std::string>& names);
  int64_t integer(const std::string& name, int64_t lo, int64_t hi, int64_t def);

  enum class Host { kAny, kRequired, kIp };
  // "ADDR:PORT"; empty: off.
  std::optional<model::HostPort> listen(const std::string& name, Host host,
                                        std::optional<model::HostPort> def);
  // A list setting: elements of a list, each possibly comma-separated. Empty elements are
  // skipped, so an empty value gives an empty list.
  std::optional<std::pair<Given, std::vector<std::string>>> list(const std::string& name);
  // `primary_ok`: the word "primary" alone stands for the node's primary IPs (an empty list).
  std::vector<model::IpPrefix> cidrs(const std::string& name, bool primary_ok = false);
  // "ADDR[:PORT]" of DNS servers: IP addresses, port 53 unless given.
  std::vector<model::HostPort> upstreams(const std::string& name);

  // Every flag and file key some setting took; otherwise the first one left names the error.
  Status finish();

 private:
  std::map<std::string, Given> flags_;
  std::map<std::string, Given> file_;
  std::set<std::string> taken_;
  Given last_;  // the setting one() read last, for its error
  std::string error_;
};

}  // namespace endpointd::daemon
