// The API client's transport pieces over libcurl: handle ownership, the socket options every
// API connection gets, query escaping and the labels requests are counted under. The request
// itself is KubeClient::Watcher::perform (kube_transport.cc).
#pragma once

#include <curl/curl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace endpointd::watcher {

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

void curl_init_once();

inline constexpr size_t kMaxListBody = size_t{1} << 30;
inline constexpr size_t kMaxErrorBody = 64 * 1024;

std::string query_escape(std::string_view s);

// The reason a failed request is counted under (endpointd_watch_reconnects_total).
std::string reason_for_status(long status);

// The host of a server URL as client-go's rest_client_* metrics label it (Go's url.URL.Host:
// the authority without user info, with its port when the URL names one).
std::string url_host(std::string_view url);

}  // namespace endpointd::watcher
