// endpointd-fakeapi: serves a directory of manifests (or a JSON state file) over the
// Kubernetes list/watch protocol, for end-to-end tests and demos without a cluster. The
// directory is re-read periodically; changes become watch events.
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "tests/fakeapi/fake_api.h"

namespace {
std::atomic<bool> g_stop{false};
std::atomic<bool> g_expire{false};
std::atomic<bool> g_stats{false};
void on_signal(int) {
  g_stop.store(true);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"endpointd-fakeapi: a fake Kubernetes API server over a manifest directory"};
  std::string listen = "127.0.0.1:0";
  std::string dir;
  std::string token;
  std::string tls_cert, tls_key, client_ca;
  int poll_ms = 1000;
  size_t threads = 64;
  int bookmark_ms = 60000;
  app.add_option("--listen", listen, "ADDR:PORT to listen on (port 0: any)");
  app.add_option("--dir", dir, "directory of *.json / *.yaml manifests (or a single file)")
      ->required();
  app.add_option("--token", token, "require this bearer token");
  app.add_option("--tls-cert", tls_cert, "serve HTTPS with this certificate");
  app.add_option("--tls-key", tls_key, "key of --tls-cert");
  app.add_option("--client-ca", client_ca, "require client certificates signed by this CA");
  app.add_option("--poll-ms", poll_ms, "re-read the directory this often (0: never)");
  app.add_option("--threads", threads,
                 "requests served at once; every open watch holds one (agents x kinds)")
      ->check(CLI::Range(1, 20000));
  app.add_option("--bookmark-ms", bookmark_ms,
                 "a BOOKMARK to every watch that asked for them this often, as the API server's "
                 "watch cache sends one about every minute (0: never)")
      ->check(CLI::Range(0, 3600000));
  std::string watch_list = "on";
  app.add_option("--watch-list", watch_list,
                 "WatchList (sendInitialEvents) as kube-apiserver with the feature on, off (422) "
                 "or from before it (ignored)")
      ->check(CLI::IsMember({"on", "off", "ignored"}));
  std::string stats_file;
  app.add_option("--stats-file", stats_file,
                 "on SIGUSR2 and at exit, write requests, lists, watches and body bytes served "
                 "here as one JSON line; SIGUSR1 expires every watch (a relist storm)");
  std::vector<std::string> deny;
  app.add_option("--deny", deny,
                 "VERB:GROUP/RESOURCE a SelfSubjectAccessReview is refused (GROUP empty for the "
                 "core group: list:/pods)");
  CLI11_PARSE(app, argc, argv);

  endpointd::fakeapi::Options opts;
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    std::cerr << "--listen must be ADDR:PORT\n";
    return 2;
  }
  opts.host = listen.substr(0, colon);
  opts.port = std::stoi(listen.substr(colon + 1));
  opts.threads = threads;
  opts.bookmark_interval = std::chrono::milliseconds(bookmark_ms);
  opts.watch_list = watch_list == "off"       ? endpointd::fakeapi::Options::WatchList::kOff
                    : watch_list == "ignored" ? endpointd::fakeapi::Options::WatchList::kIgnored
                                              : endpointd::fakeapi::Options::WatchList::kOn;
  if (!tls_cert.empty()) opts.tls = endpointd::fakeapi::TlsOptions{tls_cert, tls_key, client_ca};
  endpointd::fakeapi::FakeApiServer server(opts);
  if (!server.ok()) {
    std::cerr << "endpointd-fakeapi: " << server.error() << "\n";
    return 1;
  }
  if (!token.empty()) server.set_required_token(token);
  for (const auto& d : deny) {
    auto colon = d.find(':');
    auto slash = d.find('/', colon == std::string::npos ? 0 : colon);
    if (colon == std::string::npos || slash == std::string::npos) {
      std::cerr << "--deny must be VERB:GROUP/RESOURCE\n";
      return 2;
    }
    server.deny_access(d.substr(0, colon), d.substr(colon + 1, slash - colon - 1),
                       d.substr(slash + 1));
  }

  auto load = [&] {
    std::vector<std::string> errors;
    auto objects = endpointd::fakeapi::load_manifest_dir(dir, &errors);
    for (const auto& e : errors) std::cerr << "endpointd-fakeapi: " << e << "\n";
    server.replace_all(objects);
  };
  load();
  // Before the port is told: a signal sent as soon as it is must not find the default action.
  std::signal(SIGUSR1, [](int) { g_expire.store(true); });
  std::signal(SIGUSR2, [](int) { g_stats.store(true); });
  std::cout << server.port() << std::endl;
  std::cerr << "endpointd-fakeapi: serving " << dir << " on " << server.url() << " ("
            << server.object_count("services") << " services, "
            << server.object_count("endpointslices") << " endpointslices)\n";

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  auto write_stats = [&] {
    if (stats_file.empty()) return;
    size_t lists = 0, watches = 0;
    const auto requests = server.requests();
    for (const auto& r : requests) (r.is_watch() ? watches : lists)++;
    std::ofstream f(stats_file + ".tmp");
    f << "{\"requests\":" << requests.size() << ",\"lists\":" << lists << ",\"watches\":" << watches
      << ",\"body_bytes\":" << server.body_bytes_sent()
      << ",\"open_watches\":" << server.open_watches() << "}\n";
    f.close();
    std::filesystem::rename(stats_file + ".tmp", stats_file);
  };
  auto last = std::chrono::steady_clock::now();
  while (!g_stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_expire.exchange(false)) {
      server.expire_all_watches();
    }
    if (g_stats.exchange(false)) write_stats();
    if (poll_ms > 0 &&
        std::chrono::steady_clock::now() - last >= std::chrono::milliseconds(poll_ms)) {
      last = std::chrono::steady_clock::now();
      load();
    }
  }
  write_stats();
  return 0;
}
