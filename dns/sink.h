// The DNS sink: builds the zone of each snapshot on the sink's thread, swaps it in for the
// server's workers, reports applied(g) to the acknowledgement board, and publishes on its board
// entry, as data, when the last answer that carried each address that may matter to a drain
// expires (`pipeline::AnswerExpiry`): every address answered from records that left the zone,
// and every terminating or unready endpoint's and terminating pod's address answered at all.
// Published before each applied(g), and again whenever it changes, looked at every
// `kAnswersTick` (answers keep being given between applies: by a worker still holding an
// older zone, by pod records). Nobody calls into the sink for it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dns/forwarder.h"
#include "dns/metrics.h"
#include "dns/server.h"
#include "dns/zone.h"
#include "pipeline/ack_board.h"
#include "pipeline/sink.h"

namespace prometheus {
class Registry;
}

namespace endpointd::dns {

struct DnsOptions {
  std::string listen = "127.0.0.1:53";  // "ADDR:PORT" or "[V6]:PORT"; port 0 picks a free one
  std::string zone = "cluster.local";
  // CoreDNS's additional zones (`kubernetes cluster.local example.com`): the same names under
  // each, built by a builder of their own; reverse (PTR) names only under `zone`.
  std::vector<std::string> extra_zones;
  std::vector<std::string> upstreams;  // "ADDR[:PORT]"; empty: /etc/resolv.conf
  uint32_t ttl = 5;
  uint32_t negative_ttl = 5;
  PodMode pod_mode = PodMode::kDisabled;
  bool loadbalance = true;            // A/AAAA answers rotated per reply (ZoneOptions::loadbalance)
  bool endpoint_pod_names = false;    // ZoneOptions::endpoint_pod_names
  bool no_endpoints = false;          // ZoneOptions::no_endpoints
  bool ignore_empty_service = false;  // ZoneOptions::ignore_empty_service
  std::vector<std::string> namespaces;  // ZoneOptions::namespaces
  // Clients that may use forwarding. Empty: loopback and the private ranges (RFC 1918,
  // RFC 6598, fc00::/7), so the agent is never an open resolver.
  std::vector<model::IpPrefix> forward_allow;
  int workers = 1;
  size_t tcp_max_connections = 256;
  std::chrono::milliseconds tcp_idle_timeout{10000};
  std::chrono::milliseconds forward_timeout{2000};
  int forward_tries = 2;
  size_t forward_max_inflight = 1024;
  size_t cache_entries = 10000;
  uint32_t cache_max_ttl = 3600;         // ForwarderOptions::cache_max_ttl
  uint32_t cache_denial_max_ttl = 1800;  // ForwarderOptions::cache_denial_max_ttl
  bool forwarding = true;                // false: names outside the zone get REFUSED
  // More addresses ("ADDR:PORT") the same zone is answered on, each by a server of its own
  // over the sink's zone and forwarder, with its own `server` label in the metrics (the
  // node-local address beside the cluster DNS address).
  std::vector<std::string> also_listen;
  // TTLs answers given before this process may still be cached under, each until a moment
  // (the node's drain state file: a TTL lowered across a restart): the TTL drain waits out is
  // the largest of `ttl` and these until they pass.
  struct TtlHold {
    uint32_t ttl = 0;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<TtlHold> ttl_holds;
};

class DnsSink : public pipeline::Sink {
 public:
  using Clock = std::chrono::steady_clock;
  // `board` and `registry` may be null. The sink registers itself on the board as "dns".
  DnsSink(DnsOptions opts, pipeline::AckBoard* board, prometheus::Registry* registry);
  ~DnsSink() override;

  // Binds the sockets and starts serving (SERVFAIL inside the zone until the first synced
  // snapshot is applied).
  Status start();
  // Stops the servers and folds their last counts into the registry.
  void stop();
  // Brings the registry's query counters and latency histograms up to date with what the
  // servers' threads counted (they count into blocks of their own, never the registry): a
  // scrape calls it before it collects.
  void fold_metrics();
  uint16_t port() const { return servers_.empty() ? 0 : servers_.front().server->port(); }

  std::string name() const override { return "dns"; }
  void apply(const model::SnapshotPtr& snap, const model::Delta& delta) override;

  // The answers' expiry as last published on the board (also without a board: tests).
  std::shared_ptr<const pipeline::AnswerExpiry> answers() const;
  // How often the published expiry is looked at again between applies.
  static constexpr std::chrono::milliseconds kAnswersTick{50};

  // What a reloaded configuration may change without a restart: the zone's options (TTLs, pod
  // records, loadbalance, the CoreDNS kubernetes-plugin options). The zone is built again from
  // the last snapshot and swapped in; answers already sent stay on record for drain support.
  // Changing the zone name needs a restart: an error says so and nothing changes.
  Status reconfigure(const DnsOptions& next);
  ZonePtr zone() const { return zones_.load(); }
  Forwarder* forwarder() { return forwarder_.get(); }
  Server* server() { return servers_.empty() ? nullptr : servers_.front().server.get(); }

 private:
  int64_t horizon_ns() const;  // replies older than this have expired everywhere
  void harvest();              // every builder's, under mu_
  // Under mu_: the answers' expiry now, published when it differs from the last.
  void publish_answers();
  // Under mu_: the addresses of `snap`'s services named in `delta` that a drain may ask about
  // (terminating or unready endpoints), and of its terminating pods.
  void track_candidates(const model::Snapshot& snap, const model::Delta& delta);
  void tick_loop();

  const DnsOptions opts_;  // as started: a reload changes only the builder's zone options
  uint32_t max_ttl_ = 0;   // the longest TTL a reply still cached may carry: drain waits it out
  uint32_t ttl_now_ = 0;   // the TTL replies are given now
  // Earlier TTLs (a reload's, an earlier process's) until the last reply given with them expires.
  std::vector<DnsOptions::TtlHold> ttl_holds_;
  // Under mu_: max_ttl_ again from ttl_now_ and the holds not yet passed; published to the board
  // when it changes.
  void update_max_ttl(Clock::time_point now);
  pipeline::AckBoard* board_;
  prometheus::Registry* registry_;
  std::unique_ptr<Metrics> metrics_;
  ZoneSlot zones_;
  std::unique_ptr<Forwarder> forwarder_;
  struct Listener {
    std::unique_ptr<Metrics> metrics;  // null for the first: it counts into metrics_
    std::unique_ptr<Server> server;
  };
  std::vector<Listener> servers_;  // opts_.listen, then opts_.also_listen

  mutable std::mutex mu_;  // guards the builders, max_ttl_: apply() and reconfigure() against
                           // the drain queries
  // One per zone: opts_.zone, then opts_.extra_zones in order (zone_options' index).
  std::vector<std::unique_ptr<ZoneBuilder>> builders_;
  std::map<model::ServiceKey, std::vector<model::IpAddr>> candidates_;  // by service
  std::vector<model::IpAddr> pod_candidates_;                           // terminating pods
  std::shared_ptr<const pipeline::AnswerExpiry> answers_;               // the last published
  std::thread ticker_;
  std::condition_variable tick_cv_;
  bool ticking_ = false;  // under mu_
  // What the servers answer from: the first builder's zone, serving the others' through it.
  void publish(std::vector<ZonePtr> zones);
};

}  // namespace endpointd::dns
