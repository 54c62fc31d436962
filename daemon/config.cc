// Flags and the YAML config file. The file takes the flags' long names as keys
// (`source-dir: /etc/endpointd/manifests`); a flag given on the command line wins.
#include "daemon/config.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "daemon/kubeproxy_config.h"
#include "model/hostport.h"
#include "model/ip.h"

namespace endpointd::daemon {

namespace {

// What a KubeProxyConfiguration file mapped and ignored, one line per key, logged by
// validate(): the file is read before logging is set up.
std::mutex report_mu;
std::vector<std::pair<bool, std::string>> pending_report;  // (ignored?, line)

class YamlConfig : public CLI::Config {
 public:
  std::string to_config(const CLI::App*, bool, bool, std::string) const override { return {}; }

  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    std::vector<CLI::ConfigItem> items;
    YAML::Node root;
    try {
      root = YAML::Load(in);
    } catch (const YAML::Exception& e) {
      throw CLI::ParseError(
          "config file: YAML: line " + std::to_string(e.mark.line + 1) + ": " + e.msg,
          CLI::ExitCodes::ConfigError);
    }
    if (root.IsNull()) return items;
    if (!root.IsMap())
      throw CLI::ParseError("config file: expected a map of settings", CLI::ExitCodes::ConfigError);
    if (is_kubeproxy_configuration(root)) {
      auto conv = convert_kubeproxy_configuration(root);
      if (!conv.error.empty())
        throw CLI::ParseError("config file: KubeProxyConfiguration: " + conv.error,
                              CLI::ExitCodes::ConfigError);
      for (auto& st : conv.settings) {
        CLI::ConfigItem item;
        item.name = st.flag;
        item.inputs = st.values;
        items.push_back(std::move(item));
      }
      std::lock_guard lock(report_mu);
      auto lines = conv.report();
      for (size_t i = 0; i < lines.size(); ++i)
        pending_report.emplace_back(i >= conv.settings.size(), lines[i]);
      return items;
    }
    for (const auto& kv : root) {
      CLI::ConfigItem item;
      item.name = kv.first.as<std::string>();
      if (kv.second.IsSequence()) {
        for (const auto& v : kv.second) item.inputs.push_back(v.as<std::string>());
      } else if (kv.second.IsScalar()) {
        item.inputs.push_back(kv.second.as<std::string>());
      } else if (kv.second.IsNull()) {
        item.inputs.push_back("");
      } else {
        throw CLI::ParseError("config file: " + item.name + ": expected a value or a list",
                              CLI::ExitCodes::ConfigError);
      }
      items.push_back(std::move(item));
    }
    return items;
  }
};

}  // namespace

void add_run_flags(CLI::App& app, Config& cfg) {
  app.config_formatter(std::make_shared<YamlConfig>());
  app.set_config("--config", "", "YAML file with the same keys as the flags");
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_option("--source-dir", cfg.source_dir,
                 "Watch a directory of manifests instead of the Kubernetes API");
  app.add_option("--kubeconfig", cfg.kubeconfig,
                 "kubeconfig file (default: in-cluster when KUBERNETES_SERVICE_HOST is set)");
  app.add_option("--node-name", cfg.node_name,
                 "This node's name (default $NODE_NAME, else the host name)");
  app.add_option("--dataplane", cfg.dataplane, "Service dataplane to program")
      ->check(CLI::IsMember({"nftables", "none"}))
      ->capture_default_str();
  app.add_option("--dns-listen", cfg.dns_listen, "ADDR:PORT for the DNS server (empty: DNS off)");
  app.add_option("--dns-zone", cfg.dns_zone, "Cluster DNS zone")->capture_default_str();
  app.add_option("--dns-upstream", cfg.dns_upstream,
                 "Upstream DNS servers ADDR[:PORT],... (default: /etc/resolv.conf)")
      ->delimiter(',');
  app.add_option("--feed-listen", cfg.feed_listen,
                 "ADDR:PORT for the gRPC feed and xDS (empty: off)");
  app.add_option("--admin-listen", cfg.admin_listen,
                 "ADDR:PORT for /healthz, /readyz, /livez, /metrics, /debug/state")
      ->capture_default_str();
  app.add_option("--drain-socket", cfg.drain_socket, "Unix socket that pods' prestop calls reach")
      ->capture_default_str();
  app.add_option("--drain-peer-listen", cfg.drain_peer_listen,
                 "ADDR:PORT where peer agents ask this one to confirm removals (empty: off)")
      ->capture_default_str();
  app.add_option("--drain-peer-port", cfg.drain_peer_port,
                 "Port of the peer agents, at their Node's InternalIP")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--drain-peer-policy", cfg.drain_peer_policy,
                 "At a peer's deadline: proceed (and count it) or wait (until the grace budget)")
      ->check(CLI::IsMember({"proceed", "wait"}))
      ->capture_default_str();
  app.add_option("--drain-peer-timeout-ms", cfg.drain_peer_timeout_ms,
                 "Each peer's deadline to confirm a removal")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  app.add_option("--drain-release-after", cfg.drain_release_after,
                 "Default release point (a pod's endpointd.io/release-after annotation wins): "
                 "removed or drained")
      ->check(CLI::IsMember({"removed", "drained"}))
      ->capture_default_str();
  app.add_option("--cluster-cidr", cfg.cluster_cidr,
                 "Pod network CIDRs, for local-traffic detection")
      ->delimiter(',');
  app.add_flag("--masquerade-all", cfg.masquerade_all,
               "Masquerade all traffic to services, not only traffic from outside the cluster");
  app.add_option("--nodeport-addresses", cfg.nodeport_addresses,
                 "CIDRs selecting the node addresses NodePorts are served on (default: all)")
      ->delimiter(',');
  app.add_flag("--cleanup", cfg.cleanup,
               "Delete endpointd's nftables tables and exit (the agent never does so on its own)");
  app.add_option("--dns-pod-records", cfg.dns_pod_records,
                 "Pod A records a-b-c-d.<ns>.pod.<zone>: disabled, insecure or verified")
      ->check(CLI::IsMember({"disabled", "insecure", "verified"}))
      ->capture_default_str();
  app.add_option("--dns-ttl", cfg.dns_ttl, "TTL of cluster records, in seconds")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  app.add_option("--dns-forward-allow", cfg.dns_forward_allow,
                 "Client CIDRs that may use forwarding (default: loopback and private ranges)")
      ->delimiter(',');
  app.add_option("--watch-pods", cfg.watch_pods, "Watch this node's pods (needed for drains)")
      ->capture_default_str();
  app.add_option("--watch-timeout", cfg.watch_timeout_seconds,
                 "Seconds a watch request stays open before it is renewed")
      ->check(CLI::Range(10, 3600))
      ->capture_default_str();
  app.add_option("--list-page-size", cfg.list_page_size, "Objects per list page")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--log-format", cfg.log_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--log-level", cfg.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  // CLI11 (2.1) reads the config file of the main app only: on a subcommand (`endpointd run`)
  // `--config` was parsed but the file never applied. Apply it here, after the command line,
  // to the options the command line did not give, with the same checks.
  app.callback([&app] {
    if (app.get_parent() == nullptr) return;  // CLI11 applies the main app's file itself
    CLI::Option* c = app.get_config_ptr();
    if (c == nullptr || c->count() == 0) return;
    std::string path = c->as<std::string>();
    if (path.empty()) return;
    std::ifstream in(path);
    if (!in) throw CLI::FileError::Missing(path);
    for (const auto& item : app.get_config_formatter()->from_config(in)) {
      CLI::Option* opt = app.get_option_no_throw("--" + item.name);
      if (opt == nullptr || opt == c) throw CLI::ConfigError::Extras(item.fullname());
      if (opt->count() > 0) continue;  // the command line wins
      opt->add_result(item.inputs);
      opt->run_callback();
    }
  });
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

std::string validate(const Config& cfg) {
  {
    std::lock_guard lock(report_mu);
    for (const auto& [ignored, line] : pending_report) {
      if (ignored) {
        spdlog::warn("{}", line);
      } else {
        spdlog::info("{}", line);
      }
    }
    pending_report.clear();
  }
  for (const auto& [name, value] :
       {std::pair<const char*, const std::string&>{"--dns-listen", cfg.dns_listen},
        {"--feed-listen", cfg.feed_listen},
        {"--admin-listen", cfg.admin_listen}}) {
    if (value.empty()) continue;
    if (auto hp = model::parse_host_port(value); !hp) return std::string(name) + ": " + hp.error();
  }
  for (const auto& [flag, list] :
       {std::pair<const char*, const std::vector<std::string>&>{"--cluster-cidr", cfg.cluster_cidr},
        {"--nodeport-addresses", cfg.nodeport_addresses},
        {"--dns-forward-allow", cfg.dns_forward_allow}})
    for (const auto& c : list)
      if (!model::IpPrefix::parse(c)) return std::string(flag) + ": \"" + c + "\" is not a CIDR";
  if (!cfg.source_dir.empty() && !cfg.kubeconfig.empty())
    return "--source-dir and --kubeconfig are exclusive: choose one source of cluster state";
  return {};
}

}  // namespace endpointd::daemon
