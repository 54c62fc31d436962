// List/watch over libcurl. Each kind runs on its own thread with its own easy handle, driven
// through a private multi handle so that stop() can wake a blocked transfer at once
// (curl_multi_wakeup) instead of waiting for curl's next progress callback.
#include "watcher/kube_client.h"

#include <curl/curl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <simdjson.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "watcher/decode.h"
#include "watcher/kube_watch.h"

#ifndef ENDPOINTD_VERSION
#define ENDPOINTD_VERSION "dev"
#endif

namespace endpointd::watcher {

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

struct EasyDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct MultiDeleter {
  void operator()(CURLM* m) const { curl_multi_cleanup(m); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using EasyPtr = std::unique_ptr<CURL, EasyDeleter>;
using MultiPtr = std::unique_ptr<CURLM, MultiDeleter>;
using SlistPtr = std::unique_ptr<curl_slist, SlistDeleter>;

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

constexpr size_t kMaxListBody = size_t{1} << 30;
constexpr size_t kMaxErrorBody = 64 * 1024;

std::string query_escape(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xF]);
    }
  }
  return out;
}

model::ObjectKey key_of(const model::Object& o) {
  return std::visit(
      [](const auto& x) -> model::ObjectKey {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, model::Node>) {
          return {"", x.name};
        } else {
          return x.key;
        }
      },
      o);
}

std::string reason_for_status(long status) {
  if (status == 401) return "unauthorized";
  if (status == 403) return "forbidden";
  if (status == 410) return "expired";
  if (status == 429) return "throttled";
  if (status >= 500) return "server_error";
  return "http_" + std::to_string(status);
}

bool set_int_option(int fd, int level, int name, int64_t value) {
  const int v = static_cast<int>(std::clamp<int64_t>(value, 0, INT32_MAX));
  return setsockopt(fd, level, name, &v, sizeof v) == 0;
}

// curl calls this for every socket it opens, before it connects.
int on_sockopt(void* clientp, curl_socket_t fd, curlsocktype purpose) {
  if (purpose == CURLSOCKTYPE_IPCXN &&
      !tune_api_socket(fd, *static_cast<const KubeClientConfig*>(clientp))) {
    spdlog::debug("kube: could not set keepalive options on the API connection: {}",
                  std::strerror(errno));
  }
  return CURL_SOCKOPT_OK;
}

// The host of a server URL as client-go's rest_client_* metrics label it (Go's url.URL.Host:
// the authority without user info, with its port when the URL names one).
std::string url_host(std::string_view url) {
  if (auto scheme = url.find("://"); scheme != std::string_view::npos)
    url.remove_prefix(scheme + 3);
  url = url.substr(0, url.find_first_of("/?#"));
  if (auto at = url.rfind('@'); at != std::string_view::npos) url.remove_prefix(at + 1);
  return std::string(url);
}

}  // namespace

bool tune_api_socket(int fd, const KubeClientConfig& config) {
  bool ok = set_int_option(fd, SOL_SOCKET, SO_KEEPALIVE, 1);
  ok &= set_int_option(fd, IPPROTO_TCP, TCP_KEEPIDLE, config.tcp_keepalive_idle.count());
  ok &= set_int_option(fd, IPPROTO_TCP, TCP_KEEPINTVL, config.tcp_keepalive_interval.count());
  ok &= set_int_option(fd, IPPROTO_TCP, TCP_KEEPCNT, config.tcp_keepalive_count);
  const auto bound = std::chrono::duration_cast<milliseconds>(keepalive_dead_peer_bound(config));
  ok &= set_int_option(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, bound.count());
  return ok;
}

seconds keepalive_dead_peer_bound(const KubeClientConfig& config) {
  return config.tcp_keepalive_idle + config.tcp_keepalive_interval * config.tcp_keepalive_count;
}

uint64_t KindStats::reconnects_total() const {
  uint64_t n = 0;
  for (const auto& [_, v] : reconnects) n += v;
  return n;
}

uint64_t KindStats::reconnect_count(const std::string& reason) const {
  auto it = reconnects.find(reason);
  return it == reconnects.end() ? 0 : it->second;
}

std::string_view to_string(ListMode m) {
  switch (m) {
    case ListMode::kAuto:
      return "auto";
    case ListMode::kList:
      return "list";
    case ListMode::kCache:
      return "cache";
  }
  return "auto";
}

std::string_view collection_path(model::ObjectKind kind) {
  switch (kind) {
    case model::ObjectKind::kService:
      return "/api/v1/services";
    case model::ObjectKind::kEndpointSlice:
      return "/apis/discovery.k8s.io/v1/endpointslices";
    case model::ObjectKind::kNode:
      return "/api/v1/nodes";
    case model::ObjectKind::kPod:
      return "/api/v1/pods";
  }
  return "";
}

struct KubeClient::Shared {
  Shared(ClusterConfig c, KubeClientConfig cfg, Sink s, prometheus::Registry& registry)
      : cluster(std::move(c)),
        config(std::move(cfg)),
        sink(std::move(s)),
        tokens(cluster),
        events(prometheus::BuildCounter()
                   .Name("endpointd_watch_events_total")
                   .Help("Watch events received from the API server, by kind and type")
                   .Register(registry)),
        relists(prometheus::BuildCounter()
                    .Name("endpointd_watch_relists_total")
                    .Help("Complete lists after the first one (410 Gone, restarts)")
                    .Register(registry)),
        reconnects(prometheus::BuildCounter()
                       .Name("endpointd_watch_reconnects_total")
                       .Help("Watch or list requests that ended and were retried, by reason")
                       .Register(registry)),
        decode_errors(prometheus::BuildCounter()
                          .Name("endpointd_decode_errors_total")
                          .Help("Objects refused because they did not decode")
                          .Register(registry)),
        watch_list_fallbacks(
            prometheus::BuildCounter()
                .Name("endpointd_watch_list_fallbacks_total")
                .Help("WatchLists given up for lists, by kind and reason (refused: the API "
                      "server's WatchList is off; no_end / not_offered: it sent no end of the "
                      "initial events; behind: the state was older than the one held)")
                .Register(registry)),
        bookmarks(prometheus::BuildCounter()
                      .Name("endpointd_watch_bookmarks_total")
                      .Help("Watch bookmarks received")
                      .Register(registry)),
        stalls(prometheus::BuildCounter()
                   .Name("endpointd_watch_stalls_total")
                   .Help("Watches abandoned because nothing arrived on them for the stall "
                         "timeout; each is re-established from its last resourceVersion")
                   .Register(registry)),
        // client-go's request metrics, under its names, labels and buckets.
        requests(prometheus::BuildCounter()
                     .Name("rest_client_requests_total")
                     .Help("Number of HTTP requests, partitioned by status code, method, and host.")
                     .Register(registry)),
        request_duration(prometheus::BuildHistogram()
                             .Name("rest_client_request_duration_seconds")
                             .Help("Request latency in seconds. Broken down by verb, and host.")
                             .Register(registry)),
        response_size(prometheus::BuildHistogram()
                          .Name("rest_client_response_size_bytes")
                          .Help("Response size in bytes. Broken down by verb and host.")
                          .Register(registry)) {
    user_agent = config.user_agent.empty() ? std::string("endpointd/") + ENDPOINTD_VERSION
                                           : config.user_agent;
    while (!cluster.server.empty() && cluster.server.back() == '/') cluster.server.pop_back();
    host = url_host(cluster.server);
  }

  // One request's outcome in the rest_client_* metrics. `status` 0: no response (client-go's
  // code "<error>"). A watch's latency is until its response head arrived (its stream lasts
  // minutes); a list page's, until its whole body did.
  void count_request(long status, Clock::duration latency, std::optional<size_t> response_bytes) {
    static const prometheus::Histogram::BucketBoundaries kLatency = {
        0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0};
    static const prometheus::Histogram::BucketBoundaries kSize = {
        64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216};
    requests
        .Add({{"code", status > 0 ? std::to_string(status) : std::string("<error>")},
              {"method", "GET"},
              {"host", host}})
        .Increment();
    request_duration.Add({{"verb", "GET"}, {"host", host}}, kLatency)
        .Observe(std::chrono::duration<double>(latency).count());
    if (response_bytes)
      response_size.Add({{"verb", "GET"}, {"host", host}}, kSize)
          .Observe(static_cast<double>(*response_bytes));
  }

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
  bool sleep_for(milliseconds d) {
    std::unique_lock lock(sleep_mu);
    sleep_cv.wait_for(lock, d, [&] { return stop.load(); });
    return !stop.load();
  }
};

class KubeClient::Watcher {
 public:
  Watcher(std::shared_ptr<Shared> shared, model::ObjectKind kind, uint64_t seed)
      : shared_(std::move(shared)),
        kind_(kind),
        kind_name_(model::to_string(kind)),
        rng_(seed),
        easy_(curl_easy_init()),
        multi_(curl_multi_init()),
        line_buffer_(kMaxObjectBytes + 64 * 1024),
        added_(shared_->events.Add({{"kind", kind_name_}, {"type", "ADDED"}})),
        modified_(shared_->events.Add({{"kind", kind_name_}, {"type", "MODIFIED"}})),
        deleted_(shared_->events.Add({{"kind", kind_name_}, {"type", "DELETED"}})),
        error_events_(shared_->events.Add({{"kind", kind_name_}, {"type", "ERROR"}})),
        relists_(shared_->relists.Add({{"kind", kind_name_}})),
        decode_errors_(shared_->decode_errors.Add({{"kind", kind_name_}})),
        bookmarks_(shared_->bookmarks.Add({{"kind", kind_name_}})),
        stalls_(shared_->stalls.Add({{"kind", kind_name_}})) {
    const auto& c = shared_->cluster;
    ca_data_ = c.ca_data;
    cert_data_ = c.client_cert_data;
    key_data_ = c.client_key_data;
    base_url_ = c.server + std::string(collection_path(kind));
    // Services and slices labelled service.kubernetes.io/service-proxy-name are listed too:
    // only the dataplane leaves them to that proxy (model::has_proxy_rules); DNS and the feed
    // serve them, as CoreDNS does.
    if (kind == model::ObjectKind::kPod && !shared_->config.pods_cluster_wide) {
      selectors_ = "&fieldSelector=" + query_escape("spec.nodeName=" + shared_->config.node_name);
    }
    if (kind == model::ObjectKind::kNode && shared_->config.own_node_only)
      selectors_ = "&fieldSelector=" + query_escape("metadata.name=" + shared_->config.node_name);
  }

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

  // The start of a response body for the log; not the bytes of a protobuf one.
  static std::string body_excerpt(const Transfer& t) {
    return t.protobuf
               ? std::string("(a protobuf body of ") + std::to_string(t.body.size()) + " bytes)"
               : t.body.substr(0, 200);
  }

  // The value of header line `line` when its name is `name` (lower case, with the colon),
  // without leading blanks.
  static std::optional<std::string_view> header_value(std::string_view line,
                                                      std::string_view name) {
    if (line.size() <= name.size()) return std::nullopt;
    for (size_t i = 0; i < name.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return std::nullopt;
    auto v = line.substr(name.size());
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    return v;
  }

  static size_t on_header(char* data, size_t size, size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    t->last_byte = Clock::now();
    std::string_view line(data, size * n);
    if (line.starts_with("HTTP/")) {
      t->retry_after.reset();
      t->protobuf = false;
      return size * n;
    }
    if ((line == "\r\n" || line == "\n") && t->streaming && !t->counted) {
      // The end of a watch's response head: it is counted now, as client-go counts it, with
      // the time it took to be answered (its stream then lasts minutes).
      long status = 0;
      curl_easy_getinfo(t->self->easy_.get(), CURLINFO_RESPONSE_CODE, &status);
      if (status >= 200) {
        t->self->shared_->count_request(status, t->last_byte - t->started, std::nullopt);
        t->counted = true;
      }
      return size * n;
    }
    if (auto v = header_value(line, "retry-after:")) {
      int64_t secs = 0;
      auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), secs);
      if (ec == std::errc() && p != v->data() && secs >= 0) t->retry_after = seconds(secs);
    } else if (auto ct = header_value(line, "content-type:")) {
      t->protobuf = t->offer_protobuf && media_type(*ct) == kProtobufContentType;
    }
    return size * n;
  }

  static size_t on_body(char* data, size_t size, size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    t->last_byte = Clock::now();
    const size_t len = size * n;
    Watcher* w = t->self;
    if (w->shared_->stop.load()) {
      t->abort = Transfer::Abort::kStop;
      return 0;
    }
    if (t->status == 0) curl_easy_getinfo(w->easy_.get(), CURLINFO_RESPONSE_CODE, &t->status);
    if (t->streaming && t->status == 200) {
      bool ok = w->line_buffer_.feed(std::string_view(data, len), [&](std::string_view line) {
        return w->handle_watch_line(*t, line);
      });
      if (!ok) {
        if (t->abort == Transfer::Abort::kNone) t->abort = Transfer::Abort::kBadStream;
        return 0;
      }
      return len;
    }
    if (t->body.size() + len > t->body_limit) {
      if (t->streaming || t->status != 200) {
        // An error body: keep the start, enough for the Status.
        t->body.append(data, t->body_limit - t->body.size());
        t->body_truncated = true;
        return len;
      }
      t->abort = Transfer::Abort::kTooLarge;
      return 0;
    }
    t->body.append(data, len);
    return len;
  }

  // Runs one request to completion (or until stop). The easy handle keeps its connection
  // between requests.
  Outcome perform(const std::string& url, Transfer& t, milliseconds timeout, bool force_token) {
    CURL* e = easy_.get();
    curl_easy_reset(e);
    errbuf_.fill('\0');
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf_.data());
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    // gzip only: what kube-apiserver compresses with (as client-go asks). Offering every
    // encoding libcurl knows lets a server pick brotli, which costs it ~4 ms per 1,000 objects
    // at its default quality: seconds for a 10k-service list. None with the kubeconfig's
    // disable-compression.
    if (!shared_->cluster.disable_compression) curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "gzip");
    curl_easy_setopt(e, CURLOPT_USERAGENT, shared_->user_agent.c_str());
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(shared_->config.connect_timeout.count()));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    // on_sockopt sets the same and TCP_KEEPCNT and TCP_USER_TIMEOUT, which curl has no
    // options for; both orders of the two leave the same values.
    const auto& cfg = shared_->config;
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, static_cast<long>(cfg.tcp_keepalive_idle.count()));
    curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL,
                     static_cast<long>(cfg.tcp_keepalive_interval.count()));
    curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, &on_sockopt);
    curl_easy_setopt(e, CURLOPT_SOCKOPTDATA, &cfg);
    if (fresh_connection_) {
      curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
      fresh_connection_ = false;
    }
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Watcher::on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &Watcher::on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &t);

    const auto& c = shared_->cluster;
    if (c.insecure_skip_tls_verify) {
      curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (!ca_data_.empty()) {
      curl_blob blob{ca_data_.data(), ca_data_.size(), CURL_BLOB_COPY};
      curl_easy_setopt(e, CURLOPT_CAINFO_BLOB, &blob);
    } else if (!c.ca_file.empty()) {
      curl_easy_setopt(e, CURLOPT_CAINFO, c.ca_file.c_str());
    }
    if (!cert_data_.empty()) {
      curl_blob blob{cert_data_.data(), cert_data_.size(), CURL_BLOB_COPY};
      curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &blob);
      curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
    } else if (!c.client_cert_file.empty()) {
      curl_easy_setopt(e, CURLOPT_SSLCERT, c.client_cert_file.c_str());
      curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
    }
    if (!key_data_.empty()) {
      curl_blob blob{key_data_.data(), key_data_.size(), CURL_BLOB_COPY};
      curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &blob);
      curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
    } else if (!c.client_key_file.empty()) {
      curl_easy_setopt(e, CURLOPT_SSLKEY, c.client_key_file.c_str());
      curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
    }

    // A list that may come in protobuf offers it first and JSON second (kube-proxy's client
    // offers protobuf, then "*/*"; JSON is named here, the one other encoding read).
    curl_slist* raw = curl_slist_append(
        nullptr, t.offer_protobuf ? "Accept: application/vnd.kubernetes.protobuf, application/json"
                                  : "Accept: application/json");
    std::string token = shared_->tokens.token(force_token);
    std::string auth;
    if (!token.empty()) {
      auth = "Authorization: Bearer " + token;
      raw = curl_slist_append(raw, auth.c_str());
    }
    SlistPtr headers(raw);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.get());

    t.self = this;
    t.last_byte = Clock::now();
    line_buffer_.clear();

    Outcome out;
    t.started = Clock::now();
    if (curl_multi_add_handle(multi_.get(), e) != CURLM_OK) {
      out.curl = CURLE_FAILED_INIT;
      out.curl_error = "curl_multi_add_handle failed";
      return out;
    }
    bool done = false;
    while (!done) {
      int running = 0;
      if (curl_multi_perform(multi_.get(), &running) != CURLM_OK) {
        out.curl = CURLE_FAILED_INIT;
        break;
      }
      int queued = 0;
      while (CURLMsg* m = curl_multi_info_read(multi_.get(), &queued)) {
        if (m->msg == CURLMSG_DONE && m->easy_handle == e) {
          out.curl = m->data.result;
          done = true;
        }
      }
      if (done) break;
      if (shared_->stop.load()) {
        t.abort = Transfer::Abort::kStop;
        out.curl = CURLE_ABORTED_BY_CALLBACK;
        break;
      }
      int wait_ms = 5000;
      if (t.initial) {
        const auto left = shared_->config.list_stream_timeout - (Clock::now() - t.started);
        if (left <= Clock::duration::zero()) {
          t.abort = Transfer::Abort::kNoInitialEnd;
          out.curl = CURLE_OPERATION_TIMEDOUT;
          curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
          break;
        }
        wait_ms = static_cast<int>(
            std::min<int64_t>(wait_ms, std::chrono::ceil<milliseconds>(left).count()));
      }
      if (t.stall_timeout.count() > 0) {
        // Checked after curl_multi_perform, so bytes that arrived in time always count.
        const auto silent = Clock::now() - t.last_byte;
        if (silent >= t.stall_timeout) {
          t.abort = Transfer::Abort::kStalled;
          out.curl = CURLE_OPERATION_TIMEDOUT;
          // Neither this connection nor another one in the cache is trusted again: over
          // HTTP/2 an abandoned stream would otherwise leave its connection up for reuse.
          curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
          fresh_connection_ = true;
          break;
        }
        const auto left = std::chrono::ceil<milliseconds>(t.stall_timeout - silent).count();
        wait_ms = static_cast<int>(std::min<int64_t>(wait_ms, left));
      }
      // Sleeps until the socket is ready, curl's own next timeout, the stall deadline or
      // stop()'s wakeup: an idle watch costs no wakeups of its own (200 agents on one machine
      // woke 6,000 times a second at the former 100 ms).
      curl_multi_poll(multi_.get(), nullptr, 0, wait_ms, nullptr);
    }
    curl_multi_remove_handle(multi_.get(), e);
    if (t.status == 0) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &t.status);
    // A request this agent's own stop cut short before any answer is not the server's doing.
    if (!t.counted && (t.status != 0 || t.abort != Transfer::Abort::kStop)) {
      shared_->count_request(
          t.status, Clock::now() - t.started,
          t.streaming || t.status == 0 ? std::nullopt : std::optional<size_t>(t.body.size()));
    }
    out.curl_error =
        errbuf_[0] != '\0' ? std::string(errbuf_.data()) : curl_easy_strerror(out.curl);
    return out;
  }

  // --- stats and metrics ---------------------------------------------------------------

  void count_reconnect(const std::string& reason) {
    shared_->reconnects.Add({{"kind", kind_name_}, {"reason", reason}}).Increment();
    std::lock_guard lock(stats_mu_);
    stats_.reconnects[reason]++;
  }

  void count_decode_error(const std::string& what) {
    spdlog::warn("kube {}: rejected {}", kind_name_, what);
    decode_errors_.Increment();
    std::lock_guard lock(stats_mu_);
    stats_.decode_errors++;
  }

  void set_resource_version(const std::string& rv) {
    resource_version_ = rv;
    std::lock_guard lock(stats_mu_);
    stats_.resource_version = rv;
  }

  void post(model::Event ev) {
    ev.received = Clock::now();  // each event is made just before it is posted
    shared_->sink(std::move(ev));
  }

  // Another node's pod (watched cluster-wide for DNS's verified pod records) keeps what DNS
  // and the routing rules read of it: its key, node, addresses, phase and deletion; its labels
  // and annotations (drain's, for this node's pods only) are dropped, for memory.
  void slim(model::Object& o) const {
    auto* p = std::get_if<model::Pod>(&o);
    if (!p || p->node_name == shared_->config.node_name) return;
    p->labels.clear();
    p->annotations.clear();
  }

  // --- watch -----------------------------------------------------------------------------

  // Whether resourceVersion `rv` is older than `held` (both as this agent's revisions; a
  // version that does not parse is never called older).
  static bool behind(const std::string& rv, const std::string& held) {
    if (held.empty()) return false;
    auto a = model::parse_revision(rv);
    auto b = model::parse_revision(held);
    return a && b && *a < *b;
  }

  void count_behind(const char* what, const std::string& rv) {
    spdlog::warn("kube {}: a {} at resourceVersion {}, behind the {} held: not taken", kind_name_,
                 what, rv, resource_version_);
    std::lock_guard lock(stats_mu_);
    stats_.bookmarks_behind++;
  }

  // The end of a WatchList's initial events: the state is posted as one Replace, as a list's.
  bool end_initial_events(Transfer& t, const WatchEvent& ev) {
    if (!ev.initial_events_end) {
      // A server that does not know sendInitialEvents sends bookmarks without the annotation
      // and never the end: what came is the state at no known version.
      t.abort = Transfer::Abort::kNotWatchList;
      return false;
    }
    auto rv = model::parse_revision(ev.resource_version);
    if (t.initial->not_older_than && rv && *rv < *t.initial->not_older_than) {
      count_behind("WatchList end bookmark", ev.resource_version);
      t.abort = Transfer::Abort::kBehind;
      return false;
    }
    Transfer::Initial state = std::move(*t.initial);
    t.initial.reset();
    spdlog::info("kube {}: got {} objects at resourceVersion {} by WatchList ({:.0f} ms)",
                 kind_name_, state.objects.size(), ev.resource_version,
                 std::chrono::duration<double, std::milli>(Clock::now() - t.started).count());
    post_state(std::move(state.objects), std::move(state.keep), ev.resource_version, true);
    t.state_posted = true;
    return true;
  }

  // "ADDED ns/name (rv N): why" for an object that did not decode.
  static std::string undecodable(const WatchEvent& ev) {
    return std::string(to_string(ev.type)) + " " + (ev.key.ns.empty() ? "" : ev.key.ns + "/") +
           ev.key.name + " (rv " + ev.resource_version + "): " + ev.decode_error;
  }

  // A complete state (a list's or a WatchList's), posted as one Replace at `rv`.
  void post_state(std::vector<model::Object> objects, std::vector<model::ObjectKey> keep,
                  const std::string& rv, bool by_watch_list) {
    set_resource_version(rv);
    model::Event out;
    out.change = model::Replace{kind_, std::move(objects), std::move(keep)};
    out.resource_version = rv;
    post(std::move(out));
    {
      std::lock_guard lock(stats_mu_);
      stats_.lists++;
      if (by_watch_list) stats_.watch_lists++;
      if (listed_once_) stats_.relists++;
      stats_.synced = true;
    }
    if (listed_once_) relists_.Increment();
    listed_once_ = true;
  }

  // Handles one line of the watch stream; false ends the stream.
  bool handle_watch_line(Transfer& t, std::string_view line) {
    auto parsed = parse_watch_event(line, kind_, parser_);
    if (!parsed) {
      count_decode_error("watch stream line: " + parsed.error());
      t.abort = Transfer::Abort::kBadStream;
      return false;
    }
    WatchEvent& ev = *parsed;
    t.events++;
    switch (ev.type) {
      case WatchEventType::kError: {
        error_events_.Increment();
        {
          std::lock_guard lock(stats_mu_);
          stats_.error_events++;
        }
        t.error_status = ev.status;
        t.abort = ev.status.expired() ? Transfer::Abort::kExpired : Transfer::Abort::kErrorEvent;
        return false;
      }
      case WatchEventType::kBookmark: {
        bookmarks_.Increment();
        {
          std::lock_guard lock(stats_mu_);
          stats_.bookmarks++;
        }
        if (t.initial) return end_initial_events(t, ev);
        // A bookmark behind the version already held would move the position back: a later
        // watch from it could hand this agent events it has applied, and a relist from it an
        // older state. Not taken.
        if (behind(ev.resource_version, resource_version_)) {
          count_behind("bookmark", ev.resource_version);
          return true;
        }
        set_resource_version(ev.resource_version);
        return true;
      }
      case WatchEventType::kAdded:
      case WatchEventType::kModified:
      case WatchEventType::kDeleted:
        break;
    }
    if (t.initial) {
      // The state, an object at a time: ADDED events only, until the end bookmark.
      if (ev.type != WatchEventType::kAdded) {
        count_decode_error(std::string("WatchList stream: a ") + std::string(to_string(ev.type)) +
                           " event among the initial events");
        t.abort = Transfer::Abort::kBadStream;
        return false;
      }
      if (ev.object) {
        slim(*ev.object);
        t.initial->objects.push_back(std::move(*ev.object));
      } else {
        count_decode_error(undecodable(ev));
        if (!ev.key.name.empty()) t.initial->keep.push_back(ev.key);
      }
      return true;
    }
    {
      std::lock_guard lock(stats_mu_);
      if (ev.type == WatchEventType::kAdded) stats_.added++;
      if (ev.type == WatchEventType::kModified) stats_.modified++;
      if (ev.type == WatchEventType::kDeleted) stats_.deleted++;
    }
    (ev.type == WatchEventType::kAdded      ? added_
     : ev.type == WatchEventType::kModified ? modified_
                                            : deleted_)
        .Increment();

    if (ev.type == WatchEventType::kDeleted) {
      // The key alone is enough to delete, even when the object's last state is malformed.
      if (ev.key.name.empty() && ev.object) ev.key = key_of(*ev.object);
      if (ev.key.name.empty()) {
        count_decode_error("DELETED event without metadata.name");
      } else {
        model::Event out;
        out.change = model::Remove{kind_, ev.key};
        out.resource_version = ev.resource_version;
        post(std::move(out));
      }
    } else if (!ev.object) {
      count_decode_error(undecodable(ev));
    } else {
      slim(*ev.object);
      model::Event out;
      out.change = model::Upsert{std::move(*ev.object)};
      out.resource_version = ev.resource_version;
      post(std::move(out));
    }
    // Only after the event was handled: a stream cut before this line ends resumes before it.
    if (!ev.resource_version.empty()) set_resource_version(ev.resource_version);
    return true;
  }

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

  // One watch, until it ends. `initial`: a WatchList, whose initial events are the state.
  WatchResult watch_once(bool force_token, bool initial = false,
                         ListFrom from = ListFrom::kConsistent) {
    const auto& cfg = shared_->config;
    int64_t timeout_s = cfg.watch_timeout.count();
    if (cfg.watch_timeout_jitter > 0 && timeout_s > 0) {
      std::uniform_real_distribution<double> d(0.0, cfg.watch_timeout_jitter);
      timeout_s += static_cast<int64_t>(static_cast<double>(timeout_s) * d(rng_));
    }
    if (timeout_s < 1) timeout_s = 1;
    std::string url;
    Transfer t;
    if (initial) {
      // The state as a watch: at least as new as the last version seen (a relist), or, with no
      // version, as a consistent read.
      url = base_url_ + "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true" +
            "&resourceVersionMatch=NotOlderThan";
      t.initial.emplace();
      if (from == ListFrom::kNotOlderThan && !resource_version_.empty()) {
        url += "&resourceVersion=" + query_escape(resource_version_);
        if (auto rv = model::parse_revision(resource_version_)) t.initial->not_older_than = *rv;
      }
      url += "&timeoutSeconds=" + std::to_string(timeout_s) + selectors_;
    } else {
      url = base_url_ +
            "?watch=1&allowWatchBookmarks=true&resourceVersion=" + query_escape(resource_version_) +
            "&timeoutSeconds=" + std::to_string(timeout_s) + selectors_;
    }
    t.streaming = true;
    t.stall_timeout = cfg.watch_stall_timeout;
    auto started = Clock::now();
    // The server ends the watch after timeoutSeconds; give it some slack before curl does.
    Outcome out = perform(url, t, seconds(timeout_s + 30), force_token);
    WatchResult r;
    r.retry_after = t.retry_after;
    r.state_posted = t.state_posted;
    if (t.abort == Transfer::Abort::kStop || shared_->stop.load()) {
      r.end = WatchEnd::kStopped;
      return r;
    }
    if (t.status == 200) {
      std::lock_guard lock(stats_mu_);
      stats_.watches++;
    }
    r.progress = t.events > 0 || (t.status == 200 && Clock::now() - started >= seconds(1));
    // A WatchList made progress only once its state was in: one cut short again and again
    // (a 410 among its initial events) backs off as a failing list does.
    if (initial && !t.state_posted) r.progress = false;
    switch (t.abort) {
      case Transfer::Abort::kNotWatchList:
      case Transfer::Abort::kNoInitialEnd:
        spdlog::warn("kube {}: the API server {} a WatchList; listing instead", kind_name_,
                     t.abort == Transfer::Abort::kNoInitialEnd
                         ? "sent no end of the initial events within the bound of"
                         : "answered without an end bookmark");
        curl_easy_setopt(easy_.get(), CURLOPT_FORBID_REUSE, 1L);
        fresh_connection_ = true;
        r.end = WatchEnd::kNotOffered;
        r.reason = t.abort == Transfer::Abort::kNoInitialEnd ? "no_end" : "not_offered";
        return r;
      case Transfer::Abort::kBehind:
        // The state named a version older than one this agent held: a lagging server. Listed
        // instead, not older than the version held (list_all), which it answers or refuses.
        fresh_connection_ = true;
        r.end = WatchEnd::kNotOffered;
        r.reason = "behind";
        return r;
      case Transfer::Abort::kStalled:
        // Abandoning the transfer closes its connection; the next watch opens a new one.
        spdlog::warn(
            "kube {}: watch stalled: nothing received for {} ms, resuming from "
            "resourceVersion {} on a new connection",
            kind_name_, cfg.watch_stall_timeout.count(), resource_version_);
        stalls_.Increment();
        {
          std::lock_guard lock(stats_mu_);
          stats_.stalls++;
        }
        r.end = WatchEnd::kFailed;
        r.reason = "stalled";
        return r;
      case Transfer::Abort::kExpired:
        spdlog::info("kube {}: watch from resourceVersion {} expired ({}), relisting", kind_name_,
                     resource_version_, t.error_status.message);
        r.end = WatchEnd::kExpired;
        return r;
      case Transfer::Abort::kErrorEvent:
        spdlog::warn("kube {}: watch ERROR event: code {} reason {}: {}", kind_name_,
                     t.error_status.code, t.error_status.reason, t.error_status.message);
        r.end = WatchEnd::kFailed;
        r.reason = "error_event";
        r.progress = false;
        return r;
      case Transfer::Abort::kBadStream:
        spdlog::warn("kube {}: watch stream unreadable, reconnecting", kind_name_);
        r.end = WatchEnd::kFailed;
        r.reason = "bad_stream";
        return r;
      default:
        break;
    }
    if (out.curl != CURLE_OK && t.status == 0) {
      spdlog::warn("kube {}: watch request failed: {}", kind_name_, out.curl_error);
      r.end = WatchEnd::kFailed;
      r.reason = "connect";
      return r;
    }
    if (t.status != 200) {
      auto st = parse_status(t.body, parser_);
      if (initial && (t.status == 422 || t.status == 400)) {
        spdlog::info("kube {}: the API server refused a WatchList (HTTP {}: {}); listing instead",
                     kind_name_, t.status, st.message.empty() ? body_excerpt(t) : st.message);
        r.end = WatchEnd::kNotOffered;
        r.reason = "refused";
        return r;
      }
      if (initial && t.status == 504) {
        spdlog::info(
            "kube {}: the API server's cache cannot answer a WatchList at "
            "resourceVersion {} ({}); asking again without a version (consistent)",
            kind_name_, resource_version_, st.message);
        r.end = WatchEnd::kFailed;
        r.reason = "version_unavailable";
        r.version_unavailable = true;
        return r;
      }
      if (t.status == 410 || (st.code == 410)) {
        spdlog::info("kube {}: watch answered 410 ({}), relisting", kind_name_, st.message);
        r.end = WatchEnd::kExpired;
        return r;
      }
      spdlog::warn("kube {}: watch answered HTTP {}: {}", kind_name_, t.status,
                   st.message.empty() ? body_excerpt(t) : st.message);
      r.end = WatchEnd::kFailed;
      r.reason = reason_for_status(t.status);
      r.unauthorized = t.status == 401;
      r.progress = false;
      return r;
    }
    if (out.curl != CURLE_OK) {
      spdlog::info("kube {}: watch stream dropped: {}", kind_name_, out.curl_error);
      r.end = WatchEnd::kFailed;
      r.reason = "dropped";
      return r;
    }
    r.end = WatchEnd::kClosed;
    r.reason = "closed";
    return r;
  }

  // --- list ------------------------------------------------------------------------------

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

  // Decodes a list's pages on a thread of its own, one at a time, while the watcher fetches
  // the next: a page's request and its decoding take about as long, so with a core to spare a
  // list of many pages takes up to half the time (10k services on two busy cores: the
  // EndpointSlices' list 575 -> 440 ms, bench/results/proxy-e2e.md). At most one page waits
  // for the decoder while the next is read.
  class PageDecoder {
   public:
    explicit PageDecoder(model::ObjectKind kind) : kind_(kind) {}
    ~PageDecoder() {
      if (!thread_.joinable()) return;
      {
        std::lock_guard lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    // Starts decoding `body` (`size` bytes, then kJsonPadding more); the page started before
    // must have been taken.
    void start(std::string body, size_t size, bool protobuf) {
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      {
        std::lock_guard lock(mu_);
        body_ = std::move(body);
        size_ = size;
        protobuf_ = protobuf;
        job_ = true;
      }
      cv_.notify_all();
    }
    // The page started last, once decoded.
    Result<DecodedList> take() {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return result_.has_value(); });
      Result<DecodedList> r = std::move(*result_);
      result_.reset();
      return r;
    }
    Clock::duration busy() const {
      std::lock_guard lock(mu_);
      return busy_;
    }

   private:
    void run() {
      std::unique_lock lock(mu_);
      for (;;) {
        cv_.wait(lock, [&] { return stop_ || job_; });
        if (stop_) return;
        job_ = false;
        std::string body = std::move(body_);
        const size_t size = size_;
        const bool protobuf = protobuf_;
        lock.unlock();
        const auto begin = Clock::now();
        const std::string_view page(body.data(), size);
        auto decoded =
            protobuf ? decode_list_protobuf(page, kind_) : decode_list(page, kind_, true);
        const auto took = Clock::now() - begin;
        lock.lock();
        busy_ += took;
        result_.emplace(std::move(decoded));
        cv_.notify_all();
      }
    }

    const model::ObjectKind kind_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::thread thread_;
    bool stop_ = false;
    bool job_ = false;
    std::string body_;
    size_t size_ = 0;
    bool protobuf_ = false;
    std::optional<Result<DecodedList>> result_;
    Clock::duration busy_{};
  };

  // What a list asks the API server for. A relist after the watch expired asks for a state
  // not older than the last one seen (resourceVersionMatch=NotOlderThan), which kube-apiserver
  // answers from its watch cache (servers from 1.31; its continued pages from 1.34) rather than
  // by a quorum read of etcd: when every agent of 5,000 relists at once (an API server restart
  // past the watch window), that is the difference that matters. When the cache cannot answer
  // (504: it has not caught up with that version; or 410), a consistent list follows at once.
  // The first list of a process is consistent (no version), unlike client-go's reflector, whose
  // first list takes any version ("0", the cache's, which may trail etcd): this agent may have
  // confirmed an endpoint's removal before it restarted, and a trailing list would put that
  // endpoint back into the dataplane, DNS and the feed until the watch caught up — after the
  // drain may have released its pod. Agents restart one by one in a DaemonSet rollout, and the
  // first page of a consistent list is served from the cache too from 1.31
  // (ConsistentListFromCache).

  ListResult list_all(bool force_token, ListFrom from) {
    ListResult r;
    // The version the first page names (none: a consistent list).
    const bool not_older_than = from == ListFrom::kNotOlderThan && !resource_version_.empty();
    std::string cont;
    int restarts = 0;
    // Pages of one list are about the same size: each body is given room for the largest so
    // far up front, rather than grown (and copied) by doubling from nothing, page after page.
    size_t page_bytes = 0;
    PageDecoder decoder(kind_);
    bool decoding = false;           // a page is with the decoder
    bool decoding_protobuf = false;  // that page is protobuf
    // Adds the page with the decoder to the list; false when it did not decode.
    auto collect = [&]() -> bool {
      if (!decoding) return true;
      decoding = false;
      auto decoded = decoder.take();
      if (!decoded) {
        spdlog::warn("kube {}: list response unreadable: {}", kind_name_, decoded.error());
        r.reason = "bad_response";
        return false;
      }
      ++r.pages;
      if (decoding_protobuf) ++r.protobuf_pages;
      for (const auto& err : decoded->errors) count_decode_error(err);
      r.keep.insert(r.keep.end(), decoded->failed.begin(), decoded->failed.end());
      for (auto& o : decoded->objects) {
        slim(o);
        r.objects.push_back(std::move(o));
      }
      return true;
    };
    while (true) {
      std::string url =
          base_url_ + "?limit=" + std::to_string(shared_->config.page_size) + selectors_;
      if (!cont.empty()) {
        url += "&continue=" + query_escape(cont);  // a continued list names no version
      } else if (not_older_than) {
        url += "&resourceVersion=" + query_escape(resource_version_) +
               "&resourceVersionMatch=NotOlderThan";
      } else if (from == ListFrom::kAny) {
        url += "&resourceVersion=0";  // any version: the watch cache's, with no etcd read
      }
      Transfer t;
      t.body_limit = kMaxListBody;
      t.offer_protobuf = shared_->config.protobuf_lists && protobuf_list_kind(kind_);
      t.body.reserve(std::min(page_bytes + page_bytes / 8, kMaxListBody) + kJsonPadding);
      const auto fetch_start = Clock::now();
      Outcome out = perform(url, t, shared_->config.list_timeout, force_token);
      r.fetching += Clock::now() - fetch_start;
      force_token = false;
      r.retry_after = t.retry_after;
      if (t.abort == Transfer::Abort::kStop || shared_->stop.load()) {
        r.stopped = true;
        return r;
      }
      if (t.abort == Transfer::Abort::kTooLarge) {
        spdlog::error("kube {}: list response larger than {} bytes", kind_name_, kMaxListBody);
        r.reason = "too_large";
        return r;
      }
      if (out.curl != CURLE_OK) {
        spdlog::warn("kube {}: list request failed: {}", kind_name_, out.curl_error);
        r.reason = t.status == 0 ? "connect" : "dropped";
        return r;
      }
      if (t.status == 410 && !cont.empty() && restarts < 3) {
        // The continue token expired mid-list: start over (from a new snapshot).
        spdlog::info("kube {}: list continue token expired, restarting the list", kind_name_);
        ++restarts;
        if (decoding) decoder.take();
        decoding = false;
        cont.clear();
        r.objects.clear();
        r.keep.clear();
        continue;
      }
      if (cont.empty() && not_older_than && (t.status == 410 || t.status == 504)) {
        auto st = parse_status(t.body, parser_);
        spdlog::info(
            "kube {}: the API server's cache cannot answer a list at resourceVersion {} "
            "(HTTP {}: {}); listing again without a version (a consistent read)",
            kind_name_, resource_version_, t.status,
            st.message.empty() ? body_excerpt(t) : st.message);
        r.reason = "version_unavailable";
        r.version_unavailable = true;
        return r;
      }
      if (t.status != 200) {
        auto st = parse_status(t.body, parser_);
        spdlog::warn("kube {}: list answered HTTP {}: {}", kind_name_, t.status,
                     st.message.empty() ? body_excerpt(t) : st.message);
        r.reason = reason_for_status(t.status);
        r.unauthorized = t.status == 401;
        return r;
      }
      page_bytes = std::max(page_bytes, t.body.size());
      // Zeroed room after the body, which stays in the string's capacity (and goes with it to
      // the decoder): the parsers read the body where it is instead of copying it (1 MB a
      // page) into a padded buffer.
      const size_t body_size = t.body.size();
      t.body.append(kJsonPadding, '\0');
      t.body.resize(body_size);
      // Only the metadata now, for the next request; the items on the decoder's thread.
      const std::string_view page(t.body.data(), body_size);
      auto meta = t.protobuf ? peek_list_meta_protobuf(page, kind_) : peek_list_meta(page);
      if (!meta) {
        spdlog::warn("kube {}: list response unreadable: {}", kind_name_, meta.error());
        r.reason = "bad_response";
        return r;
      }
      if (!collect()) return r;
      // The first page's resourceVersion is the snapshot the whole list comes from.
      if (cont.empty()) r.resource_version = meta->resource_version;
      decoding_protobuf = t.protobuf;
      decoder.start(std::move(t.body), body_size, t.protobuf);
      decoding = true;
      if (meta->continue_token.empty()) break;
      cont = meta->continue_token;
    }
    if (!collect()) return r;
    r.decoding = decoder.busy();
    {
      std::lock_guard lock(stats_mu_);
      stats_.list_pages += r.pages;
      stats_.list_protobuf_pages += r.protobuf_pages;
    }
    r.ok = true;
    return r;
  }

  // --- the loop --------------------------------------------------------------------------

  milliseconds backoff_delay(int failures, std::optional<seconds> retry_after) {
    const auto& cfg = shared_->config;
    if (retry_after) {
      return std::min<milliseconds>(*retry_after, cfg.retry_after_max);
    }
    int64_t cap = cfg.backoff_initial.count();
    for (int i = 0; i < failures && cap < cfg.backoff_max.count(); ++i) cap *= 2;
    cap = std::min<int64_t>(cap, cfg.backoff_max.count());
    return spread(milliseconds(cap));
  }

  // A uniform random share of `d` (full jitter).
  milliseconds spread(milliseconds d) {
    std::uniform_int_distribution<int64_t> u(0, std::max<int64_t>(d.count(), 0));
    return milliseconds(u(rng_));
  }

  void count_watch_list_fallback(const std::string& reason) {
    shared_->watch_list_fallbacks.Add({{"kind", kind_name_}, {"reason", reason}}).Increment();
    std::lock_guard lock(stats_mu_);
    stats_.watch_list_fallbacks[reason]++;
  }

  // Lists (paged); false when the watcher stops.
  bool list(bool& force_token, ListFrom& from, int& failures) {
    ListResult l = list_all(force_token, from);
    force_token = false;
    if (l.stopped) return false;
    if (!l.ok) {
      count_reconnect(l.reason);
      force_token = l.unauthorized;
      if (l.version_unavailable) {
        // The server answered, just not from there: a consistent list next, spread as
        // every retry is.
        from = ListFrom::kConsistent;
        return shared_->sleep_for(spread(shared_->config.backoff_initial));
      }
      return shared_->sleep_for(backoff_delay(failures++, l.retry_after));
    }
    using ms = std::chrono::duration<double, std::milli>;
    spdlog::info(
        "kube {}: listed {} objects at resourceVersion {} ({} pages{}: {:.0f} ms requesting, "
        "{:.0f} ms decoding)",
        kind_name_, l.objects.size(), l.resource_version, l.pages,
        l.protobuf_pages == 0 ? std::string()
                              : ", " + std::to_string(l.protobuf_pages) + " in protobuf",
        ms(l.fetching).count(), ms(l.decoding).count());
    post_state(std::move(l.objects), std::move(l.keep), l.resource_version, false);
    need_list_ = false;
    from = ListFrom::kConsistent;
    return true;
  }

  void run() {
    // The first state of a process: a consistent one (no version) unless the mode says any.
    // A relist after an expired watch asks for one not older than the last version seen, so
    // that the state never goes back in time. With kCache the first list may be older than a
    // state this agent held before it restarted: one whose endpoint removal it had confirmed
    // is then back in its dataplane, DNS and feed until the watch catches up — which is why
    // kAuto falls back to consistent lists, not to this.
    const ListMode mode = shared_->config.list_mode;
    bool watch_list = mode == ListMode::kAuto;
    int failures = 0;
    bool force_token = false;
    ListFrom from = mode == ListMode::kCache ? ListFrom::kAny : ListFrom::kConsistent;
    while (!shared_->stop.load()) {
      bool initial = false;
      if (need_list_) {
        if (!watch_list) {
          if (!list(force_token, from, failures)) return;
          if (need_list_) continue;
        } else {
          initial = true;
        }
      }
      WatchResult w = watch_once(force_token, initial, from);
      force_token = false;
      if (w.end == WatchEnd::kStopped) return;
      if (w.state_posted) {
        need_list_ = false;
        from = ListFrom::kConsistent;
      }
      if (w.progress) failures = 0;
      std::optional<milliseconds> delay;
      switch (w.end) {
        case WatchEnd::kNotOffered:
          count_watch_list_fallback(w.reason);
          // A lagging server's state (behind) is listed once; a server without WatchList is
          // listed from now on.
          if (w.reason == "behind") {
            if (!list(force_token, from, failures)) return;
          } else {
            watch_list = false;
          }
          continue;
        case WatchEnd::kExpired:
          count_reconnect("expired");
          need_list_ = true;
          from = ListFrom::kNotOlderThan;  // nothing older than what this agent has seen
          delay = w.progress ? spread(shared_->config.relist_spread)
                             : backoff_delay(failures++, std::nullopt);
          break;
        case WatchEnd::kClosed:
          count_reconnect("closed");
          if (!w.progress) delay = backoff_delay(failures++, std::nullopt);
          break;
        case WatchEnd::kFailed:
          count_reconnect(w.reason);
          force_token = w.unauthorized;
          if (w.version_unavailable) {
            from = ListFrom::kConsistent;
            delay = spread(shared_->config.backoff_initial);
            break;
          }
          if (!w.progress) delay = backoff_delay(failures++, w.retry_after);
          break;
        case WatchEnd::kStopped:
          return;
      }
      if (delay && !shared_->sleep_for(*delay)) return;
    }
  }

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

KubeClient::KubeClient(ClusterConfig cluster, KubeClientConfig config, Sink sink,
                       prometheus::Registry& registry) {
  curl_init_once();
  uint64_t seed = config.seed;
  if (seed == 0) seed = std::random_device{}();
  std::vector<model::ObjectKind> kinds;
  if (config.watch_services) kinds.push_back(model::ObjectKind::kService);
  if (config.watch_endpoint_slices) kinds.push_back(model::ObjectKind::kEndpointSlice);
  if (config.watch_nodes) kinds.push_back(model::ObjectKind::kNode);
  if (config.watch_pods) {
    if (config.node_name.empty()) {
      spdlog::warn("kube: not watching pods: no node name");
    } else {
      kinds.push_back(model::ObjectKind::kPod);
    }
  }
  shared_ =
      std::make_shared<Shared>(std::move(cluster), std::move(config), std::move(sink), registry);
  for (size_t i = 0; i < kinds.size(); ++i) {
    watchers_.push_back(std::make_unique<Watcher>(shared_, kinds[i], seed + i));
  }
}

KubeClient::~KubeClient() {
  stop();
}

void KubeClient::start() {
  if (started_) return;
  started_ = true;
  spdlog::info("kube: watching {} ({})", shared_->cluster.server, shared_->cluster.origin);
  for (auto& w : watchers_) w->start();
}

void KubeClient::stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard lock(shared_->sleep_mu);
    shared_->stop.store(true);
  }
  shared_->sleep_cv.notify_all();
  for (auto& w : watchers_) w->wake();
  for (auto& w : watchers_) w->join();
}

bool KubeClient::synced() const {
  for (const auto& w : watchers_) {
    if (!w->stats().synced) return false;
  }
  return true;
}

KindStats KubeClient::stats(model::ObjectKind kind) const {
  for (const auto& w : watchers_) {
    if (w->kind() == kind) return w->stats();
  }
  return {};
}

std::vector<model::ObjectKind> KubeClient::kinds() const {
  std::vector<model::ObjectKind> out;
  for (const auto& w : watchers_) out.push_back(w->kind());
  return out;
}

}  // namespace endpointd::watcher
