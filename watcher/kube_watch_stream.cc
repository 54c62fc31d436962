// A watch of the API client: one watch request and the events of its stream, each posted as an
// Upsert or a Remove (the initial events of a WatchList are gathered as its state), and how
// the watch ended.
#include <spdlog/spdlog.h>

#include <optional>
#include <random>
#include <variant>

#include "watcher/decode.h"
#include "watcher/kube_watcher.h"

namespace endpointd::watcher {

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

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

}  // namespace

// Whether resourceVersion `rv` is older than `held` (both as this agent's revisions; a
// version that does not parse is never called older).
bool KubeClient::Watcher::behind(const std::string& rv, const std::string& held) {
  if (held.empty()) return false;
  auto a = model::parse_revision(rv);
  auto b = model::parse_revision(held);
  return a && b && *a < *b;
}

void KubeClient::Watcher::count_behind(const char* what, const std::string& rv) {
  spdlog::warn("kube {}: a {} at resourceVersion {}, behind the {} held: not taken", kind_name_,
               what, rv, resource_version_);
  std::lock_guard lock(stats_mu_);
  stats_.bookmarks_behind++;
}

// "ADDED ns/name (rv N): why" for an object that did not decode.
std::string KubeClient::Watcher::undecodable(const WatchEvent& ev) {
  return std::string(to_string(ev.type)) + " " + (ev.key.ns.empty() ? "" : ev.key.ns + "/") +
         ev.key.name + " (rv " + ev.resource_version + "): " + ev.decode_error;
}

// Handles one line of the watch stream; false ends the stream.
bool KubeClient::Watcher::handle_watch_line(Transfer& t, std::string_view line) {
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

// One watch, until it ends. `initial`: a WatchList, whose initial events are the state.
KubeClient::Watcher::WatchResult KubeClient::Watcher::watch_once(bool force_token, bool initial,
                                                                 ListFrom from) {
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

}  // namespace endpointd::watcher
