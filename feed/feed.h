// The feed sink: endpointd's gRPC feed for ingress controllers and meshes, on one port —
// endpointd.v1.UpstreamFeed (its own API), Envoy's AggregatedDiscoveryService (xDS, state
// of the world and delta), the gRPC health service and server reflection. It reports
// applied(g) under "feed" when every subscriber that holds acknowledged generation g: every
// stream, and the ghost of every named one that went away, within its grace. A subscriber past
// its grace (gone, or a response unacknowledged or rejected that long) stops holding and is
// published as a holdout on the board's "feed" entry (counted, logged, shown in
// subscribers()), so drains proceed, unconfirmed where that proxy may still route to a removed
// endpoint. See feed/hub.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "feed/hub.h"
#include "model/result.h"
#include "pipeline/ack_board.h"
#include "pipeline/sink.h"

namespace prometheus {
class Registry;
}

namespace endpointd::feed {

struct FeedOptions {
  std::string listen = "127.0.0.1:0";  // "ADDR:PORT" or "[V6]:PORT"; port 0 picks a free one
  std::string zone = "cluster.local";  // the DNS zone in xDS resource names
  size_t max_streams = 4096;           // Watch and xDS streams together; more: RESOURCE_EXHAUSTED
  size_t max_streams_per_connection = 1024;
  int max_message_bytes = 16 << 20;                           // received and sent, per message
  std::chrono::milliseconds keepalive_time{30000};            // server pings an idle connection
  std::chrono::milliseconds keepalive_timeout{10000};         // and closes it without an answer
  std::chrono::milliseconds min_client_ping_interval{10000};  // faster client pings: GOAWAY
  // Threads that share one change's writes to the subscribers, the sink's own included
  // (0: one per core, at most 4; with fewer than 64 subscribers per thread, the sink's alone).
  size_t fanout_threads = 0;
  // How long a subscriber is waited for: a named one that went away (its ghost), one with a
  // response unacknowledged or rejected. Past it, it stops holding applied(g) and is a holdout,
  // so a proxy that is gone or never acknowledges cannot hold every drain until its deadline
  // (24 s). Default 10 s (why: kDefaultGrace in feed/hub.h); zero: no ghosts, no lapses.
  std::chrono::milliseconds subscriber_grace = kDefaultGrace;
  // Where the hub keeps what it knows of named subscribers across a restart (--feed-state-file;
  // see feed/hub.h): a new process holds drains for each name listed until it is back or its
  // grace passes. Empty: nothing kept (an agent that restarts knows no subscriber).
  std::string state_file;
  // TLS from PEM files when cert and key are set; with a client CA, clients must present a
  // certificate it signed.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
};

class FeedSink : public pipeline::Sink {
 public:
  // `board` and `registry` may be null. The sink registers itself on the board as "feed".
  FeedSink(FeedOptions opts, pipeline::AckBoard* board, prometheus::Registry* registry);
  ~FeedSink() override;
  FeedSink(const FeedSink&) = delete;
  FeedSink& operator=(const FeedSink&) = delete;

  // Binds and starts serving. Subscribers get their first answer once a synced snapshot was
  // applied.
  Status start();
  // Ends every stream (UNAVAILABLE) and stops the server.
  void stop();
  uint16_t port() const;  // the bound port, after start()

  std::string name() const override { return "feed"; }
  void apply(const model::SnapshotPtr& snap, const model::Delta& delta) override;

  // For /debug/state: one row per stream (subscription, versions sent and acked, NACKs), then
  // one per ghost (connected false).
  std::vector<SubscriberInfo> subscribers() const;
  // The generation every subscriber that holds acknowledged (0 before the first synced
  // snapshot).
  uint64_t applied_generation() const;
  // What is on the board's "feed" entry as holdouts.
  std::vector<Holdout> holdouts() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Parses "ADDR:PORT" / "[V6]:PORT"; nullopt when malformed.
std::optional<std::pair<std::string, uint16_t>> parse_feed_listen(const std::string& s);

}  // namespace endpointd::feed
