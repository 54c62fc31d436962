// libcurl, one easy handle per request: these requests are few (a preflight, events), so no
// connection is kept.
#include "daemon/kube_request.h"

#include <curl/curl.h>

#include <cstdlib>
#include <ctime>
#include <memory>
#include <optional>

namespace endpointd::daemon {

namespace {

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

size_t on_body(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  std::string_view line(data, size * n);
  constexpr std::string_view kDate = "date:";
  if (line.size() > kDate.size()) {
    bool match = true;
    for (size_t i = 0; i < kDate.size() && match; ++i)
      match = std::tolower(static_cast<unsigned char>(line[i])) == kDate[i];
    if (match) {
      auto v = line.substr(kDate.size());
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' '))
        v.remove_suffix(1);
      static_cast<KubeResponse*>(user)->date = std::string(v);
    }
  }
  return size * n;
}

}  // namespace

KubeRequester::KubeRequester(watcher::ClusterConfig cluster)
    : cluster_(std::move(cluster)), tokens_(cluster_) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

KubeRequester::~KubeRequester() = default;

Result<KubeResponse> KubeRequester::request(std::string_view method, const std::string& path,
                                            const std::string& body,
                                            std::chrono::milliseconds timeout,
                                            std::string_view content_type) {
  std::unique_ptr<CURL, CurlDeleter> e(curl_easy_init());
  if (!e) return Error{"libcurl: cannot make a handle"};
  const auto& c = cluster_;
  std::string url = c.server;
  while (!url.empty() && url.back() == '/') url.pop_back();
  url += path;
  std::string m(method);
  char errbuf[CURL_ERROR_SIZE] = {};
  KubeResponse r;
  curl_easy_setopt(e.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(e.get(), CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(e.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e.get(), CURLOPT_CUSTOMREQUEST, m.c_str());
  curl_easy_setopt(e.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(e.get(), CURLOPT_USERAGENT, "endpointd");
  curl_easy_setopt(e.get(), CURLOPT_WRITEFUNCTION, &on_body);
  curl_easy_setopt(e.get(), CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(e.get(), CURLOPT_HEADERFUNCTION, &on_header);
  curl_easy_setopt(e.get(), CURLOPT_HEADERDATA, &r);
  if (m == "POST" || m == "PUT" || m == "PATCH") {
    curl_easy_setopt(e.get(), CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(e.get(), CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  }
  // The blobs must live until the transfer is done.
  curl_blob ca{}, cert{}, key{};
  if (c.insecure_skip_tls_verify) {
    curl_easy_setopt(e.get(), CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(e.get(), CURLOPT_SSL_VERIFYHOST, 0L);
  } else if (!c.ca_data.empty()) {
    ca = {const_cast<char*>(c.ca_data.data()), c.ca_data.size(), CURL_BLOB_NOCOPY};
    curl_easy_setopt(e.get(), CURLOPT_CAINFO_BLOB, &ca);
  } else if (!c.ca_file.empty()) {
    curl_easy_setopt(e.get(), CURLOPT_CAINFO, c.ca_file.c_str());
  }
  if (!c.client_cert_data.empty()) {
    cert = {const_cast<char*>(c.client_cert_data.data()), c.client_cert_data.size(),
            CURL_BLOB_NOCOPY};
    curl_easy_setopt(e.get(), CURLOPT_SSLCERT_BLOB, &cert);
  } else if (!c.client_cert_file.empty()) {
    curl_easy_setopt(e.get(), CURLOPT_SSLCERT, c.client_cert_file.c_str());
  }
  if (!c.client_key_data.empty()) {
    key = {const_cast<char*>(c.client_key_data.data()), c.client_key_data.size(), CURL_BLOB_NOCOPY};
    curl_easy_setopt(e.get(), CURLOPT_SSLKEY_BLOB, &key);
  } else if (!c.client_key_file.empty()) {
    curl_easy_setopt(e.get(), CURLOPT_SSLKEY, c.client_key_file.c_str());
  }
  curl_slist* h = nullptr;
  h = curl_slist_append(h, "Accept: application/json");
  if (!body.empty())
    h = curl_slist_append(h, ("Content-Type: " + std::string(content_type)).c_str());
  std::string token = tokens_.token();
  if (!token.empty()) h = curl_slist_append(h, ("Authorization: Bearer " + token).c_str());
  std::unique_ptr<curl_slist, SlistDeleter> headers(h);
  curl_easy_setopt(e.get(), CURLOPT_HTTPHEADER, headers.get());
  CURLcode rc = curl_easy_perform(e.get());
  if (rc != CURLE_OK)
    return Error{m + " " + url + ": " + (errbuf[0] ? std::string(errbuf) : curl_easy_strerror(rc))};
  curl_easy_getinfo(e.get(), CURLINFO_RESPONSE_CODE, &r.status);
  return r;
}

Result<watcher::ClusterConfig> cluster_config(const std::string& kubeconfig) {
  if (!kubeconfig.empty()) return watcher::from_kubeconfig(kubeconfig);
  if (const char* host = std::getenv("KUBERNETES_SERVICE_HOST"); host && *host)
    return watcher::in_cluster();
  return Error{"no API server: give --kubeconfig, or run in a pod"};
}

std::optional<int64_t> parse_http_date(std::string_view date) {
  std::string s(date);
  tm parts{};
  const char* end = strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &parts);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return static_cast<int64_t>(timegm(&parts));
}

}  // namespace endpointd::daemon
