// endpointd: the node agent's command line.
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "daemon/check.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/options.h"
#include "daemon/render.h"
#include "daemon/status.h"
#include "daemon/version.h"
#include "drain/coordinator.h"

namespace {

// `endpointd run`: the flags as given, decoded with the config file into one checked Config.
int run(const endpointd::daemon::RawFlags& flags) {
  using namespace endpointd::daemon;
  auto loaded = load_config(flags);
  if (!loaded) {
    std::cerr << "endpointd run: " << loaded.error() << "\n";
    return 2;
  }
  Config cfg = std::move(*loaded);
  resolve_defaults(cfg);
  if (cfg.cleanup) return cleanup(cfg, std::cerr);
  if (cfg.init_only) return init_only(cfg, std::cerr);
  setup_logging(cfg.log_format, cfg.log_level);
  for (const auto& note : cfg.notes) {
    if (note.warning) {
      spdlog::warn("{}", note.line);
    } else {
      spdlog::info("{}", note.line);
    }
  }
  // Signals are taken synchronously by this thread; every thread started later inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Daemon d(cfg);
  if (auto st = d.start(); !st) {
    spdlog::error("cannot start: {}", st.error());
    return 1;
  }
  // SIGHUP, or a change of the config file's content (looked at every 2 s, as a mounted
  // ConfigMap changes without a signal), reads the configuration again (Daemon::reload).
  std::optional<ConfigFileWatch> watch;
  if (auto it = flags.find("config");
      it != flags.end() && !it->second.empty() && !it->second.back().empty())
    watch.emplace(it->second.back());
  int sig = 0;
  while (true) {
    timespec every{2, 0};
    sig = sigtimedwait(&set, nullptr, &every);
    if (sig == SIGTERM || sig == SIGINT) break;
    if (sig != SIGHUP && !(watch && watch->changed())) continue;
    auto next = load_config(flags);
    if (!next) {
      spdlog::error("config reload: {}; the running configuration stays", next.error());
      continue;
    }
    resolve_defaults(*next);
    if (auto st = d.reload(*next); !st) {
      spdlog::error("config reload: {}; the running configuration stays", st.error());
    } else {
      spdlog::info("config reloaded{}: DNS options applied, other settings at the next start",
                   sig == SIGHUP ? " (SIGHUP)" : " (" + watch->path() + " changed)");
    }
  }
  auto lameduck = d.begin_lameduck();
  if (lameduck.count() > 0) {
    // Resolvers still sending here get answers until they have moved on; a second signal
    // ends the wait at once.
    spdlog::info("received {}: DNS answers for {} ms more (lameduck), readiness fails",
                 strsignal(sig), lameduck.count());
    // SIGHUP (a reload) does not end it: only SIGTERM or SIGINT, or the time.
    sigset_t stop_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGINT);
    timespec ts{static_cast<time_t>(lameduck.count() / 1000),
                static_cast<long>((lameduck.count() % 1000) * 1000000)};
    sigtimedwait(&stop_set, nullptr, &ts);
  }
  spdlog::info("received {}, stopping (the dataplane stays as it is)", strsignal(sig));
  d.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The pod-side client has its own small flag set and must stay quick to start.
  if (argc > 1 && std::string_view(argv[1]) == "prestop")
    return endpointd::drain::prestop_main(argc, argv);
  // A fixed mmap threshold: blocks of 128 KiB and more (parse buffers of a full list, netlink
  // batches of a full sync) are mapped and unmapped on their own. glibc's default raises the
  // threshold each time such a block is freed, after which they come from the heap and leave
  // it fragmented: at 10k services and 100k endpoints that held ~20 MiB more resident memory.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  CLI::App app{
      "endpointd: propagates Kubernetes endpoint changes to the node's dataplane, DNS and "
      "proxies, and drains terminating pods safely"};
  app.require_subcommand(1);

  auto* run_cmd = app.add_subcommand("run", "Run the node agent");
  endpointd::daemon::add_run_flags(*run_cmd);
  auto* render_cmd =
      app.add_subcommand("render", "Print, in nft syntax, the ruleset endpointd would program");
  endpointd::daemon::add_render_flags(*render_cmd);

  app.add_subcommand("prestop",
                     "Run from a pod's preStop hook: block until the node agent says the pod may "
                     "exit [--drain-socket PATH] [--timeout DURATION]");
  endpointd::daemon::StatusFlags status_flags;
  auto* status_cmd = app.add_subcommand(
      "status",
      "One screen from the agent's admin API: source and sync, sinks, feed subscribers, peers, "
      "drains in flight, the last releases (exit 2 when no endpointd answers)");
  endpointd::daemon::add_status_flags(*status_cmd, status_flags);
  auto* check_cmd = app.add_subcommand(
      "check",
      "Preflight before swapping kube-proxy out, with run's flags: nftables (a scratch table), "
      "conntrack, sysctls, the API and the RBAC verbs, the drain socket's directory, clock skew; "
      "exit 1 on any failure");
  endpointd::daemon::add_run_flags(*check_cmd);
  int max_skew = 5;
  check_cmd
      ->add_option("--max-clock-skew", max_skew, "Seconds of clock skew against the API allowed")
      ->capture_default_str();
  auto* version_cmd = app.add_subcommand("version", "Print the version");
  // Hidden: README's option list, made from the option table (scripts/gen-options).
  auto* options_cmd = app.add_subcommand("options", "")->group("");
  options_cmd->add_flag("--markdown")->description("README's option list, in Markdown")->required();

  CLI11_PARSE(app, argc, argv);
  if (*version_cmd) {
    std::cout << "endpointd " << endpointd::kVersion << "\n";
    return 0;
  }
  if (*options_cmd) {
    std::cout << endpointd::daemon::options_markdown();
    return 0;
  }
  if (*check_cmd)
    return endpointd::daemon::check_main(*check_cmd, std::chrono::seconds(max_skew), std::cout,
                                         std::cerr);
  if (*status_cmd) return endpointd::daemon::run_status(status_flags, std::cout, std::cerr);
  if (*run_cmd) {
    auto flags = endpointd::daemon::raw_flags(*run_cmd);
    if (auto to = flags.find("write-config-to"); to != flags.end()) {
      auto written = endpointd::daemon::write_config(*run_cmd, flags);
      if (!written) {
        std::cerr << "endpointd run: " << written.error() << "\n";
        return 2;
      }
      // What a KubeProxyConfiguration mapped and what it dropped, as `run` would log it.
      for (const auto& note : written->notes)
        std::cerr << (note.warning ? "warning: " : "") << note.line << "\n";
      const std::string& path = to->second.back();
      std::ofstream f(path, std::ios::trunc);
      f << written->text;
      f.close();
      if (!f) {
        std::cerr << "endpointd run: --write-config-to: cannot write " << path << "\n";
        return 1;
      }
      std::cerr << "endpointd: wrote the configuration to " << path << "\n";
      return 0;
    }
    return run(flags);
  }
  if (*render_cmd) {
    auto cfg = endpointd::daemon::decode_config(endpointd::daemon::raw_flags(*render_cmd), nullptr);
    if (!cfg) {
      std::cerr << "endpointd render: " << cfg.error() << "\n";
      return 2;
    }
    endpointd::daemon::resolve_defaults(*cfg);
    return endpointd::daemon::render(*cfg, std::cout, std::cerr);
  }
  return 0;
}
