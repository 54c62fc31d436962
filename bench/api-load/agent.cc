// One agent's API load for bench/api-load: the API client exactly as `endpointd run` starts it
// (Services, EndpointSlices, every Node, this node's Pods), and nothing else. Prints
// "synced MS" once every kind has its state, then, on SIGTERM, one line of what it did.
//   api_load_agent --server URL --node NAME [--mode auto|list|cache]
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "watcher/kube_client.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop.store(true);
}
}  // namespace

int main(int argc, char** argv) {
  using namespace endpointd;
  CLI::App app{"api_load_agent: one agent's list and watch load on the API server"};
  std::string server, node, mode = "auto";
  app.add_option("--server", server, "the API server's URL")->required();
  app.add_option("--node", node, "this agent's node name")->required();
  app.add_option("--mode", mode, "auto, list or cache (--api-list-mode)")
      ->check(CLI::IsMember({"auto", "list", "cache"}));
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::warn);  // stdout is this program's report
  watcher::ClusterConfig cluster;
  cluster.server = server;
  watcher::KubeClientConfig cfg;
  cfg.node_name = node;
  cfg.watch_pods = true;
  cfg.list_mode = mode == "list"    ? watcher::ListMode::kList
                  : mode == "cache" ? watcher::ListMode::kCache
                                    : watcher::ListMode::kAuto;
  std::atomic<uint64_t> events{0};
  prometheus::Registry registry;
  watcher::KubeClient client(
      cluster, cfg, [&](model::Event) { events++; }, registry);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  const auto t0 = std::chrono::steady_clock::now();
  client.start();
  bool synced = false;
  while (!g_stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!synced && client.synced()) {
      synced = true;
      std::printf(
          "synced %.1f\n",
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      std::fflush(stdout);
    }
  }
  client.stop();
  uint64_t lists = 0, watch_lists = 0, relists = 0, pages = 0, watches = 0;
  for (auto k : client.kinds()) {
    auto s = client.stats(k);
    lists += s.lists;
    watch_lists += s.watch_lists;
    relists += s.relists;
    pages += s.list_pages;
    watches += s.watches;
  }
  std::printf("done lists=%llu watch_lists=%llu relists=%llu pages=%llu watches=%llu events=%llu\n",
              static_cast<unsigned long long>(lists), static_cast<unsigned long long>(watch_lists),
              static_cast<unsigned long long>(relists), static_cast<unsigned long long>(pages),
              static_cast<unsigned long long>(watches),
              static_cast<unsigned long long>(events.load()));
  return 0;
}
