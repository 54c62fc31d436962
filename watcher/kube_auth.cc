// Kubeconfig and in-cluster loading, and the rotating bearer token.
#include "watcher/kube_auth.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace endpointd::watcher {

namespace {

namespace fs = std::filesystem;

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{std::strerror(errno)};
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Error{"read error"};
  return ss.str();
}

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::string resolve(const fs::path& base_dir, const std::string& p) {
  if (p.empty()) return p;
  fs::path path(p);
  if (path.is_absolute()) return p;
  return (base_dir / path).lexically_normal().string();
}

// Finds the entry `name` in a kubeconfig list (clusters, contexts, users) and returns its
// `field` map (cluster, context, user).
Result<YAML::Node> find_named(const YAML::Node& root, const std::string& list,
                              const std::string& field, const std::string& name,
                              const std::string& where) {
  YAML::Node entries = root[list];
  if (!entries || !entries.IsSequence()) {
    return Error{where + ": '" + list + "' is missing or not a list"};
  }
  for (const auto& e : entries) {
    if (!e.IsMap()) continue;
    YAML::Node n = e["name"];
    if (n && n.IsScalar() && n.as<std::string>() == name) {
      YAML::Node v = e[field];
      if (!v || !v.IsMap()) {
        return Error{where + ": " + list + "[name=" + name + "]." + field + " is missing"};
      }
      return v;
    }
  }
  return Error{where + ": no entry named '" + name + "' in '" + list + "'"};
}

Result<std::string> scalar(const YAML::Node& map, const std::string& key,
                           const std::string& field_path) {
  YAML::Node v = map[key];
  if (!v) return std::string();
  if (!v.IsScalar()) return Error{field_path + "." + key + " must be a string"};
  return v.as<std::string>();
}

// Fills `out` with the decoded base64 of map[key] if present.
std::optional<Error> data_field(const YAML::Node& map, const std::string& key,
                                const std::string& field_path, std::string& out) {
  auto s = scalar(map, key, field_path);
  if (!s) return Error{s.error()};
  if (s->empty()) return std::nullopt;
  auto decoded = base64_decode(*s);
  if (!decoded) return Error{field_path + "." + key + ": " + decoded.error()};
  out = std::move(*decoded);
  return std::nullopt;
}

Result<ClusterConfig> parse_kubeconfig(const YAML::Node& root, const std::string& path,
                                       const std::string& context_arg) {
  const std::string where = "kubeconfig " + path;
  if (!root.IsMap()) return Error{where + ": not a YAML mapping"};
  std::string context_name = context_arg;
  if (context_name.empty()) {
    auto cc = scalar(root, "current-context", "kubeconfig");
    if (!cc) return Error{where + ": " + cc.error()};
    context_name = *cc;
    if (context_name.empty()) {
      return Error{where + ": 'current-context' is not set and no context was given"};
    }
  }
  auto ctx = find_named(root, "contexts", "context", context_name, where);
  if (!ctx) return Error{ctx.error()};
  const std::string ctx_path = "contexts[name=" + context_name + "].context";
  auto cluster_name = scalar(*ctx, "cluster", ctx_path);
  if (!cluster_name) return Error{where + ": " + cluster_name.error()};
  if (cluster_name->empty()) return Error{where + ": " + ctx_path + ".cluster is missing"};
  auto user_name = scalar(*ctx, "user", ctx_path);
  if (!user_name) return Error{where + ": " + user_name.error()};

  auto cluster = find_named(root, "clusters", "cluster", *cluster_name, where);
  if (!cluster) return Error{cluster.error()};
  const std::string cl_path = "clusters[name=" + *cluster_name + "].cluster";
  const fs::path base_dir = fs::absolute(fs::path(path)).parent_path();

  ClusterConfig cfg;
  cfg.origin = where + " context " + context_name;
  auto server = scalar(*cluster, "server", cl_path);
  if (!server) return Error{where + ": " + server.error()};
  if (server->empty()) return Error{where + ": " + cl_path + ".server is missing"};
  if (server->rfind("https://", 0) != 0 && server->rfind("http://", 0) != 0) {
    return Error{where + ": " + cl_path + ".server '" + *server +
                 "' must start with https:// or http://"};
  }
  // A host after the scheme (the fuzz target found "https://" taken, then cut to "https:").
  if (size_t host = server->find("://") + 3; host >= server->size() || (*server)[host] == '/')
    return Error{where + ": " + cl_path + ".server '" + *server + "' names no host"};
  cfg.server = *server;
  while (!cfg.server.empty() && cfg.server.back() == '/') cfg.server.pop_back();

  auto ca = scalar(*cluster, "certificate-authority", cl_path);
  if (!ca) return Error{where + ": " + ca.error()};
  cfg.ca_file = resolve(base_dir, *ca);
  if (auto e = data_field(*cluster, "certificate-authority-data", cl_path, cfg.ca_data)) {
    return Error{where + ": " + e->message};
  }
  if (YAML::Node v = (*cluster)["insecure-skip-tls-verify"]) {
    try {
      cfg.insecure_skip_tls_verify = v.as<bool>();
    } catch (const YAML::Exception&) {
      return Error{where + ": " + cl_path + ".insecure-skip-tls-verify must be true or false"};
    }
  }
  // client-go's other connection fields: followed silently they would connect elsewhere or
  // verify another name than the kubeconfig means, so they are refused by name.
  for (const char* unsupported : {"proxy-url", "tls-server-name"}) {
    if ((*cluster)[unsupported]) {
      return Error{where + ": " + cl_path + "." + unsupported + " is not supported"};
    }
  }
  if (YAML::Node v = (*cluster)["disable-compression"]) {
    try {
      cfg.disable_compression = v.as<bool>();
    } catch (const YAML::Exception&) {
      return Error{where + ": " + cl_path + ".disable-compression must be true or false"};
    }
  }

  if (!user_name->empty()) {
    auto user = find_named(root, "users", "user", *user_name, where);
    if (!user) return Error{user.error()};
    const std::string u_path = "users[name=" + *user_name + "].user";
    for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
      if ((*user)[unsupported]) {
        return Error{where + ": " + u_path + "." + unsupported +
                     " is not supported (use a token, tokenFile or client certificate)"};
      }
    }
    auto token = scalar(*user, "token", u_path);
    if (!token) return Error{where + ": " + token.error()};
    cfg.token = *token;
    auto token_file = scalar(*user, "tokenFile", u_path);
    if (!token_file) return Error{where + ": " + token_file.error()};
    cfg.token_file = resolve(base_dir, *token_file);
    auto cert = scalar(*user, "client-certificate", u_path);
    if (!cert) return Error{where + ": " + cert.error()};
    cfg.client_cert_file = resolve(base_dir, *cert);
    auto key = scalar(*user, "client-key", u_path);
    if (!key) return Error{where + ": " + key.error()};
    cfg.client_key_file = resolve(base_dir, *key);
    if (auto e = data_field(*user, "client-certificate-data", u_path, cfg.client_cert_data)) {
      return Error{where + ": " + e->message};
    }
    if (auto e = data_field(*user, "client-key-data", u_path, cfg.client_key_data)) {
      return Error{where + ": " + e->message};
    }
    const bool has_cert = !cfg.client_cert_file.empty() || !cfg.client_cert_data.empty();
    const bool has_key = !cfg.client_key_file.empty() || !cfg.client_key_data.empty();
    if (has_cert && !has_key) {
      return Error{where + ": " + u_path +
                   ".client-key(-data) is missing for the client certificate"};
    }
    if (has_key && !has_cert) {
      return Error{where + ": " + u_path +
                   ".client-certificate(-data) is missing for the client key"};
    }
  }

  // Files named in the kubeconfig must exist now: a typo is better reported at start.
  const std::string u_path = "users[name=" + *user_name + "].user";
  const std::vector<std::pair<std::string, std::string>> files = {
      {cfg.ca_file, cl_path + ".certificate-authority"},
      {cfg.client_cert_file, u_path + ".client-certificate"},
      {cfg.client_key_file, u_path + ".client-key"},
      {cfg.token_file, u_path + ".tokenFile"}};
  for (const auto& [file, field] : files) {
    if (file.empty()) continue;
    std::error_code ec;  // a name too long, a loop of links: an error, not an exception
    bool exists = fs::exists(file, ec);
    if (ec) return Error{where + ": " + field + " file " + file + ": " + ec.message()};
    if (!exists) return Error{where + ": " + field + " file " + file + " does not exist"};
  }
  return cfg;
}

}  // namespace

Result<std::string> base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  bool padding = false;
  for (char c : in) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding = true;
      continue;
    }
    if (padding) return Error{"invalid base64: data after padding"};
    int v = value(c);
    if (v < 0) return Error{"invalid base64 character"};
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  if (bits >= 6) return Error{"invalid base64: truncated"};
  return out;
}

Result<ClusterConfig> from_kubeconfig(const std::string& path, const std::string& context) {
  auto text = read_file(path);
  if (!text) return prefixed("kubeconfig " + path + ": cannot read the file", text.error());
  try {
    YAML::Node root = YAML::Load(*text);
    return parse_kubeconfig(root, path, context);
  } catch (const YAML::Exception& e) {
    return Error{"kubeconfig " + path + ": invalid YAML: " + e.what()};
  }
}

Result<ClusterConfig> in_cluster(const std::string& sa_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0') {
    return Error{"in-cluster config: KUBERNETES_SERVICE_HOST is not set"};
  }
  if (port == nullptr || *port == '\0') {
    return Error{"in-cluster config: KUBERNETES_SERVICE_PORT is not set"};
  }
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6 literal
  ClusterConfig cfg;
  cfg.server = "https://" + h + ":" + port;
  cfg.origin = "in-cluster service account " + sa_dir;
  fs::path dir(sa_dir);
  cfg.token_file = (dir / "token").string();
  cfg.ca_file = (dir / "ca.crt").string();
  if (!fs::exists(cfg.token_file)) {
    return Error{"in-cluster config: token file " + cfg.token_file + " does not exist"};
  }
  if (!fs::exists(cfg.ca_file)) {
    return Error{"in-cluster config: CA file " + cfg.ca_file + " does not exist"};
  }
  return cfg;
}

TokenSource::TokenSource(const ClusterConfig& cfg, std::chrono::milliseconds min_interval)
    : token_(cfg.token), token_file_(cfg.token_file), min_interval_(min_interval) {}

std::string TokenSource::token(bool force) {
  std::lock_guard lock(mu_);
  if (token_file_.empty()) return token_;
  auto now = std::chrono::steady_clock::now();
  if (read_once_ && !force && now - last_read_ < min_interval_) return token_;
  last_read_ = now;
  read_once_ = true;
  auto text = read_file(token_file_);
  if (!text) {
    if (!last_read_failed_) {
      spdlog::error("kube auth: cannot read token file {}: {}", token_file_, text.error());
    }
    last_read_failed_ = true;
    return token_;  // the last token read, if any, is still the best guess
  }
  last_read_failed_ = false;
  std::string t = trim(std::move(*text));
  if (t != token_ && !token_.empty()) spdlog::info("kube auth: token file {} changed", token_file_);
  token_ = std::move(t);
  return token_;
}

}  // namespace endpointd::watcher
