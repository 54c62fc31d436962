// The Kubernetes API source: list + watch of Services, EndpointSlices, Nodes and (optionally)
// this node's Pods, turned into model::Events for whoever consumes them.
//
// One thread per kind. Each gets the kind's state — by WatchList (a watch that begins with it)
// where the API server offers it, else by a paged list — posts one Replace with everything it
// got, then watches from the state's resourceVersion, posting Upsert/Remove per event. It survives
// dropped streams, 5xx/429 (bounded jittered backoff, Retry-After honoured), 410 Gone (a
// relist and a new Replace), token rotation and malformed objects (skipped and counted).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/event.h"
#include "watcher/kube_auth.h"

namespace prometheus {
class Registry;
}

namespace endpointd::watcher {

// How a kind's state is got, at start and after a watch expired.
enum class ListMode : uint8_t {
  // WatchList (client-go's "streaming lists"): one watch with sendInitialEvents=true,
  // resourceVersionMatch=NotOlderThan and bookmarks, whose ADDED events up to the bookmark
  // annotated "k8s.io/initial-events-end" are the state. kube-apiserver serves it from its
  // watch cache, an object at a time, with no list held in its memory; with no resourceVersion
  // the state is as fresh as a consistent read's (the cache waits until it has caught up).
  // Where the server refuses it (422: its WatchList feature is off), ignores it (no end
  // bookmark within list_stream_timeout, or a bookmark without the annotation first), the
  // watcher lists instead, as kList, for the rest of the process.
  kAuto,
  // Paged lists: the first one consistent (no resourceVersion), relists not older than the
  // last version seen (resourceVersionMatch=NotOlderThan), both from the watch cache on
  // servers from 1.31.
  kList,
  // The first list from the watch cache at any version (resourceVersion=0), as client-go's
  // informers make it: the cheapest on servers before 1.31, but the state may be older than
  // one this agent had before it restarted (see run()). Relists as kList.
  kCache,
};
std::string_view to_string(ListMode m);

struct KubeClientConfig {
  // Pods are watched only for this node (fieldSelector spec.nodeName=<node_name>); pods are
  // not watched when node_name is empty.
  std::string node_name;
  bool watch_services = true;
  bool watch_endpoint_slices = true;
  bool watch_nodes = true;
  // Only this node's Node (fieldSelector metadata.name=<node_name>), not every Node.
  bool own_node_only = false;
  bool watch_pods = false;
  // Every node's pods, not only this node's: DNS's verified pod records answer pods that exist
  // anywhere. Other nodes' pods are kept without labels and annotations.
  bool pods_cluster_wide = false;

  ListMode list_mode = ListMode::kAuto;
  // A WatchList whose end bookmark has not come this long after the request is abandoned for a
  // list (a server that ignores sendInitialEvents sends the state but no end).
  std::chrono::milliseconds list_stream_timeout{30000};
  // A relist after the watch expired (410) waits a uniform random share of this first, so that
  // the agents of a cluster whose watches expired together (an API server restarted past its
  // watch window) do not list in one burst.
  std::chrono::milliseconds relist_spread{2000};

  size_t page_size = 500;  // list `limit`
  // Ask for EndpointSlice lists in protobuf, as kube-proxy does (--kube-api-content-type);
  // false: JSON only. The answer's Content-Type decides how a page is read.
  bool protobuf_lists = true;
  // The watch's timeoutSeconds is watch_timeout plus a uniform random share of
  // watch_timeout * watch_timeout_jitter, so that agents do not reconnect in lockstep.
  std::chrono::seconds watch_timeout{300};
  double watch_timeout_jitter = 0.25;

  // Reconnect backoff: full jitter, uniform in [0, min(max, initial * 2^failures)].
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{30000};
  // Retry-After is honoured up to this.
  std::chrono::seconds retry_after_max{120};

  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds list_timeout{120000};  // one list page

  // A dead API connection (peer gone, no RST) is found two ways.
  //
  // The kernel: keepalive probes after tcp_keepalive_idle of silence, every
  // tcp_keepalive_interval, tcp_keepalive_count unanswered ones and the connection fails
  // (TCP_USER_TIMEOUT is set to the same sum, so a request written into a dead path fails as
  // soon). The peer's kernel answers the probes whatever the watch carries, so this costs a
  // healthy quiet watch nothing; it is what client-go's HTTP/2 health check does with PING
  // frames (ReadIdleTimeout 30 s + PingTimeout 15 s = 45 s). Defaults: 15 + 3 x 5 = 30 s.
  std::chrono::seconds tcp_keepalive_idle{15};
  std::chrono::seconds tcp_keepalive_interval{5};
  int tcp_keepalive_count = 3;
  // The watch: a stream on which no byte arrives (no event, no bookmark, not even the
  // response headers) for this long is abandoned and re-established from the last
  // resourceVersion, counted as a stall (endpointd_watch_stalls_total). It catches what the
  // kernel cannot: a peer that still acknowledges TCP but sends nothing (a wedged server or a
  // proxy whose upstream died). It must stay above the longest silence of a healthy watch:
  // kube-apiserver's watch cache sends a quiet watch a bookmark roughly once a minute
  // (defaultBookmarkFrequency = 1 min, in one-second buckets, popped on a 1-1.25 s tick), so
  // the gap is at most about 63 s; 75 s leaves room for one late bookmark without churning
  // quiet clusters. (It sends one only once its resourceVersion has moved past the watch's;
  // where etcd progress notifications are rare a quiet kind can go longer, and its watch is
  // then renewed every 75 s, cheaply, from the watch cache.) 0: off (the watch then ends only
  // at timeoutSeconds + 30 s).
  std::chrono::milliseconds watch_stall_timeout{75000};

  uint64_t seed = 0;  // 0: random

  std::string user_agent;  // empty: endpointd/<version>
};

// What one kind's watcher has done, for tests and /debug/state. The same numbers are in the
// Prometheus registry.
struct KindStats {
  uint64_t added = 0;
  uint64_t modified = 0;
  uint64_t deleted = 0;
  uint64_t error_events = 0;
  uint64_t bookmarks = 0;
  uint64_t lists = 0;        // complete states (lists or WatchLists), the first one included
  uint64_t watch_lists = 0;  // of lists, those got by WatchList
  uint64_t relists = 0;      // complete lists after the first
  uint64_t list_pages = 0;
  uint64_t list_protobuf_pages = 0;  // of list_pages, those the API server sent in protobuf
  uint64_t decode_errors = 0;
  uint64_t watches = 0;                        // watch requests answered 200
  uint64_t stalls = 0;                         // watches abandoned for silence
  std::map<std::string, uint64_t> reconnects;  // by reason
  // WatchList given up for lists (by reason: refused, no_end, not_offered), and end bookmarks
  // or bookmarks that named a version older than the one held (not taken).
  std::map<std::string, uint64_t> watch_list_fallbacks;
  uint64_t bookmarks_behind = 0;
  std::string resource_version;  // the watch position
  bool synced = false;           // a complete list was posted

  uint64_t reconnects_total() const;
  uint64_t reconnect_count(const std::string& reason) const;
};

class KubeClient {
 public:
  using Sink = std::function<void(model::Event)>;

  // `sink` is called from the watcher threads (one per kind), so it must be thread-safe; it
  // should not block for long. `registry` must outlive the client.
  KubeClient(ClusterConfig cluster, KubeClientConfig config, Sink sink,
             prometheus::Registry& registry);
  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  // Starts one thread per watched kind. Call once.
  void start();
  // Stops and joins the threads; returns within about 100 ms. Idempotent.
  void stop();

  // Every watched kind has posted its first Replace.
  bool synced() const;
  KindStats stats(model::ObjectKind kind) const;
  std::vector<model::ObjectKind> kinds() const;

  class Watcher;  // one kind; defined in kube_watcher.h

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Watcher>> watchers_;
  bool started_ = false;
  bool stopped_ = false;
};

// The API path of a kind's collection ("/api/v1/services", ...).
std::string_view collection_path(model::ObjectKind kind);

// Sets keepalive (SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT) and TCP_USER_TIMEOUT
// on a TCP socket as `config` says; every API connection gets this before it connects. False
// when the kernel refused one of them.
bool tune_api_socket(int fd, const KubeClientConfig& config);
// How long a dead peer can go unnoticed by the kernel: idle + interval x count.
std::chrono::seconds keepalive_dead_peer_bound(const KubeClientConfig& config);

}  // namespace endpointd::watcher
