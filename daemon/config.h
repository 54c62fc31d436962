// `endpointd run` settings: flags, and the same keys in a YAML `--config` file.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace endpointd::daemon {

struct Config {
  std::string source_dir;
  std::string kubeconfig;
  std::string node_name;
  std::string dataplane = "nftables";
  std::string dns_listen;
  std::string dns_zone = "cluster.local";
  std::vector<std::string> dns_upstream;
  std::string feed_listen;
  std::string admin_listen = "127.0.0.1:10256";
  std::string drain_socket = "/run/endpointd/drain.sock";
  std::string drain_peer_listen = "0.0.0.0:9465";
  int drain_peer_port = 9465;
  std::string drain_peer_policy = "proceed";
  int drain_peer_timeout_ms = 5000;
  std::string drain_release_after = "drained";
  std::vector<std::string> cluster_cidr;
  bool masquerade_all = false;
  std::vector<std::string> nodeport_addresses;
  bool cleanup = false;
  std::string dns_pod_records = "insecure";
  int dns_ttl = 5;
  std::vector<std::string> dns_forward_allow;
  bool watch_pods = true;
  int watch_timeout_seconds = 300;
  int list_page_size = 500;
  std::string log_format = "text";
  std::string log_level = "info";
  std::string config_file;
};

// Adds the `run` flags to `app`, bound to `cfg`, with `--config FILE` read as YAML.
void add_run_flags(CLI::App& app, Config& cfg);
// Fills defaults that depend on the environment ($NODE_NAME, the host name, in-cluster).
void resolve_defaults(Config& cfg);
// Cross-field checks; returns a message naming what is wrong, or empty.
std::string validate(const Config& cfg);

}  // namespace endpointd::daemon
