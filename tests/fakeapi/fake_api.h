// An in-process fake Kubernetes API server for tests: Services, EndpointSlices, Nodes and Pods
// with the real list (limit/continue) and watch (chunked JSON lines, bookmarks, 410 on an
// expired resourceVersion) protocol, plus faults a test can inject and a record of the
// requests it got.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/fakeapi/token_issuer.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace endpointd::fakeapi {

struct TlsOptions {
  std::string cert_file;       // server certificate (PEM)
  std::string key_file;        // server key (PEM)
  std::string client_ca_file;  // when set, clients must present a certificate signed by it
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  std::optional<TlsOptions> tls;
  // Watch events kept per resource; a watch from before the oldest one gets 410 Expired.
  size_t history_limit = 10000;
  // Open watches that asked for bookmarks get one this often (0: only on send_bookmarks()).
  std::chrono::milliseconds bookmark_interval{0};
  // Requests served at once; each open watch holds one (agents × kinds watched).
  size_t threads = 64;
  // A watch with sendInitialEvents=true (WatchList), answered as kube-apiserver answers it with
  // the WatchList feature on (from 1.32): the state as ADDED events, then a BOOKMARK annotated
  // "k8s.io/initial-events-end", then changes; off (1.27-1.31 by default): 422 Invalid; or from
  // before it (ignored): the parameters are not read, and a watch without a resourceVersion
  // sends the state as ADDED events with no end bookmark.
  enum class WatchList : uint8_t { kOn, kOff, kIgnored };
  WatchList watch_list = WatchList::kOn;
};

struct RecordedRequest {
  std::string method;
  std::string path;
  std::multimap<std::string, std::string> params;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::chrono::steady_clock::time_point at;
  int remote_port = 0;  // the client's side of the connection

  std::string param(const std::string& name) const;  // "" when absent
  bool has_param(const std::string& name) const;
  std::string header(const std::string& lower_name) const;
  bool is_watch() const { return param("watch") == "1" || param("watch") == "true"; }
};

class FakeApiServer {
 public:
  explicit FakeApiServer(Options options = {});
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  // False when the server could not bind or load its certificates; see error().
  bool ok() const { return port_ > 0; }
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  std::string url() const;  // http(s)://127.0.0.1:<port>
  // A kubeconfig naming this server and no credentials (plaintext servers), written to a new
  // file under /tmp; its path, or "" when it cannot be written. The caller removes it.
  // disable_compression: the cluster's disable-compression (the client asks for no gzip).
  std::string write_kubeconfig(bool disable_compression = false) const;

  // --- state -------------------------------------------------------------------------
  // Creates or replaces an object given as JSON ("kind" and metadata.name required,
  // metadata.namespace for namespaced kinds). The object is stored as given, whatever its
  // content: a malformed Service is how a test feeds the client a malformed object. Returns
  // the resourceVersion it got. Throws std::invalid_argument on JSON it cannot store.
  uint64_t apply(std::string_view json);
  // Deletes an object; returns the resourceVersion of the deletion, 0 if it did not exist.
  // `resource`: "services", "endpointslices", "nodes", "pods" (or the kind).
  uint64_t remove(std::string_view resource, std::string_view ns, std::string_view name);
  // Makes the stored state exactly `objects`: applies new and changed ones, deletes the
  // others. Unchanged objects keep their resourceVersion.
  void replace_all(const std::vector<std::string>& objects);
  uint64_t resource_version() const;
  size_t object_count(std::string_view resource) const;

  // --- faults ------------------------------------------------------------------------
  // Aborts every open watch stream (no terminating chunk: the client sees a dropped
  // connection).
  void close_watches();
  // Aborts the watch stream that writes the next `n` event lines, right after the n-th.
  void close_watch_after_events(size_t n);
  // The next event line is written half, then the stream is aborted.
  void cut_next_event_midway();
  // The next watch request gets an ERROR event with a 410 Status (or, with `http`, an HTTP
  // 410 response).
  void expire_next_watch(bool http = false);
  // The next `n` requests are answered with `status` (and Retry-After when >= 0).
  void fail_next_requests(size_t n, int status, int retry_after_seconds = -1);
  // Every event line is written in `pieces` writes with `delay` between them.
  void set_write_split(size_t pieces, std::chrono::milliseconds delay);
  // Writes `line` (plus a newline) as is to the open watches of `resource`.
  void send_raw_watch_line(std::string_view resource, std::string line);
  // The next watch request is answered 200 with its headers and at most `events` event lines,
  // then nothing more: no events, no bookmarks, no end, and the connection stays open (a
  // wedged server, or a peer that is gone without a reset). Held until close_watches() or the
  // server stops, whether or not the client hung up.
  void silence_next_watch(size_t events = 0);
  // Forgets all watch history: every watch from an older resourceVersion gets 410.
  void compact();
  // Continue tokens handed out so far are answered with 410.
  void expire_continue_tokens();
  // Every open watch ends, and every watch from a version before now gets 410: what an API
  // server restarted past its watch window does to every agent at once (a relist storm).
  void expire_all_watches();
  // The next list request with a continue token is answered 410, whatever the token.
  void expire_next_continue();
  // Open watches that allow bookmarks get a BOOKMARK at the current resourceVersion.
  void send_bookmarks();
  // While set, a list naming a resourceVersion other than "0" is answered as by a watch
  // cache that has not caught up with it: 504 "Too large resource version".
  void set_cache_behind(bool behind);
  // WatchList faults: the state is sent but its end bookmark never is; the next WatchList
  // stream is cut by an ERROR 410 after `events` of its initial events; the end bookmark names
  // this resourceVersion instead of the state's (one that goes back).
  void withhold_initial_events_end(bool withhold);
  void expire_next_watch_list_after(size_t events);
  void set_initial_events_end_version(std::optional<uint64_t> rv);
  // Requests must carry "Authorization: Bearer <token>" (empty: no check).
  void set_required_token(std::string token);
  // SelfSubjectAccessReviews (POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews)
  // are answered allowed unless their verb, group and resource were denied here.
  void deny_access(std::string verb, std::string group, std::string resource);
  // The Date header every answer carries is the clock plus this (a server whose clock is off).
  void set_clock_offset(std::chrono::seconds offset);
  // events.k8s.io/v1 Events: created by POST, their series patched by PATCH (merge patch),
  // listed by GET .../namespaces/NS/events (fieldSelector regarding.name=NAME). Returns the
  // stored events of `ns` (all namespaces when empty) as JSON, in the order created.
  std::vector<std::string> events(const std::string& ns = "") const;
  // Encodes (and gzips) now every page of every resource's whole list at `limit` objects a
  // page, and answers such a list from them while nothing changes: a benchmark's agent then
  // does not share its cores with the encoding, as it does not with a real API server's.
  // Lists with selectors, another limit, or after a change are answered as always.
  void prepare_lists(size_t limit);
  // EndpointSlice lists are answered in protobuf to a request that offers it (the default), as
  // kube-apiserver does; false: in JSON whatever is asked, as a server without protobuf.
  void set_serve_protobuf(bool serve);

  // The service-account issuer (peer token identity): its discovery document at
  // /.well-known/openid-configuration, its keys at /openid/v1/jwks, TokenRequest (POST
  // .../serviceaccounts/SA/token) minting pod-bound tokens. Its issuer is url().
  TokenIssuer& token_issuer() { return *issuer_; }
  // While set, discovery and keys are answered 503.
  void fail_issuer_keys(bool fail);

  // --- what happened -----------------------------------------------------------------
  std::vector<RecordedRequest> requests() const;
  size_t open_watches() const;
  // Watches being held silent now (see silence_next_watch).
  size_t silent_watches() const;
  size_t watch_events_sent() const { return events_sent_.load(); }
  // Bytes of list and watch bodies written (as sent: compressed when they were).
  uint64_t body_bytes_sent() const { return bytes_sent_.load(); }
  // List pages answered from prepare_lists's pages.
  size_t prepared_pages_served() const { return prepared_served_.load(); }

 private:
  struct Stored;
  struct HistoryEvent;
  struct Resource;
  struct Watch;

  void handle(const httplib::Request& req, httplib::Response& res);
  static void set_list_body(const httplib::Request& req, httplib::Response& res, std::string body,
                            const char* type);
  // Whether a list of `r` is answered in protobuf: an EndpointSlice list whose request offers it.
  bool protobuf_for(const Resource& r, const httplib::Request& req) const;
  // A prepared page for this list request, served; false when there is none.
  bool serve_prepared(Resource& r, const httplib::Request& req, httplib::Response& res);
  // A list's resourceVersion and resourceVersionMatch as the API server takes them; false when
  // the answer (an error) is already in `res`.
  bool list_version_servable(const httplib::Request& req, httplib::Response& res);
  void handle_list(Resource& r, const httplib::Request& req, httplib::Response& res,
                   std::unique_lock<std::mutex>& lock);
  void handle_watch(Resource& r, const httplib::Request& req, httplib::Response& res,
                    std::unique_lock<std::mutex>& lock);
  Resource* resource_for_path(const std::string& path);
  Resource* resource_named(std::string_view name_or_kind);
  void record_event(Resource& r, const std::string& type, std::shared_ptr<const Stored> now,
                    std::shared_ptr<const Stored> before);
  uint64_t apply_locked(std::string_view json);
  uint64_t remove_locked(Resource& r, const std::string& key);

  Options options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listen_thread_;
  std::thread ticker_thread_;
  int port_ = 0;
  std::string error_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable tick_cv_;  // the bookmark ticker's
  bool stopping_ = false;
  uint64_t rv_ = 1;
  std::map<std::string, std::unique_ptr<Resource>> resources_;  // by resource name
  std::vector<RecordedRequest> requests_;
  std::string required_token_;
  std::set<std::tuple<std::string, std::string, std::string>> denied_;  // verb, group, resource
  std::chrono::seconds clock_offset_{0};
  void handle_post(const httplib::Request& req, httplib::Response& res);
  bool handle_token_request(const httplib::Request& req, httplib::Response& res);
  std::unique_ptr<TokenIssuer> issuer_;
  bool issuer_keys_fail_ = false;
  void handle_patch(const httplib::Request& req, httplib::Response& res);
  // core/v1 Events (GET /api/v1/namespaces/NS/events, /api/v1/events): the events.k8s.io/v1
  // Events stored, converted as kube-apiserver converts them, as a list or the Table kubectl
  // asks for; and the legacy discovery documents kubectl reads (core_events.cc). False: not
  // such a path. Called with mu_ held.
  bool handle_core_events(const httplib::Request& req, httplib::Response& res);
  bool handle_discovery(const httplib::Request& req, httplib::Response& res);
  struct StoredEvent {
    std::string ns, name, regarding, json;  // json: as created
    std::string series;                     // the patched series object, or empty
  };
  std::vector<StoredEvent> events_;
  std::string event_with_series(const StoredEvent& e) const;
  size_t fail_remaining_ = 0;
  int fail_status_ = 0;
  int fail_retry_after_ = -1;
  bool expire_next_watch_ = false;
  bool expire_next_watch_http_ = false;
  uint64_t close_epoch_ = 0;
  uint64_t bookmark_epoch_ = 0;
  std::optional<size_t> close_after_events_;
  bool cut_next_event_ = false;
  std::optional<size_t> silence_next_watch_;
  size_t silent_watches_ = 0;
  size_t split_pieces_ = 1;
  std::chrono::milliseconds split_delay_{0};
  bool expire_next_continue_ = false;
  bool cache_behind_ = false;
  bool serve_protobuf_ = true;
  uint64_t next_snapshot_id_ = 1;
  std::map<uint64_t, std::vector<std::shared_ptr<const Stored>>> snapshots_;
  std::map<uint64_t, uint64_t> snapshot_rv_;
  struct Prepared {
    uint64_t rv = 0;  // of the state they were encoded from
    size_t limit = 0;
    uint64_t snapshot = 0;                  // their continue tokens' snapshot
    std::vector<std::string> raw, gzipped;  // gzipped[i] empty: page i goes uncompressed
    // The same pages in protobuf (EndpointSlices; none when an item has no protobuf form).
    std::vector<std::string> protobuf, protobuf_gzipped;
  };
  std::map<std::string, Prepared> prepared_;  // by resource name
  size_t open_watches_ = 0;
  std::atomic<size_t> events_sent_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  bool withhold_initial_events_end_ = false;
  std::optional<size_t> expire_watch_list_after_;
  std::optional<uint64_t> initial_events_end_rv_;
  std::atomic<size_t> prepared_served_{0};
};

// Loads the objects of *.json (and, when built with YAML support, *.yaml / *.yml) files in
// a directory, or of one such file: single objects and `kind: List`. Objects of kinds the
// server does not serve are skipped by replace_all.
std::vector<std::string> load_manifest_dir(const std::string& dir,
                                           std::vector<std::string>* errors);

}  // namespace endpointd::fakeapi
