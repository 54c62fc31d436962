// Flags and the YAML config file, decoded into one typed Config. The file takes the flags' long
// names as keys (`source-dir: /etc/endpointd/manifests`), or is a KubeProxyConfiguration; a
// flag given on the command line wins over the file. The options and their checks are the
// table in daemon/options.cc; what depends on two of them is checked in decode_config.
#include "daemon/config.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>

#include "daemon/kubeproxy_config.h"
#include "daemon/options.h"
#include "daemon/version.h"

namespace endpointd::daemon {

namespace {

// A file of endpointd's own keys: the flags' long names → their values.
Result<std::map<std::string, Given>> own_file_settings(const YAML::Node& root) {
  std::map<std::string, Given> out;
  for (const auto& kv : root) {
    if (!kv.first.IsScalar()) return Error{"config file: a key is not a name"};
    std::string key = kv.first.as<std::string>();
    Given g{"config file key " + key, {}};
    if (kv.second.IsSequence()) {
      for (const auto& v : kv.second) {
        if (!v.IsScalar())
          return Error{g.origin + ": expected a list of values, not a list of lists or maps"};
        g.values.push_back(v.as<std::string>());
      }
    } else if (kv.second.IsScalar()) {
      g.values.push_back(kv.second.as<std::string>());
    } else if (kv.second.IsNull()) {
      g.values.push_back("");
    } else {
      return Error{g.origin + ": expected a value or a list, not a map"};
    }
    out[key] = std::move(g);
  }
  return out;
}

// A KubeProxyConfiguration's mapped keys, as the flags they stand for; `notes` gets the report.
Result<std::map<std::string, Given>> kubeproxy_settings(const YAML::Node& root,
                                                        std::vector<ConfigNote>& notes) {
  Result<KubeProxyConversion> conv = Error{""};
  try {
    conv = convert_kubeproxy_configuration(root);
  } catch (const YAML::Exception& e) {
    // A shape the conversion did not expect; every known one is checked, this is the backstop.
    return Error{std::string(kKubeProxyKind) + ": " + e.msg};
  }
  if (!conv) return Error{conv.error()};
  std::map<std::string, Given> out;
  for (const auto& s : conv->settings)
    out[s.flag] = Given{std::string(kKubeProxyKind) + " key " + s.from, s.values};
  auto lines = conv->report();
  for (size_t i = 0; i < lines.size(); ++i)
    notes.push_back({i >= conv->settings.size(), std::move(lines[i])});
  return out;
}

// A config file's settings by flag name: endpointd's own keys, or a KubeProxyConfiguration's
// converted (`notes` gets its report). None for no file.
Result<std::map<std::string, Given>> file_settings(const YAML::Node* file,
                                                   std::vector<ConfigNote>& notes) {
  if (file == nullptr || file->IsNull()) return std::map<std::string, Given>{};
  if (!file->IsMap()) return Error{"config file: expected a map of settings"};
  return is_kubeproxy_configuration(*file) ? kubeproxy_settings(*file, notes)
                                           : own_file_settings(*file);
}

CLI::Option* add(CLI::App& app, const std::string& name, const std::string& help) {
  return app.add_option("--" + name)->description(help);
}

}  // namespace

Result<Config> decode_config(const RawFlags& flags, const YAML::Node* file) {
  Config cfg;
  auto from_file = file_settings(file, cfg.notes);
  if (!from_file) return Error{from_file.error()};
  RawFlags cli = flags;
  cli.erase("config");  // read by load_config
  Decoder d(cli, std::move(*from_file));
  // Each option, in the table's order, reads its value with its own checks.
  for (const Option& o : run_options()) o.decode(d, cfg);

  // What depends on two options. --drain-peer-port's default is --drain-peer-listen's port.
  if (!d.given("drain-peer-port") && cfg.drain_peer_listen && cfg.drain_peer_listen->port != 0)
    cfg.drain_peer_port = cfg.drain_peer_listen->port;
  // The interface modes of --detect-local-mode need their interface. The companion is named as
  // the mode's origin names settings: a flag, a config file key, or a KubeProxyConfiguration key.
  auto needs = [&](const std::string& value, const char* flag) {
    if (!value.empty()) return;
    std::string mode_origin = d.origin("detect-local-mode");
    std::string companion = "--" + std::string(flag);
    if (mode_origin.rfind("config file key ", 0) == 0)
      companion = "config file key " + std::string(flag);
    if (mode_origin.rfind(kKubeProxyKind, 0) == 0)
      companion = std::string(kKubeProxyKind) + " key " + find_run_option(flag)->kube_proxy;
    d.fail(mode_origin + ": \"" + std::string(to_string(cfg.detect_local_mode)) + "\" needs " +
           companion);
  };
  if (cfg.detect_local_mode == proxy::DetectLocal::kBridgeInterface)
    needs(cfg.pod_bridge_interface, "pod-bridge-interface");
  if (cfg.detect_local_mode == proxy::DetectLocal::kInterfaceNamePrefix)
    needs(cfg.pod_interface_name_prefix, "pod-interface-name-prefix");

  if (auto st = d.finish(); !st) return Error{st.error()};
  if (cfg.feed_tls_cert.empty() != cfg.feed_tls_key.empty())
    return Error{"--feed-tls-cert and --feed-tls-key go together: give both or neither"};
  if (!cfg.feed_client_ca.empty() && cfg.feed_tls_cert.empty())
    return Error{
        "--feed-client-ca needs --feed-tls-cert and --feed-tls-key (clients are "
        "verified over TLS only)"};
  if (!cfg.source_dir.empty() && !cfg.kubeconfig.empty())
    return Error{"--source-dir and --kubeconfig are exclusive: choose one source of cluster state"};
  if (cfg.dns_node_local_address && !cfg.dns_listen)
    return Error{"--dns-node-local-address needs --dns-listen: the DNS server answers on it"};
  if (cfg.dns_node_local_address && cfg.dns_listen->port == 0)
    return Error{
        "--dns-node-local-address needs a fixed --dns-listen port, not 0: it is answered on that "
        "port, which its notrack rules name"};
  return cfg;
}

Result<YAML::Node> read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{"config file " + path + ": cannot be read"};
  try {
    return YAML::Load(in);
  } catch (const YAML::Exception& e) {
    return Error{"config file " + path + ": YAML: line " + std::to_string(e.mark.line + 1) + ": " +
                 e.msg};
  }
}

namespace {
std::optional<std::string> file_content(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text;
}
}  // namespace

ConfigFileWatch::ConfigFileWatch(std::string path)
    : path_(std::move(path)), seen_(file_content(path_)) {}

bool ConfigFileWatch::changed() {
  auto now = file_content(path_);
  if (now == seen_) return false;
  seen_ = std::move(now);
  return true;
}

Result<Config> load_config(const RawFlags& flags) {
  auto it = flags.find("config");
  if (it == flags.end() || it->second.empty() || it->second.back().empty())
    return decode_config(flags, nullptr);
  auto file = read_config_file(it->second.back());
  if (!file) return Error{file.error()};
  return decode_config(flags, &*file);
}

void add_run_flags(CLI::App& app) {
  for (const Option& o : run_options()) {
    if (o.kind == OptionKind::kSwitch) {
      app.add_flag("--" + o.name)->description(o.help);
      continue;
    }
    CLI::Option* flag = app.add_option("--" + o.name)->description(o.help);
    if (!o.default_value.empty()) flag->default_str(o.default_value);
    // A list flag may be given several times; each value may hold several, comma-separated.
    if (o.kind == OptionKind::kList)
      flag->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
}

void add_render_flags(CLI::App& app) {
  add(app, "source-dir", "Directory of manifests")->required();
  add(app, "node-name", "The node to render for");
  add(app, "cluster-cidr", "Pod network CIDRs")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add(app, "nodeport-addresses", "CIDRs selecting NodePort addresses")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--masquerade-all")->description("Masquerade all service traffic");
  std::string modes;
  for (const auto& m : find_run_option("detect-local-mode")->choices)
    modes += (modes.empty() ? "" : "|") + m;
  add(app, "detect-local-mode", "How pod traffic is told from the rest: " + modes);
  add(app, "pod-bridge-interface", "The pods' bridge (BridgeInterface)");
  add(app, "pod-interface-name-prefix", "The pods' interface name prefix (InterfaceNamePrefix)");
  add(app, "service-cidr", "Service CIDRs: unallocated cluster IPs in them are dropped")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

RawFlags raw_flags(const CLI::App& app) {
  RawFlags out;
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() == 0 || o->get_lnames().empty()) continue;
    const std::string& name = o->get_lnames().front();
    if (name == "help") continue;
    out[name] = o->results();
  }
  return out;
}

Result<WrittenConfig> write_config(const CLI::App& /*app: endpointd run's*/,
                                   const RawFlags& flags) {
  std::optional<YAML::Node> root;
  if (auto it = flags.find("config");
      it != flags.end() && !it->second.empty() && !it->second.back().empty()) {
    auto r = read_config_file(it->second.back());
    if (!r) return Error{r.error()};
    root = std::move(*r);
  }
  // The same checks as `run`: nothing is written that `run` would refuse.
  auto cfg = decode_config(flags, root ? &*root : nullptr);
  if (!cfg) return Error{cfg.error()};
  std::vector<ConfigNote> notes;
  auto file = file_settings(root ? &*root : nullptr, notes);
  if (!file) return Error{file.error()};
  // Settings renamed, old name → new: the file gets the new name with the value the old one
  // gave when only the old one was (so that reading it back means the same).
  static const std::map<std::string, std::string> kRenamed = {
      {"feed-stale-after-ms", "feed-subscriber-grace-ms"}};
  auto given = [&](const std::string& name) -> std::optional<std::vector<std::string>> {
    if (auto f = flags.find(name); f != flags.end()) return f->second;
    if (auto g = file->find(name); g != file->end()) return g->second.values;
    return std::nullopt;
  };
  std::string out = std::string("# endpointd run --config: every setting of endpointd ") +
                    kVersion + ", as given or by default (--write-config-to)\n";
  // The table's settings, in its order (that of `app`'s flags); not the file itself, the
  // one-shot actions or old names.
  for (const Option& o : run_options()) {
    if (!o.written) continue;
    const std::string& name = o.name;
    std::vector<std::string> values;
    std::optional<std::vector<std::string>> old_name;
    for (const auto& [from, to] : kRenamed)
      if (to == name && !old_name) old_name = given(from);
    if (auto v = given(name)) {
      values = *v;
    } else if (old_name) {
      values = *old_name;
    } else if (o.derived) {
      values = {o.derived(*cfg)};
    } else if (!o.default_value.empty()) {
      values = {o.default_value};
    } else if (o.kind == OptionKind::kSwitch) {
      values = {"false"};  // a switch not given
    } else {
      out += "# " + name + ": (not set)\n";
      continue;
    }
    // The value as YAML writes it (quoted where a plain scalar would read otherwise).
    YAML::Emitter v;
    if (values.size() == 1) {
      v << values[0];
    } else {
      v << YAML::Flow << YAML::BeginSeq;
      for (const auto& x : values) v << x;
      v << YAML::EndSeq;
    }
    if (!v.good()) return Error{"writing " + name + ": " + v.GetLastError()};
    out += name + ": " + v.c_str() + "\n";
  }
  return WrittenConfig{std::move(out), std::move(cfg->notes)};
}

void resolve_defaults(Config& cfg) {
  if (cfg.node_name.empty()) {
    if (const char* n = std::getenv("NODE_NAME"); n && *n) {
      cfg.node_name = n;
    } else {
      char host[256] = {};
      if (gethostname(host, sizeof host - 1) == 0) cfg.node_name = host;
    }
  }
}

}  // namespace endpointd::daemon
