// One request to the Kubernetes API server, outside the watchers: what `endpointd check` asks
// (SelfSubjectAccessReview, the server's Date) and what the agent writes (Events). Blocking, with
// a deadline; the same credentials and trust as the list/watch client (watcher/kube_auth.h).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "model/result.h"
#include "watcher/kube_auth.h"

namespace endpointd::daemon {

struct KubeResponse {
  long status = 0;
  std::string body;
  std::string date;  // the Date header, as sent
};

class KubeRequester {
 public:
  explicit KubeRequester(watcher::ClusterConfig cluster);
  ~KubeRequester();
  KubeRequester(const KubeRequester&) = delete;
  KubeRequester& operator=(const KubeRequester&) = delete;

  // `path` is appended to the server URL. `body` (JSON) is sent with POST, PUT and PATCH
  // (`content_type` then names it). An error: no HTTP answer (connection, TLS, timeout), named.
  Result<KubeResponse> request(std::string_view method, const std::string& path,
                               const std::string& body = {},
                               std::chrono::milliseconds timeout = std::chrono::seconds(5),
                               std::string_view content_type = "application/json");
  const watcher::ClusterConfig& cluster() const { return cluster_; }

 private:
  watcher::ClusterConfig cluster_;
  watcher::TokenSource tokens_;
};

// The cluster configuration the agent would use: --kubeconfig, else in-cluster; an error when
// neither is there.
Result<watcher::ClusterConfig> cluster_config(const std::string& kubeconfig);

// An HTTP Date header (RFC 7231 IMF-fixdate) as seconds since the epoch; nullopt when it does
// not parse.
std::optional<int64_t> parse_http_date(std::string_view date);

}  // namespace endpointd::daemon
