// endpointd-haproxy: keeps HAProxy backends' servers equal to the endpoints endpointd's
// UpstreamFeed sends, through HAProxy's runtime API (no reload), and acknowledges a version
// only once HAProxy shows it applied. See README.md beside this file.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "adapters/haproxy/adapter.h"
#include "adapters/haproxy/feed_client.h"
#include "adapters/haproxy/metrics.h"
#include "adapters/haproxy/runtime.h"
#include "adapters/haproxy/sync.h"
#include "model/hostport.h"

namespace endpointd::haproxy {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Flags {
  std::string feed;
  std::string feed_ca, feed_cert, feed_key;
  std::string socket;
  std::vector<std::string> backends;
  std::string client_name = "endpointd-haproxy";
  int runtime_timeout_ms = 2000;
  int resync_ms = 10000;
  int retry_max_ms = 5000;
  uint32_t server_id_base = 1000000;
  std::string metrics_listen;
  std::string log_level = "info";
};

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{"cannot read " + path};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<std::shared_ptr<grpc::ChannelCredentials>> credentials(const Flags& f) {
  if (f.feed_ca.empty() && f.feed_cert.empty() && f.feed_key.empty())
    return grpc::InsecureChannelCredentials();
  if (f.feed_cert.empty() != f.feed_key.empty())
    return Error{"--feed-cert and --feed-key go together"};
  grpc::SslCredentialsOptions o;
  for (auto [path, out] :
       {std::pair{&f.feed_ca, &o.pem_root_certs}, std::pair{&f.feed_cert, &o.pem_cert_chain},
        std::pair{&f.feed_key, &o.pem_private_key}}) {
    if (path->empty()) continue;
    auto text = read_file(*path);
    if (!text) return Error{text.error()};
    *out = std::move(*text);
  }
  return grpc::SslCredentials(o);
}

// The sync loop: waits for a new feed state or the next retry/resync, runs a pass over
// HAProxy, and acknowledges the version when the pass confirmed it.
class Loop {
 public:
  Loop(const Flags& f, std::vector<Mapping> mappings, FeedClient& feed, RuntimeApi& api,
       Metrics& metrics)
      : flags_(f),
        mappings_(std::move(mappings)),
        feed_(feed),
        syncer_(api, f.server_id_base),
        metrics_(metrics) {}

  void run(const std::atomic<bool>& stopping) {
    const milliseconds retry_min(100), retry_max(flags_.retry_max_ms);
    milliseconds backoff = retry_min;
    std::optional<FeedClient::View> view;
    uint64_t seen = 0;
    auto next = Clock::now() + std::chrono::hours(1);  // nothing to do before the first state
    while (!stopping) {
      if (auto v = feed_.wait(seen, next)) {
        seen = v->seq;
        view = std::move(v);
        on_new_view(*view);
      } else if (stopping || Clock::now() < next) {
        continue;
      }
      if (!view) continue;

      const uint64_t version = view->state.version;
      SyncReport rep = syncer_.sync(desired_);
      metrics_.commands.Increment(static_cast<double>(rep.commands));
      metrics_.runtime_errors.Increment(static_cast<double>(rep.errors));
      metrics_.collisions_seen.Increment(static_cast<double>(rep.new_collisions));
      metrics_.collisions.Set(static_cast<double>(rep.collisions));
      metrics_.pending_deletions.Set(static_cast<double>(rep.pending_deletions));
      if (!rep.applied) {
        metrics_.syncs_failed.Increment();
        spdlog::error(
            "version {} not acknowledged: HAProxy has not confirmed it ({}); retrying in "
            "{} ms",
            version, rep.first_error.empty() ? "see above" : rep.first_error, backoff.count());
        next = Clock::now() + backoff;
        backoff = std::min(backoff * 2, retry_max);
        continue;
      }
      metrics_.syncs_applied.Increment();
      backoff = retry_min;
      // Removed endpoints whose connections still run are tried again every second.
      next = Clock::now() +
             (rep.pending_deletions > 0 ? milliseconds(1000) : milliseconds(flags_.resync_ms));
      if (acked_stream_ == view->stream && acked_version_ >= version) continue;
      if (feed_.ack(view->stream, version)) {
        acked_stream_ = view->stream;
        acked_version_ = version;
        metrics_.acked_version.Set(static_cast<double>(version));
        spdlog::info("version {} applied by HAProxy and acknowledged", version);
      } else {
        spdlog::warn("version {} applied, but its feed stream ended before the ack", version);
      }
    }
  }

 private:
  void on_new_view(const FeedClient::View& v) {
    Desired d = desired(v.state, mappings_);
    std::set<std::string> now(d.skipped.begin(), d.skipped.end());
    for (const auto& s : now) {
      if (skipped_.count(s)) continue;
      metrics_.skipped_endpoints.Increment();
      spdlog::warn(
          "feed: {} cannot be an HAProxy server (not an IP address, port 0, or no routing "
          "verdict); skipped",
          s);
    }
    skipped_ = std::move(now);
    desired_ = std::move(d);
  }

  const Flags& flags_;
  std::vector<Mapping> mappings_;
  FeedClient& feed_;
  Syncer syncer_;
  Metrics& metrics_;
  Desired desired_;
  std::set<std::string> skipped_;
  uint64_t acked_stream_ = 0;
  uint64_t acked_version_ = 0;
};

int run(const Flags& f) {
  const std::set<std::string> levels = {"trace", "debug", "info", "warn", "error"};
  if (!levels.count(f.log_level)) {
    spdlog::critical("--log-level {}: not one of trace, debug, info, warn, error", f.log_level);
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(f.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %L %v", spdlog::pattern_time_type::utc);
  spdlog::flush_on(spdlog::level::info);

  std::vector<Mapping> mappings;
  for (const auto& b : f.backends) {
    auto m = parse_mapping(b);
    if (!m) {
      spdlog::critical("{}", m.error());
      return 2;
    }
    mappings.push_back(*m);
  }
  if (auto st = check_mappings(mappings); !st) {
    spdlog::critical("{}", st.error());
    return 2;
  }
  if (f.runtime_timeout_ms <= 0 || f.resync_ms <= 0 || f.retry_max_ms <= 0) {
    spdlog::critical("--runtime-timeout-ms, --resync-ms and --retry-max-ms must be positive");
    return 2;
  }
  auto creds = credentials(f);
  if (!creds) {
    spdlog::critical("{}", creds.error());
    return 2;
  }

  // SIGTERM/SIGINT are taken by sigwait on this thread; every thread started below inherits
  // the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Metrics metrics;
  std::unique_ptr<MetricsServer> metrics_server;
  if (!f.metrics_listen.empty()) {
    auto hp = model::parse_host_port(f.metrics_listen);
    if (!hp) {
      spdlog::critical("--metrics-listen: {}", hp.error());
      return 2;
    }
    metrics_server = std::make_unique<MetricsServer>(metrics.registry);
    if (auto st = metrics_server->start(*hp); !st) {
      spdlog::critical("{}", st.error());
      return 1;
    }
  }

  SocketRuntime runtime(f.socket, milliseconds(f.runtime_timeout_ms));
  FeedClient feed({f.feed, *creds, subscription(mappings, f.client_name)}, metrics);
  for (const auto& m : mappings)
    spdlog::info("service {}/{} port {} → backend {}", m.ns, m.service, m.port, m.backend);
  spdlog::info("feed {}{}; {}", f.feed, f.feed_ca.empty() ? "" : " (TLS)", runtime.describe());

  std::atomic<bool> stopping{false};
  Loop loop(f, mappings, feed, runtime, metrics);
  feed.start();
  std::thread worker([&] { loop.run(stopping); });

  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("received {}, stopping (HAProxy keeps its servers as they are)", strsignal(sig));
  stopping = true;
  feed.stop();  // wakes the loop
  worker.join();
  if (metrics_server) metrics_server->stop();
  return 0;
}

}  // namespace
}  // namespace endpointd::haproxy

int main(int argc, char** argv) {
  endpointd::haproxy::Flags f;
  CLI::App app{
      "endpointd-haproxy: keeps the servers of HAProxy backends equal to the endpoints of "
      "Kubernetes services, from endpointd's UpstreamFeed, over HAProxy's runtime API (no "
      "reload).\n"
      "Each --backend NAMESPACE/SERVICE:PORT=BACKEND maps a service port (the Service's port "
      "number) to a backend declared in haproxy.cfg (with a dynamic balance algorithm such as "
      "roundrobin or leastconn). Servers are named <address>_<port> and added with an id at or "
      "above --server-id-base, which is how the adapter knows its own; a server of haproxy.cfg "
      "with the same name is never touched and is reported.\n"
      "Example: endpointd-haproxy --feed 127.0.0.1:18000 --haproxy-socket "
      "/run/haproxy/admin.sock --backend demo/web:80=be_web"};
  app.add_option("--feed", f.feed, "endpointd's feed, ADDR:PORT (a gRPC target)")->required();
  app.add_option("--feed-ca", f.feed_ca,
                 "PEM file: CA of the feed's certificate (any --feed-* file turns TLS on; without "
                 "this one, the system's roots)");
  app.add_option("--feed-cert", f.feed_cert, "PEM file: client certificate for the feed (TLS)");
  app.add_option("--feed-key", f.feed_key, "PEM file: the client certificate's key");
  app.add_option("--haproxy-socket", f.socket,
                 "HAProxy's runtime API unix socket (stats socket ... level admin)")
      ->required();
  app.add_option("--backend", f.backends,
                 "NAMESPACE/SERVICE:PORT=BACKEND, e.g. demo/web:80=be_web (repeatable; a "
                 "backend at most once)")
      ->required();
  app.add_option("--client-name", f.client_name,
                 "The identity endpointd knows this HAProxy by (one per HAProxy on a node): "
                 "while it reconnects, what it last acknowledged still holds drains")
      ->capture_default_str();
  app.add_option("--runtime-timeout-ms", f.runtime_timeout_ms,
                 "Bound of each runtime-API call (connect, send, answer)")
      ->capture_default_str();
  app.add_option("--resync-ms", f.resync_ms,
                 "Interval of the pass that re-reads HAProxy and repairs drift (e.g. after an "
                 "HAProxy restart)")
      ->capture_default_str();
  app.add_option("--retry-max-ms", f.retry_max_ms,
                 "Longest wait between retries while HAProxy does not confirm a version")
      ->capture_default_str();
  app.add_option("--server-id-base", f.server_id_base,
                 "Servers the adapter adds get ids from here up; haproxy.cfg must not use them")
      ->capture_default_str();
  app.add_option("--metrics-listen", f.metrics_listen,
                 "ADDR:PORT for /metrics and /healthz (empty: off)");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return endpointd::haproxy::run(f);
}
