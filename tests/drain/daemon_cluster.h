// `endpointd run` on every node of a namespace cluster, exactly as scripts/demo starts it, with
// peers over mutual TLS; the manifest directory is a copy of examples/cluster whose web.yaml and
// pods.yaml the test rewrites (Scenario::write). Shared by the drain-ordering tests with the
// real daemon (daemon_drain_test, nginx_drain_test).
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/drain/scenario.h"
#include "tests/netns/cluster.h"
#include "tests/support/test_certs.h"

namespace endpointd::drain::testing {

inline const std::string kAdmin = "http://127.0.0.1:10249";

// The scenario with `endpointd run` on both nodes; the manifest directory is a copy of
// examples/cluster whose web.yaml and pods.yaml the test rewrites.
class DaemonCluster : public Scenario {
 public:
  explicit DaemonCluster(const std::string& manifests = "daemon-drain-manifests",
                         netns::ClusterSpec spec = netns::ClusterSpec::demo())
      : Scenario(manifests, true, std::move(spec)) {
    std::filesystem::remove_all(manifest_dir());
    std::filesystem::copy(std::string(ENDPOINTD_SOURCE_ROOT) + "/examples/cluster", manifest_dir(),
                          std::filesystem::copy_options::recursive);
    write();
    // Peers over mutual TLS, as the chart deploys them: a CA and a certificate per node.
    std::filesystem::remove_all(pki_dir());
    std::filesystem::create_directories(pki_dir());
    pki_error_ = endpointd::testing::make_node_certs(pki_dir(), {"node-a", "node-b"});
  }
  std::string pki_dir() const { return netns::scratch_dir() + "/daemon-drain-pki"; }
  const std::string& pki_error() const { return pki_error_; }
  ~DaemonCluster() {
    for (auto& [n, p] : daemons_) p->stop();
  }

  // The daemon exactly as scripts/demo starts it (no DNS here).
  void start_daemon(const std::string& node, const std::string& log_suffix = "") {
    std::vector<std::string> argv = {bin(),
                                     "run",
                                     "--source-dir",
                                     manifest_dir(),
                                     "--dataplane",
                                     "nftables",
                                     "--node-name",
                                     node,
                                     "--cluster-cidr",
                                     "10.244.0.0/16",
                                     "--admin-listen",
                                     "127.0.0.1:10249",
                                     "--drain-socket",
                                     socket_of(node),
                                     "--drain-peer-timeout-ms",
                                     "3000",
                                     "--drain-peer-ca",
                                     pki_dir() + "/ca.crt",
                                     "--drain-peer-cert",
                                     pki_dir() + "/" + node + ".crt",
                                     "--drain-peer-key",
                                     pki_dir() + "/" + node + ".key"};
    if (auto it = extra_args_.find(node); it != extra_args_.end())
      argv.insert(argv.end(), it->second.begin(), it->second.end());
    daemons_[node] = &cluster().node(node).spawn(argv, "endpointd-" + node + log_suffix + ".log");
  }
  netns::Process& daemon(const std::string& node) { return *daemons_.at(node); }
  // Both nodes' daemons started and ready (the failure names which, with its log).
  ::testing::AssertionResult start_both() {
    start_daemon("node-a");
    start_daemon("node-b");
    for (const char* node : {"node-a", "node-b"})
      if (!wait_ready(node))
        return ::testing::AssertionFailure() << node << " not ready: " << daemon(node).log();
    return ::testing::AssertionSuccess();
  }
  // More flags for one node's daemon (the next start_daemon takes them).
  void set_extra_args(const std::string& node, std::vector<std::string> args) {
    extra_args_[node] = std::move(args);
  }
  bool wait_ready(const std::string& node) {
    for (int i = 0; i < 200; ++i) {
      if (cluster().node(node).exec({"curl", "-fs", "--max-time", "1", kAdmin + "/readyz"}).ok())
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  std::string debug_state(const std::string& node) {
    return cluster()
        .node(node)
        .exec({"curl", "-fs", "--max-time", "2", kAdmin + "/debug/state"})
        .output;
  }

  static std::string bin() { return ENDPOINTD_BIN_PATH; }

 private:
  std::map<std::string, netns::Process*> daemons_;
  std::map<std::string, std::vector<std::string>> extra_args_;
  std::string pki_error_;
};

// One drain's timeline from a daemon's /debug/state.
std::optional<Timeline> read_timeline(const std::string& state, const std::string& ip) {
  auto drains = state.find("\"drains\"");
  if (drains == std::string::npos) return std::nullopt;
  return find_timeline(state.substr(drains), ip);
}

}  // namespace endpointd::drain::testing
