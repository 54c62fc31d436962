// Helpers for the API client tests: an event recorder that replays events into a Store-like
// map, condition waits with deadlines, object JSON builders and temporary directories.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/event.h"

namespace endpointd::kubetest {

// Polls `pred` until it holds or `timeout` passes.
inline bool wait_until(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// A loopback TCP port where nothing listens, for as long as this lives: bound and never
// listened on, so a connect is refused at once. A server started and destroyed frees its
// port, and another test (or process) may take it before the client dials it.
class RefusingPort {
 public:
  RefusingPort() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    if (fd_ < 0) throw std::runtime_error("RefusingPort: socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    auto* sa = reinterpret_cast<sockaddr*>(&a);
    if (::bind(fd_, sa, sizeof(a)) != 0 || ::getsockname(fd_, sa, &len) != 0) {
      ::close(fd_);
      throw std::runtime_error("RefusingPort: bind");
    }
    port_ = ntohs(a.sin_port);
  }
  ~RefusingPort() { ::close(fd_); }
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;

  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_;
  uint16_t port_ = 0;
};

// Records every event the client posts and keeps the state they add up to.
class Recorder {
 public:
  std::function<void(model::Event)> sink() {
    return [this](model::Event ev) { on_event(std::move(ev)); };
  }

  void on_event(model::Event ev) {
    std::lock_guard lock(mu_);
    if (auto* u = std::get_if<model::Upsert>(&ev.change)) {
      auto k = key(u->object);
      upserts_[k]++;
      state_[k] = u->object;
    } else if (auto* r = std::get_if<model::Remove>(&ev.change)) {
      auto k = key(r->kind, r->key);
      removes_[k]++;
      state_.erase(k);
    } else if (auto* rep = std::get_if<model::Replace>(&ev.change)) {
      replaces_[rep->kind]++;
      last_replace_size_[rep->kind] = rep->objects.size();
      std::string prefix = std::string(model::to_string(rep->kind)) + ":";
      for (auto it = state_.begin(); it != state_.end();) {
        it = it->first.starts_with(prefix) ? state_.erase(it) : std::next(it);
      }
      for (const auto& o : rep->objects) state_[key(o)] = o;
    }
    events_.push_back(std::move(ev));
  }

  static std::string key(model::ObjectKind kind, const model::ObjectKey& k) {
    return std::string(model::to_string(kind)) + ":" +
           (kind == model::ObjectKind::kNode ? k.name : k.ns + "/" + k.name);
  }
  static std::string key(const model::Object& o) {
    return std::string(model::to_string(model::kind_of(o))) + ":" + model::key_string(o);
  }

  size_t events() const {
    std::lock_guard lock(mu_);
    return events_.size();
  }
  std::vector<model::Event> all() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  bool has(const std::string& k) const {
    std::lock_guard lock(mu_);
    return state_.count(k) > 0;
  }
  std::optional<model::Object> get(const std::string& k) const {
    std::lock_guard lock(mu_);
    auto it = state_.find(k);
    if (it == state_.end()) return std::nullopt;
    return it->second;
  }
  size_t count(model::ObjectKind kind) const {
    std::lock_guard lock(mu_);
    std::string prefix = std::string(model::to_string(kind)) + ":";
    size_t n = 0;
    for (const auto& [k, _] : state_) n += k.starts_with(prefix);
    return n;
  }
  int upserts(const std::string& k) const {
    std::lock_guard lock(mu_);
    auto it = upserts_.find(k);
    return it == upserts_.end() ? 0 : it->second;
  }
  int removes(const std::string& k) const {
    std::lock_guard lock(mu_);
    auto it = removes_.find(k);
    return it == removes_.end() ? 0 : it->second;
  }
  int total_upserts() const {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const auto& [_, v] : upserts_) n += v;
    return n;
  }
  int total_removes() const {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const auto& [_, v] : removes_) n += v;
    return n;
  }
  int replaces(model::ObjectKind kind) const {
    std::lock_guard lock(mu_);
    auto it = replaces_.find(kind);
    return it == replaces_.end() ? 0 : it->second;
  }
  size_t last_replace_size(model::ObjectKind kind) const {
    std::lock_guard lock(mu_);
    auto it = last_replace_size_.find(kind);
    return it == last_replace_size_.end() ? 0 : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::vector<model::Event> events_;
  std::map<std::string, model::Object> state_;
  std::map<std::string, int> upserts_;
  std::map<std::string, int> removes_;
  std::map<model::ObjectKind, int> replaces_;
  std::map<model::ObjectKind, size_t> last_replace_size_;
};

inline std::string service_json(const std::string& name,
                                const std::string& cluster_ip = "10.96.0.10", int port = 80,
                                const std::string& ns = "default",
                                const std::string& extra_labels = "") {
  return R"({"apiVersion":"v1","kind":"Service","metadata":{"name":")" + name +
         R"(","namespace":")" + ns + R"(","uid":"uid-)" + name + R"(","labels":{)" + extra_labels +
         R"(}},"spec":{"type":"ClusterIP","clusterIP":")" + cluster_ip + R"(","clusterIPs":[")" +
         cluster_ip + R"("],"ports":[{"name":"http","protocol":"TCP","port":)" +
         std::to_string(port) + R"(,"targetPort":8080}]}})";
}

// The same slice, field by field (a failure names the field), trigger time included.
inline void expect_same_slice(const model::EndpointSlice& a, const model::EndpointSlice& b) {
  SCOPED_TRACE(a.key.str());
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.resource_version, b.resource_version);
  EXPECT_EQ(a.service_name, b.service_name);
  EXPECT_EQ(a.service_proxy_name, b.service_proxy_name);
  EXPECT_EQ(a.address_type, b.address_type);
  EXPECT_EQ(a.ports, b.ports);
  EXPECT_EQ(a.endpoints, b.endpoints);
  EXPECT_EQ(a.trigger_time, b.trigger_time);
}

inline std::string slice_json(const std::string& name, const std::string& service,
                              const std::string& ip, const std::string& ns = "default") {
  return R"({"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":")" +
         name + R"(","namespace":")" + ns + R"(","labels":{"kubernetes.io/service-name":")" +
         service + R"("}},"addressType":"IPv4","endpoints":[{"addresses":[")" + ip +
         R"("],"conditions":{"ready":true}}],"ports":[{"name":"http","protocol":"TCP","port":8080}]})";
}

inline std::string node_json(const std::string& name, const std::string& ip = "192.168.0.1") {
  return R"({"apiVersion":"v1","kind":"Node","metadata":{"name":")" + name +
         R"("},"status":{"addresses":[{"type":"InternalIP","address":")" + ip + R"("}]}})";
}

inline std::string pod_json(const std::string& name, const std::string& node,
                            const std::string& ip = "10.244.0.5") {
  return R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":")" + name +
         R"(","namespace":"default","uid":"pod-)" + name + R"("},"spec":{"nodeName":")" + node +
         R"("},"status":{"phase":"Running","podIPs":[{"ip":")" + ip + R"("}]}})";
}

// A directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "endpointd-kube-XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& content) const {
    // Written to a temporary name and renamed, as the kubelet rotates tokens.
    auto tmp = path_ / (name + ".tmp");
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << content;
    }
    std::filesystem::rename(tmp, path_ / name);
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

}  // namespace endpointd::kubetest
