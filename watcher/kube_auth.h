// Where the Kubernetes API server is and how endpointd proves who it is: loaded from a
// kubeconfig file or from the in-cluster service account, consumed by the API client.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <string_view>

#include "model/result.h"

namespace endpointd::watcher {

inline constexpr std::string_view kServiceAccountDir =
    "/var/run/secrets/kubernetes.io/serviceaccount";

struct ClusterConfig {
  // https://host:port (or http:// for plain HTTP), possibly with a path prefix.
  std::string server;

  // Trust anchors for the server's certificate: a PEM file, or PEM data. Neither: the
  // system's default CA bundle.
  std::string ca_file;
  std::string ca_data;
  bool insecure_skip_tls_verify = false;
  // The kubeconfig's disable-compression (client-go's field): lists and watches ask for no
  // gzip. The API server gzips a response of 128 KiB or more for clients that accept it, and
  // inflating a first list of 10k services × 10 endpoints (54 MB) costs the agent ~0.2 s of a
  // core at start; on a fast cluster network uncompressed is the cheaper of the two.
  bool disable_compression = false;

  // Bearer token, given directly or read from a file. A token file wins over a token: it is
  // re-read as it rotates.
  std::string token;
  std::string token_file;

  // Client certificate and key (PEM), as files or data.
  std::string client_cert_file;
  std::string client_cert_data;
  std::string client_key_file;
  std::string client_key_data;

  // For logs: where this came from ("kubeconfig /root/.kube/config context kind-kind").
  std::string origin;
};

// Reads a kubeconfig: the named context (empty: current-context), its cluster and user.
// Relative file paths are resolved against the kubeconfig's directory. Errors name the file
// and the field that is missing or bad.
Result<ClusterConfig> from_kubeconfig(const std::string& path, const std::string& context = "");

// The in-cluster configuration: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT and the
// service account's token and ca.crt in `sa_dir`.
Result<ClusterConfig> in_cluster(const std::string& sa_dir = std::string(kServiceAccountDir));

// Standard base64 (padding optional, whitespace ignored); nullopt-like error on bad input.
Result<std::string> base64_decode(std::string_view in);

// The bearer token to send, re-read from the token file at most once per `min_interval`
// (service-account tokens rotate), or at once when `force` (after a 401). Thread-safe.
class TokenSource {
 public:
  explicit TokenSource(const ClusterConfig& cfg,
                       std::chrono::milliseconds min_interval = std::chrono::milliseconds(1000));
  // Empty when no token is configured or the file cannot be read (the error is logged once
  // per change).
  std::string token(bool force = false);

 private:
  std::mutex mu_;
  std::string token_;
  std::string token_file_;
  std::chrono::milliseconds min_interval_;
  std::chrono::steady_clock::time_point last_read_{};
  bool read_once_ = false;
  bool last_read_failed_ = false;
};

}  // namespace endpointd::watcher
