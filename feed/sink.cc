// The feed sink: the gRPC server, its services and the hub that connects them to snapshots.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/codegen/service_type.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "feed/feed.h"
#include "feed/metrics.h"
#include "feed/services.h"
#include "io/small_file.h"

namespace endpointd::feed {

using io::read_small_file;

std::optional<std::pair<std::string, uint16_t>> parse_feed_listen(const std::string& s) {
  std::string host;
  std::string_view port;
  if (!s.empty() && s.front() == '[') {
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return std::nullopt;
    host = s.substr(1, close - 1);
    port = std::string_view(s).substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string::npos || s.find(':') != colon) return std::nullopt;
    host = s.substr(0, colon);
    port = std::string_view(s).substr(colon + 1);
  }
  unsigned v = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
  if (host.empty() || port.empty() || ec != std::errc() || p != port.data() + port.size() ||
      v > 65535)
    return std::nullopt;
  return std::make_pair(host, static_cast<uint16_t>(v));
}

struct FeedSink::Impl {
  FeedOptions opts;
  pipeline::AckBoard* board;
  Metrics metrics;
  Hub hub;
  std::unique_ptr<grpc::Service> watch;
  std::unique_ptr<grpc::Service> ads;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  // The grace timer: a grace passes with time, so it is checked even when no ack or snapshot
  // arrives.
  std::thread grace_timer;
  std::mutex grace_mu;
  std::condition_variable grace_cv;
  bool grace_stop = false;

  Impl(FeedOptions o, pipeline::AckBoard* b, prometheus::Registry* r)
      : opts(std::move(o)),
        board(b),
        metrics(r),
        hub(HubOptions{.max_subscribers = opts.max_streams,
                       .fanout_threads = opts.fanout_threads,
                       .grace = opts.subscriber_grace,
                       .clock = {},
                       .metrics = &metrics,
                       .holdouts =
                           [this](std::vector<Holdout> h) {
                             if (board) board->set_holdouts("feed", std::move(h));
                           },
                       .state_file = opts.state_file},
            [this](const model::SnapshotPtr& snap) {
              metrics.applied(snap->generation);
              if (board) board->applied("feed", snap);
            }) {}

  // Wakes when the next subscriber's grace passes (or a holdout is to be forgotten), and at
  // least every grace: one that starts waiting after a check lapses no sooner than the grace
  // after it.
  void run_grace_timer() {
    std::unique_lock lock(grace_mu);
    while (!grace_stop) {
      lock.unlock();
      auto next = hub.check_graces();
      lock.lock();
      auto wake = Clock::now() + opts.subscriber_grace;
      if (next && *next < wake) wake = *next;
      grace_cv.wait_until(lock, wake, [&] { return grace_stop; });
    }
  }
  void start_grace_timer() {
    if (opts.subscriber_grace.count() <= 0 || grace_timer.joinable()) return;
    {
      std::lock_guard lock(grace_mu);
      grace_stop = false;
    }
    grace_timer = std::thread([this] { run_grace_timer(); });
  }
  void stop_grace_timer() {
    if (!grace_timer.joinable()) return;
    {
      std::lock_guard lock(grace_mu);
      grace_stop = true;
    }
    grace_cv.notify_all();
    grace_timer.join();
  }
};

FeedSink::FeedSink(FeedOptions opts, pipeline::AckBoard* board, prometheus::Registry* registry)
    : impl_(std::make_unique<Impl>(std::move(opts), board, registry)) {
  if (board) board->add("feed", model::RouteView::kFeed);
}

FeedSink::~FeedSink() {
  stop();
}

Status FeedSink::start() {
  auto& im = *impl_;
  auto listen = parse_feed_listen(im.opts.listen);
  if (!listen) return Error{"feed: bad listen address '" + im.opts.listen + "' (want ADDR:PORT)"};
  const std::string addr =
      (listen->first.find(':') != std::string::npos ? "[" + listen->first + "]" : listen->first) +
      ":" + std::to_string(listen->second);

  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!im.opts.tls_cert_file.empty() || !im.opts.tls_key_file.empty()) {
    if (im.opts.tls_cert_file.empty() || im.opts.tls_key_file.empty())
      return Error{"feed: TLS needs both a certificate file and a key file"};
    auto cert = read_small_file(im.opts.tls_cert_file);
    if (!cert)
      return prefixed("feed: cannot read the TLS certificate file " + im.opts.tls_cert_file,
                      cert.error());
    auto key = read_small_file(im.opts.tls_key_file);
    if (!key)
      return prefixed("feed: cannot read the TLS key file " + im.opts.tls_key_file, key.error());
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!im.opts.tls_client_ca_file.empty()) {
      auto ca = read_small_file(im.opts.tls_client_ca_file);
      if (!ca) {
        return prefixed("feed: cannot read the client CA file " + im.opts.tls_client_ca_file,
                        ca.error());
      }
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  ServiceContext sc{&im.hub, &im.metrics, im.opts.zone};
  im.watch = make_watch_service(sc);
  im.ads = make_ads_service(sc);

  grpc::ServerBuilder b;
  b.AddListeningPort(addr, creds, &im.port);
  b.RegisterService(im.watch.get());
  b.RegisterService(im.ads.get());
  b.SetMaxReceiveMessageSize(im.opts.max_message_bytes);
  b.SetMaxSendMessageSize(im.opts.max_message_bytes);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                       static_cast<int>(im.opts.keepalive_time.count()));
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                       static_cast<int>(im.opts.keepalive_timeout.count()));
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                       static_cast<int>(im.opts.min_client_ping_interval.count()));
  b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                       static_cast<int>(im.opts.max_streams_per_connection));
  // A connection that has not finished its handshake (TLS, or HTTP/2's preface) within 10 s is
  // closed, not held for gRPC's default 120 s.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  im.server = b.BuildAndStart();
  if (!im.server || im.port == 0) {
    im.server.reset();
    return Error{"feed: cannot listen on " + addr};
  }
  if (auto* health = im.server->GetHealthCheckService()) {
    health->SetServingStatus(true);
  }
  im.start_grace_timer();
  spdlog::info("feed: serving UpstreamFeed and xDS on {} (port {})", addr, im.port);
  return {};
}

void FeedSink::stop() {
  auto& im = *impl_;
  im.stop_grace_timer();
  if (!im.server) return;
  if (auto* health = im.server->GetHealthCheckService()) health->Shutdown();
  // Open streams are cancelled at the deadline; their reactors finish and unregister.
  im.server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  im.server->Wait();
  im.server.reset();
  // The streams are gone (ghosts now): what the next process is to remember.
  im.hub.write_state();
}

uint16_t FeedSink::port() const {
  return static_cast<uint16_t>(impl_->port);
}

void FeedSink::apply(const model::SnapshotPtr& snap, const model::Delta&) {
  impl_->hub.publish(snap);
}

std::vector<SubscriberInfo> FeedSink::subscribers() const {
  return impl_->hub.infos();
}

uint64_t FeedSink::applied_generation() const {
  auto a = impl_->hub.applied();
  return a ? a->generation : 0;
}

std::vector<Holdout> FeedSink::holdouts() const {
  return impl_->hub.holdouts();
}

}  // namespace endpointd::feed
