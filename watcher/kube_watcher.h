// The parts of the Kubernetes client (kube_client.h) its files share: what every kind's watcher
// shares (KubeClient::Shared) and one kind's watcher (KubeClient::Watcher). A watcher's members
// are defined by seam: kube_client.cc (the loop that decides list, WatchList or watch, and when
// to retry), kube_transport.cc (one request over libcurl), kube_list.cc (a kind's state, by
// paged lists or the initial events of a WatchList) and kube_watch_stream.cc (a watch and its
// events). For watcher/ only.
#pragma once

#include <curl/curl.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <simdjson.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "watcher/kube_client.h"
#include "watcher/kube_transport.h"
#include "watcher/kube_watch.h"

namespace endpointd::watcher {

struct KubeClient::Shared {
  using Clock = std::chrono::steady_clock;

  Shared(ClusterConfig c, KubeClientConfig cfg, Sink s, prometheus::Registry& registry);

  // One request's outcome in the rest_client_* metrics. `status` 0: no response (client-go's
  // code "<error>"). A watch's latency is until its response head arrived (its stream lasts
  // minutes); a list page's, until its whole body did.
  void count_request(long status, Clock::duration latency, std::optional<size_t> response_bytes);

  ClusterConfig cluster;
  KubeClientConfig config;
  Sink sink;
  TokenSource tokens;
  std::string user_agent;
  prometheus::Family<prometheus::Counter>& events;
  prometheus::Family<prometheus::Counter>& relists;
  prometheus::Family<prometheus::Counter>& reconnects;
  prometheus::Family<prometheus::Counter>& decode_errors;
  prometheus::Family<prometheus::Counter>& watch_list_fallbacks;
  prometheus::Family<prometheus::Counter>& bookmarks;
  prometheus::Family<prometheus::Counter>& stalls;
  prometheus::Family<prometheus::Counter>& requests;
  prometheus::Family<prometheus::Histogram>& request_duration;
  prometheus::Family<prometheus::Histogram>& response_size;
  std::string host;  // of the server URL, for the rest_client_* labels

  std::atomic<bool> stop{false};
  std::mutex sleep_mu;
  std::condition_variable sleep_cv;

  // Waits `d` or until stop; false when stopping.
  bool sleep_for(std::chrono::milliseconds d) {
    std::unique_lock lock(sleep_mu);
    sleep_cv.wait_for(lock, d, [&] { return stop.load(); });
    return !stop.load();
  }
};

class KubeClient::Watcher {
  using Clock = std::chrono::steady_clock;
  using milliseconds = std::chrono::milliseconds;
  using seconds = std::chrono::seconds;

 public:
  Watcher(std::shared_ptr<Shared> shared, model::ObjectKind kind, uint64_t seed);
  ~Watcher() { join(); }

  void start() {
    thread_ = std::thread([this] { run(); });
  }
  void wake() {
    if (multi_) curl_multi_wakeup(multi_.get());
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  model::ObjectKind kind() const { return kind_; }

  KindStats stats() const {
    std::lock_guard lock(stats_mu_);
    return stats_;
  }

 private:
  // One HTTP exchange.
  struct Transfer {
    Watcher* self = nullptr;
    bool streaming = false;  // a watch: the body is parsed as it arrives
    size_t body_limit = kMaxErrorBody;
    std::string body;
    bool body_truncated = false;
    long status = 0;
    std::optional<seconds> retry_after;
    // A list that may come in protobuf (the request offers it); the answer's Content-Type says
    // whether it did.
    bool offer_protobuf = false;
    bool protobuf = false;
    // Set when the write callback (or, for kStalled, perform()) ended the transfer on purpose.
    enum class Abort : uint8_t {
      kNone,
      kStop,
      kExpired,
      kErrorEvent,
      kBadStream,
      kTooLarge,
      kStalled,
      kNotWatchList,  // a WatchList answered without its end bookmark (not offered)
      kNoInitialEnd,  // no end bookmark within list_stream_timeout
      kBehind,        // an end bookmark older than the version asked for
    };
    Abort abort = Abort::kNone;
    ApiStatus error_status;  // of an ERROR event
    uint64_t events = 0;     // events and bookmarks handled on this watch
    // 0: none. Otherwise the transfer ends (kStalled) once nothing arrived for this long.
    milliseconds stall_timeout{0};
    Clock::time_point last_byte;  // the request's start, then the newest header or body bytes
    Clock::time_point started;    // the request's start
    bool counted = false;         // in the rest_client_* metrics already (a watch, once answered)
    // A WatchList's state while its initial events arrive; reset once the end bookmark posted
    // it (the stream then goes on as a watch).
    struct Initial {
      std::vector<model::Object> objects;
      std::vector<model::ObjectKey> keep;  // undecodable: their last good version is kept
      std::optional<uint64_t> not_older_than;
    };
    std::optional<Initial> initial;
    bool state_posted = false;  // a WatchList's state was posted from this stream
  };

  struct Outcome {
    CURLcode curl = CURLE_OK;
    std::string curl_error;
  };

  // kNotOffered: a WatchList the server refused or did not answer as one; lists from now on.
  enum class WatchEnd : uint8_t { kStopped, kClosed, kExpired, kFailed, kNotOffered };
  struct WatchResult {
    WatchEnd end = WatchEnd::kFailed;
    std::string reason;  // for kFailed / kClosed / kNotOffered
    bool progress = false;
    std::optional<seconds> retry_after;
    bool unauthorized = false;
    bool state_posted = false;         // a WatchList posted its state
    bool version_unavailable = false;  // a WatchList from a version the cache has not reached
  };

  // What a list asks the API server for (list_all), and what a WatchList does.
  enum class ListFrom { kConsistent, kNotOlderThan, kAny };

  struct ListResult {
    bool ok = false;
    bool stopped = false;
    std::string reason;
    std::optional<seconds> retry_after;
    bool unauthorized = false;
    // The version asked for is one the API server's cache cannot serve: list again, consistent.
    bool version_unavailable = false;
    std::vector<model::Object> objects;
    std::vector<model::ObjectKey> keep;  // listed but undecodable: keep their last good version
    std::string resource_version;
    uint64_t pages = 0;
    uint64_t protobuf_pages = 0;
    Clock::duration fetching{}, decoding{};  // the requests (with inflating), the decoding
  };

  // --- the loop, stats and metrics (kube_client.cc) ---------------------------------------

  void run();
  milliseconds backoff_delay(int failures, std::optional<seconds> retry_after);
  milliseconds spread(milliseconds d);
  void count_reconnect(const std::string& reason);
  void count_decode_error(const std::string& what);
  void count_watch_list_fallback(const std::string& reason);
  void set_resource_version(const std::string& rv);
  void post(model::Event ev);
  void slim(model::Object& o) const;

  // --- one request (kube_transport.cc) ----------------------------------------------------

  Outcome perform(const std::string& url, Transfer& t, milliseconds timeout, bool force_token);
  static size_t on_header(char* data, size_t size, size_t n, void* user);
  static size_t on_body(char* data, size_t size, size_t n, void* user);
  static std::string body_excerpt(const Transfer& t);

  // --- the state: lists and WatchList (kube_list.cc) --------------------------------------

  bool list(bool& force_token, ListFrom& from, int& failures);
  ListResult list_all(bool force_token, ListFrom from);
  bool end_initial_events(Transfer& t, const WatchEvent& ev);
  void post_state(std::vector<model::Object> objects, std::vector<model::ObjectKey> keep,
                  const std::string& rv, bool by_watch_list);

  // --- watch (kube_watch_stream.cc) -------------------------------------------------------

  WatchResult watch_once(bool force_token, bool initial = false,
                         ListFrom from = ListFrom::kConsistent);
  bool handle_watch_line(Transfer& t, std::string_view line);
  static bool behind(const std::string& rv, const std::string& held);
  void count_behind(const char* what, const std::string& rv);
  static std::string undecodable(const WatchEvent& ev);

  std::shared_ptr<Shared> shared_;
  model::ObjectKind kind_;
  std::string kind_name_;
  std::mt19937_64 rng_;
  EasyPtr easy_;
  MultiPtr multi_;
  std::array<char, CURL_ERROR_SIZE> errbuf_{};
  LineBuffer line_buffer_;
  simdjson::dom::parser parser_;
  std::string ca_data_, cert_data_, key_data_;
  std::string base_url_;
  std::string selectors_;
  std::string resource_version_;
  bool fresh_connection_ = false;  // the next request opens a new connection
  bool need_list_ = true;          // no state yet, or the watch expired
  bool listed_once_ = false;       // a state was posted

  prometheus::Counter& added_;
  prometheus::Counter& modified_;
  prometheus::Counter& deleted_;
  prometheus::Counter& error_events_;
  prometheus::Counter& relists_;
  prometheus::Counter& decode_errors_;
  prometheus::Counter& bookmarks_;
  prometheus::Counter& stalls_;

  mutable std::mutex stats_mu_;
  KindStats stats_;
  std::thread thread_;
};

}  // namespace endpointd::watcher
