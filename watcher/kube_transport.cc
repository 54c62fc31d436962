// One request of the API client over libcurl. Each kind's watcher has its own easy handle,
// driven through a private multi handle so that stop() can wake a blocked transfer at once
// (curl_multi_wakeup) instead of waiting for curl's next progress callback.
#include "watcher/kube_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <optional>

#include "watcher/decode.h"
#include "watcher/kube_watcher.h"

namespace endpointd::watcher {

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

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

// The value of header line `line` when its name is `name` (lower case, with the colon),
// without leading blanks.
std::optional<std::string_view> header_value(std::string_view line, std::string_view name) {
  if (line.size() <= name.size()) return std::nullopt;
  for (size_t i = 0; i < name.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return std::nullopt;
  auto v = line.substr(name.size());
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  return v;
}

}  // namespace

std::string url_host(std::string_view url) {
  if (auto scheme = url.find("://"); scheme != std::string_view::npos)
    url.remove_prefix(scheme + 3);
  url = url.substr(0, url.find_first_of("/?#"));
  if (auto at = url.rfind('@'); at != std::string_view::npos) url.remove_prefix(at + 1);
  return std::string(url);
}

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

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

std::string reason_for_status(long status) {
  if (status == 401) return "unauthorized";
  if (status == 403) return "forbidden";
  if (status == 410) return "expired";
  if (status == 429) return "throttled";
  if (status >= 500) return "server_error";
  return "http_" + std::to_string(status);
}

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

// The start of a response body for the log; not the bytes of a protobuf one.
std::string KubeClient::Watcher::body_excerpt(const Transfer& t) {
  return t.protobuf
             ? std::string("(a protobuf body of ") + std::to_string(t.body.size()) + " bytes)"
             : t.body.substr(0, 200);
}

size_t KubeClient::Watcher::on_header(char* data, size_t size, size_t n, void* user) {
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

size_t KubeClient::Watcher::on_body(char* data, size_t size, size_t n, void* user) {
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
KubeClient::Watcher::Outcome KubeClient::Watcher::perform(const std::string& url, Transfer& t,
                                                          milliseconds timeout, bool force_token) {
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
  curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, static_cast<long>(cfg.tcp_keepalive_interval.count()));
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
  out.curl_error = errbuf_[0] != '\0' ? std::string(errbuf_.data()) : curl_easy_strerror(out.curl);
  return out;
}

}  // namespace endpointd::watcher
