// A kind's state for the API client: paged lists (their pages decoded on a thread of their
// own while the next is fetched) and the initial events of a WatchList, each posted as one
// Replace.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "watcher/decode.h"
#include "watcher/kube_watcher.h"

namespace endpointd::watcher {

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

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
      auto decoded = protobuf ? decode_list_protobuf(page, kind_) : decode_list(page, kind_, true);
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

}  // namespace

// A complete state (a list's or a WatchList's), posted as one Replace at `rv`.
void KubeClient::Watcher::post_state(std::vector<model::Object> objects,
                                     std::vector<model::ObjectKey> keep, const std::string& rv,
                                     bool by_watch_list) {
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

// The end of a WatchList's initial events: the state is posted as one Replace, as a list's.
bool KubeClient::Watcher::end_initial_events(Transfer& t, const WatchEvent& ev) {
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
  spdlog::info("kube {}: got {} objects at resourceVersion {} by WatchList ({:.0f} ms)", kind_name_,
               state.objects.size(), ev.resource_version,
               std::chrono::duration<double, std::milli>(Clock::now() - t.started).count());
  post_state(std::move(state.objects), std::move(state.keep), ev.resource_version, true);
  t.state_posted = true;
  return true;
}

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

KubeClient::Watcher::ListResult KubeClient::Watcher::list_all(bool force_token, ListFrom from) {
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

// Lists (paged); false when the watcher stops.
bool KubeClient::Watcher::list(bool& force_token, ListFrom& from, int& failures) {
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

}  // namespace endpointd::watcher
