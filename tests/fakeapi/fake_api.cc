// The fake API server: a cpp-httplib server over an in-memory object store with a global
// resourceVersion counter and a bounded per-resource event history.
#include "tests/fakeapi/fake_api.h"

#include <httplib.h>
#include <simdjson.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "tests/fakeapi/protobuf_encode.h"
#include "tests/fakeapi/token_issuer.h"

#if __has_include("watcher/yaml_json.h")
#include "model/event.h"
#include "watcher/yaml_json.h"
#define ENDPOINTD_FAKEAPI_YAML 1
#endif

namespace endpointd::fakeapi {

namespace {

// JSON string literal, the same escaping the agent uses.
void append_escaped(std::string& out, std::string_view s) {
  watcher::append_json_string(out, s);
}

// Writes `obj` as compact JSON with metadata.resourceVersion set to `rv` (when rv is not
// empty; otherwise removed).
std::string with_resource_version(const simdjson::dom::object& obj, const std::string& rv) {
  std::string out = "{";
  bool first = true;
  bool had_metadata = false;
  for (auto field : obj) {
    if (!first) out.push_back(',');
    first = false;
    append_escaped(out, field.key);
    out.push_back(':');
    simdjson::dom::object meta;
    if (field.key == "metadata" && field.value.get(meta) == simdjson::SUCCESS) {
      had_metadata = true;
      out.push_back('{');
      bool mfirst = true;
      for (auto m : meta) {
        if (m.key == "resourceVersion") continue;
        if (!mfirst) out.push_back(',');
        mfirst = false;
        append_escaped(out, m.key);
        out.push_back(':');
        out += simdjson::minify(m.value);
      }
      if (!rv.empty()) {
        if (!mfirst) out.push_back(',');
        out += "\"resourceVersion\":";
        append_escaped(out, rv);
      }
      out.push_back('}');
    } else {
      out += simdjson::minify(field.value);
    }
  }
  if (!had_metadata) throw std::invalid_argument("object has no metadata");
  out.push_back('}');
  return out;
}

std::string string_at(const simdjson::dom::element& e, std::string_view pointer) {
  std::string_view v;
  if (e.at_pointer(pointer).get(v) != simdjson::SUCCESS) return {};
  return std::string(v);
}

struct ResourceInfo {
  const char* resource;
  const char* kind;
  const char* path;
  const char* api_version;
  bool namespaced;
};

constexpr ResourceInfo kResources[] = {
    {"services", "Service", "/api/v1/services", "v1", true},
    {"endpointslices", "EndpointSlice", "/apis/discovery.k8s.io/v1/endpointslices",
     "discovery.k8s.io/v1", true},
    {"nodes", "Node", "/api/v1/nodes", "v1", false},
    {"pods", "Pod", "/api/v1/pods", "v1", true},
};

std::string status_json(int code, const std::string& reason, const std::string& message) {
  std::string out =
      R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":)";
  append_escaped(out, message);
  out += ",\"reason\":";
  append_escaped(out, reason);
  out += ",\"code\":" + std::to_string(code) + "}";
  return out;
}

// One requirement of a label or field selector.
struct Requirement {
  enum class Op { kExists, kNotExists, kEquals, kNotEquals } op;
  std::string key;
  std::string value;
};

std::vector<Requirement> parse_selector(const std::string& s) {
  std::vector<Requirement> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string part =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? s.size() + 1 : comma + 1;
    if (part.empty()) continue;
    Requirement r;
    if (auto p = part.find("!="); p != std::string::npos) {
      r = {Requirement::Op::kNotEquals, part.substr(0, p), part.substr(p + 2)};
    } else if (auto q = part.find("=="); q != std::string::npos) {
      r = {Requirement::Op::kEquals, part.substr(0, q), part.substr(q + 2)};
    } else if (auto e = part.find('='); e != std::string::npos) {
      r = {Requirement::Op::kEquals, part.substr(0, e), part.substr(e + 1)};
    } else if (part[0] == '!') {
      r = {Requirement::Op::kNotExists, part.substr(1), ""};
    } else {
      r = {Requirement::Op::kExists, part, ""};
    }
    out.push_back(std::move(r));
  }
  return out;
}

bool matches(const std::vector<Requirement>& reqs,
             const std::map<std::string, std::string>& values) {
  for (const auto& r : reqs) {
    auto it = values.find(r.key);
    switch (r.op) {
      case Requirement::Op::kExists:
        if (it == values.end()) return false;
        break;
      case Requirement::Op::kNotExists:
        if (it != values.end()) return false;
        break;
      case Requirement::Op::kEquals:
        if (it == values.end() || it->second != r.value) return false;
        break;
      case Requirement::Op::kNotEquals:
        if (it != values.end() && it->second == r.value) return false;
        break;
    }
  }
  return true;
}

}  // namespace

struct FakeApiServer::Stored {
  std::string ns;
  std::string name;
  std::string source;  // as applied, without resourceVersion (to detect real changes)
  std::string json;    // as served, with resourceVersion
  // As served in protobuf (EndpointSlices only; nullopt for another kind, or JSON that protobuf
  // cannot carry: such a list is served in JSON).
  std::optional<std::string> protobuf;
  uint64_t rv = 0;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> fields;  // metadata.name, metadata.namespace, spec.nodeName
};

struct FakeApiServer::HistoryEvent {
  uint64_t rv = 0;
  std::string type;                      // ADDED, MODIFIED, DELETED
  std::shared_ptr<const Stored> now;     // the object after (for DELETED: its last state)
  std::shared_ptr<const Stored> before;  // the object before (MODIFIED), for selector moves
};

struct FakeApiServer::Resource {
  ResourceInfo info;
  std::map<std::string, std::shared_ptr<const Stored>> objects;  // by ns/name
  std::deque<HistoryEvent> history;
  uint64_t compacted_rv = 0;  // events up to this one are forgotten
  uint64_t raw_seq = 0;
  std::deque<std::pair<uint64_t, std::string>> raw_lines;
};

struct FakeApiServer::Watch {
  Resource* resource = nullptr;
  uint64_t pos = 0;
  bool bookmarks = false;
  std::vector<Requirement> labels;
  std::vector<Requirement> fields;
  std::chrono::steady_clock::time_point deadline;
  uint64_t close_epoch = 0;
  uint64_t bookmark_epoch = 0;
  uint64_t raw_seq = 0;
  std::chrono::steady_clock::time_point next_periodic_bookmark;
  std::deque<std::string> pending;
  bool finish_after_pending = false;
  std::optional<size_t> lines_before_silence;  // set: goes silent after this many lines

  bool selected(const Stored& s) const {
    return matches(labels, s.labels) && matches(fields, s.fields);
  }
};

std::string RecordedRequest::param(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? std::string() : it->second;
}
bool RecordedRequest::has_param(const std::string& name) const {
  return params.count(name) > 0;
}
std::string RecordedRequest::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

FakeApiServer::FakeApiServer(Options options) : options_(std::move(options)) {
  // A client that goes away mid-write must not kill the test process.
  std::signal(SIGPIPE, SIG_IGN);
  for (const auto& info : kResources) {
    auto r = std::make_unique<Resource>();
    r->info = info;
    resources_[info.resource] = std::move(r);
  }
  if (options_.tls) {
    const auto& t = *options_.tls;
    server_ = std::make_unique<httplib::SSLServer>(
        t.cert_file.c_str(), t.key_file.c_str(),
        t.client_ca_file.empty() ? nullptr : t.client_ca_file.c_str());
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  if (!server_->is_valid()) {
    error_ = "cannot set up the server (certificate or key unreadable?)";
    return;
  }
  // Every open watch holds one of these threads.
  server_->new_task_queue = [n = options_.threads] { return new httplib::ThreadPool(n); };
  server_->set_keep_alive_timeout(1);
  // As the API server's (Go's) connections: no Nagle delay between a response's header and
  // body writes, and no cap on the requests a kept-alive connection carries.
  server_->set_tcp_nodelay(true);
  server_->set_keep_alive_max_count(std::numeric_limits<size_t>::max());
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { handle(req, res); };
  server_->Get(".*", handler);
  server_->Post(
      ".*", [this](const httplib::Request& req, httplib::Response& res) { handle_post(req, res); });
  server_->Patch(".*", [this](const httplib::Request& req, httplib::Response& res) {
    handle_patch(req, res);
  });
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
  } else {
    port_ = server_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    port_ = 0;
    error_ = "cannot bind " + options_.host;
    return;
  }
  issuer_ = std::make_unique<TokenIssuer>(url());
  listen_thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() before the listen loop runs would be lost; wait for it to run.
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Bookmarks on a timer: its own condition variable, so that the watches' wake-ups (every
  // event wakes every watch) do not wake it too.
  ticker_thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      if (options_.bookmark_interval.count() > 0) {
        tick_cv_.wait_for(lock, options_.bookmark_interval);
        if (stopping_) break;
        ++bookmark_epoch_;
        cv_.notify_all();
      } else {
        tick_cv_.wait(lock);
      }
    }
  });
}

FakeApiServer::~FakeApiServer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  tick_cv_.notify_all();
  if (server_) server_->stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (ticker_thread_.joinable()) ticker_thread_.join();
}

// TokenRequest (POST .../serviceaccounts/SA/token): a token for the ServiceAccount bound to
// the pod in boundObjectRef, on the node the stored Pod names (or, for a pod the fake does not
// hold, the `node` query parameter: a test's shortcut). Audience and expirationSeconds as asked.
bool FakeApiServer::handle_token_request(const httplib::Request& req, httplib::Response& res) {
  constexpr std::string_view kNs = "/api/v1/namespaces/";
  constexpr std::string_view kSa = "/serviceaccounts/";
  auto sa_at = req.path.find(kSa);
  if (req.path.rfind(kNs, 0) != 0 || sa_at == std::string::npos || req.path.size() < 6 ||
      req.path.compare(req.path.size() - 6, 6, "/token") != 0)
    return false;
  TokenSpec spec;
  spec.sa_namespace = req.path.substr(kNs.size(), sa_at - kNs.size());
  spec.sa_name = req.path.substr(sa_at + kSa.size(), req.path.size() - 6 - sa_at - kSa.size());
  simdjson::dom::parser p;
  simdjson::dom::element body;
  if (p.parse(req.body).get(body) != simdjson::SUCCESS) {
    res.status = 400;
    res.set_content(status_json(400, "BadRequest", "not JSON"), "application/json");
    return true;
  }
  std::string_view pod, aud;
  int64_t seconds = 3600;
  if (body["spec"]["boundObjectRef"]["name"].get(pod) == simdjson::SUCCESS) spec.pod = pod;
  if (body["spec"]["audiences"].at(0).get(aud) == simdjson::SUCCESS) spec.audience = aud;
  if (body["spec"]["expirationSeconds"].get(seconds) != simdjson::SUCCESS) seconds = 3600;
  spec.lifetime = std::chrono::seconds(seconds);
  spec.node = req.get_param_value("node");
  if (Resource* pods = resource_named("pods"); pods && !spec.pod.empty()) {
    auto it = pods->objects.find(spec.sa_namespace + "/" + spec.pod);
    if (it != pods->objects.end()) {
      simdjson::dom::parser pp;
      simdjson::dom::element obj;
      std::string_view node, uid;
      if (pp.parse(it->second->json).get(obj) == simdjson::SUCCESS) {
        if (obj["spec"]["nodeName"].get(node) == simdjson::SUCCESS) spec.node = node;
        if (obj["metadata"]["uid"].get(uid) == simdjson::SUCCESS) spec.pod_uid = uid;
      }
    }
  }
  if (spec.pod.empty() || spec.node.empty()) {
    res.status = 400;
    res.set_content(status_json(400, "BadRequest", "a pod-bound token needs a pod on a node"),
                    "application/json");
    return true;
  }
  std::string token = issuer_->mint(spec);
  res.status = 201;
  res.set_content(
      R"({"kind":"TokenRequest","apiVersion":"authentication.k8s.io/v1","status":{"token":")" +
          token + R"("}})",
      "application/json");
  return true;
}

void FakeApiServer::fail_issuer_keys(bool fail) {
  std::lock_guard lock(mu_);
  issuer_keys_fail_ = fail;
}

std::string FakeApiServer::url() const {
  return std::string(options_.tls ? "https://" : "http://") + options_.host + ":" +
         std::to_string(port_);
}

std::string FakeApiServer::write_kubeconfig(bool disable_compression) const {
  char path[] = "/tmp/endpointd-kubeconfig-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return "";
  close(fd);
  std::ofstream out(path);
  out << "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
         "contexts: [{name: t, context: {cluster: t, user: t}}]\n"
         "clusters: [{name: t, cluster: {server: \""
      << url() << "\"" << (disable_compression ? ", disable-compression: true" : "")
      << "}}]\nusers: [{name: t, user: {}}]\n";
  out.close();
  if (!out) {
    unlink(path);
    return "";
  }
  return path;
}

FakeApiServer::Resource* FakeApiServer::resource_for_path(const std::string& path) {
  for (auto& [_, r] : resources_) {
    if (path == r->info.path) return r.get();
  }
  return nullptr;
}

FakeApiServer::Resource* FakeApiServer::resource_named(std::string_view name) {
  for (auto& [_, r] : resources_) {
    if (name == r->info.resource || name == r->info.kind) return r.get();
  }
  return nullptr;
}

void FakeApiServer::record_event(Resource& r, const std::string& type,
                                 std::shared_ptr<const Stored> now,
                                 std::shared_ptr<const Stored> before) {
  r.history.push_back(HistoryEvent{rv_, type, std::move(now), std::move(before)});
  while (r.history.size() > options_.history_limit) {
    r.compacted_rv = r.history.front().rv;
    r.history.pop_front();
  }
  cv_.notify_all();
}

uint64_t FakeApiServer::apply(std::string_view json) {
  std::lock_guard lock(mu_);
  return apply_locked(json);
}

uint64_t FakeApiServer::apply_locked(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(json.data(), json.size(), true).get(root) != simdjson::SUCCESS) {
    throw std::invalid_argument("fakeapi: not JSON");
  }
  simdjson::dom::object obj;
  if (root.get(obj) != simdjson::SUCCESS) throw std::invalid_argument("fakeapi: not an object");
  std::string kind = string_at(root, "/kind");
  Resource* r = resource_named(kind);
  if (r == nullptr) throw std::invalid_argument("fakeapi: unknown kind '" + kind + "'");
  auto s = std::make_shared<Stored>();
  s->name = string_at(root, "/metadata/name");
  if (s->name.empty()) throw std::invalid_argument("fakeapi: metadata.name missing");
  if (r->info.namespaced) {
    s->ns = string_at(root, "/metadata/namespace");
    if (s->ns.empty()) s->ns = "default";
  }
  simdjson::dom::object labels;
  if (root.at_pointer("/metadata/labels").get(labels) == simdjson::SUCCESS) {
    for (auto l : labels) {
      std::string_view v;
      if (l.value.get(v) == simdjson::SUCCESS) s->labels[std::string(l.key)] = std::string(v);
    }
  }
  s->fields["metadata.name"] = s->name;
  s->fields["metadata.namespace"] = s->ns;
  s->fields["spec.nodeName"] = string_at(root, "/spec/nodeName");
  s->source = with_resource_version(obj, "");
  const std::string key = s->ns + "/" + s->name;
  auto it = r->objects.find(key);
  std::shared_ptr<const Stored> before;
  if (it != r->objects.end()) {
    if (it->second->source == s->source) return it->second->rv;  // no change, no event
    before = it->second;
  }
  ++rv_;
  s->rv = rv_;
  s->json = with_resource_version(obj, std::to_string(rv_));
  if (std::string_view(r->info.kind) == "EndpointSlice")
    s->protobuf = endpoint_slice_protobuf(s->json);
  std::shared_ptr<const Stored> now = s;
  r->objects[key] = now;
  record_event(*r, before ? "MODIFIED" : "ADDED", now, before);
  return rv_;
}

uint64_t FakeApiServer::remove(std::string_view resource, std::string_view ns,
                               std::string_view name) {
  std::lock_guard lock(mu_);
  Resource* r = resource_named(resource);
  if (r == nullptr) throw std::invalid_argument("fakeapi: unknown resource");
  std::string n = r->info.namespaced ? std::string(ns.empty() ? "default" : ns) : std::string();
  return remove_locked(*r, n + "/" + std::string(name));
}

uint64_t FakeApiServer::remove_locked(Resource& r, const std::string& key) {
  auto it = r.objects.find(key);
  if (it == r.objects.end()) return 0;
  ++rv_;
  // The DELETED event carries the object's last state at the deletion's resourceVersion.
  auto last = std::make_shared<Stored>(*it->second);
  simdjson::dom::parser parser;
  simdjson::dom::object obj;
  if (parser.parse(last->source).get(obj) == simdjson::SUCCESS) {
    last->json = with_resource_version(obj, std::to_string(rv_));
  }
  last->rv = rv_;
  r.objects.erase(it);
  record_event(r, "DELETED", last, nullptr);
  return rv_;
}

void FakeApiServer::replace_all(const std::vector<std::string>& objects) {
  std::lock_guard lock(mu_);
  std::map<std::string, std::set<std::string>> keep;  // resource -> keys
  for (const auto& json : objects) {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (parser.parse(json).get(root) != simdjson::SUCCESS) continue;
    Resource* r = resource_named(string_at(root, "/kind"));
    if (r == nullptr) continue;
    std::string ns = r->info.namespaced ? string_at(root, "/metadata/namespace") : "";
    if (r->info.namespaced && ns.empty()) ns = "default";
    try {
      apply_locked(json);
      keep[r->info.resource].insert(ns + "/" + string_at(root, "/metadata/name"));
    } catch (const std::invalid_argument&) {
    }
  }
  for (auto& [name, r] : resources_) {
    std::vector<std::string> gone;
    for (const auto& [key, _] : r->objects) {
      if (!keep[name].count(key)) gone.push_back(key);
    }
    for (const auto& key : gone) remove_locked(*r, key);
  }
}

uint64_t FakeApiServer::resource_version() const {
  std::lock_guard lock(mu_);
  return rv_;
}

size_t FakeApiServer::object_count(std::string_view resource) const {
  std::lock_guard lock(mu_);
  for (const auto& [_, r] : resources_) {
    if (resource == r->info.resource || resource == r->info.kind) return r->objects.size();
  }
  return 0;
}

void FakeApiServer::close_watches() {
  std::lock_guard lock(mu_);
  ++close_epoch_;
  cv_.notify_all();
}

void FakeApiServer::close_watch_after_events(size_t n) {
  std::lock_guard lock(mu_);
  close_after_events_ = n;
}

void FakeApiServer::cut_next_event_midway() {
  std::lock_guard lock(mu_);
  cut_next_event_ = true;
}

void FakeApiServer::expire_next_watch(bool http) {
  std::lock_guard lock(mu_);
  expire_next_watch_ = true;
  expire_next_watch_http_ = http;
}

void FakeApiServer::fail_next_requests(size_t n, int status, int retry_after_seconds) {
  std::lock_guard lock(mu_);
  fail_remaining_ = n;
  fail_status_ = status;
  fail_retry_after_ = retry_after_seconds;
}

void FakeApiServer::set_write_split(size_t pieces, std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  split_pieces_ = std::max<size_t>(1, pieces);
  split_delay_ = delay;
}

void FakeApiServer::send_raw_watch_line(std::string_view resource, std::string line) {
  std::lock_guard lock(mu_);
  Resource* r = resource_named(resource);
  if (r == nullptr) throw std::invalid_argument("fakeapi: unknown resource");
  r->raw_lines.emplace_back(++r->raw_seq, std::move(line));
  cv_.notify_all();
}

void FakeApiServer::silence_next_watch(size_t events) {
  std::lock_guard lock(mu_);
  silence_next_watch_ = events;
}

void FakeApiServer::compact() {
  std::lock_guard lock(mu_);
  for (auto& [_, r] : resources_) {
    r->history.clear();
    r->compacted_rv = rv_;
  }
}

void FakeApiServer::expire_all_watches() {
  {
    std::lock_guard lock(mu_);
    ++rv_;  // a version no watch is at yet, so that every one of them is now too old
    for (auto& [_, r] : resources_) {
      r->history.clear();
      r->compacted_rv = rv_;
    }
  }
  close_watches();
}

void FakeApiServer::expire_continue_tokens() {
  std::lock_guard lock(mu_);
  snapshots_.clear();
  snapshot_rv_.clear();
}

void FakeApiServer::expire_next_continue() {
  std::lock_guard lock(mu_);
  expire_next_continue_ = true;
}

void FakeApiServer::send_bookmarks() {
  std::lock_guard lock(mu_);
  ++bookmark_epoch_;
  cv_.notify_all();
}

void FakeApiServer::set_required_token(std::string token) {
  std::lock_guard lock(mu_);
  required_token_ = std::move(token);
}

void FakeApiServer::deny_access(std::string verb, std::string group, std::string resource) {
  std::lock_guard lock(mu_);
  denied_.emplace(std::move(verb), std::move(group), std::move(resource));
}

void FakeApiServer::set_clock_offset(std::chrono::seconds offset) {
  std::lock_guard lock(mu_);
  clock_offset_ = offset;
}

namespace {

// An HTTP Date header for now + offset (IMF-fixdate), as every API server answer has.
std::string http_date(std::chrono::seconds offset) {
  time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() + offset);
  tm parts{};
  gmtime_r(&t, &parts);
  char b[64];
  std::strftime(b, sizeof b, "%a, %d %b %Y %H:%M:%S GMT", &parts);
  return b;
}

}  // namespace

void FakeApiServer::handle_post(const httplib::Request& req, httplib::Response& res) {
  std::unique_lock lock(mu_);
  RecordedRequest rec;
  rec.method = req.method;
  rec.path = req.path;
  rec.at = std::chrono::steady_clock::now();
  rec.remote_port = req.remote_port;
  requests_.push_back(rec);
  res.set_header("Date", http_date(clock_offset_));
  if (!required_token_.empty() &&
      req.get_header_value("Authorization") != "Bearer " + required_token_) {
    res.status = 401;
    res.set_content(status_json(401, "Unauthorized", "Unauthorized"), "application/json");
    return;
  }
  if (fail_remaining_ > 0) {
    --fail_remaining_;
    res.status = fail_status_;
    if (fail_retry_after_ >= 0) res.set_header("Retry-After", std::to_string(fail_retry_after_));
    res.set_content(status_json(fail_status_, "InternalError", "injected failure"),
                    "application/json");
    return;
  }
  if (handle_token_request(req, res)) return;
  constexpr std::string_view kEvents = "/apis/events.k8s.io/v1/namespaces/";
  if (req.path.rfind(kEvents, 0) == 0 && req.path.size() > kEvents.size() + 7 &&
      req.path.compare(req.path.size() - 7, 7, "/events") == 0) {
    std::string ns = req.path.substr(kEvents.size(), req.path.size() - 7 - kEvents.size());
    simdjson::dom::parser ep;
    simdjson::dom::element ev;
    std::string_view name, regarding, reason;
    if (ep.parse(req.body).get(ev) != simdjson::SUCCESS ||
        ev["metadata"]["name"].get(name) != simdjson::SUCCESS ||
        ev["regarding"]["name"].get(regarding) != simdjson::SUCCESS ||
        ev["reason"].get(reason) != simdjson::SUCCESS) {
      res.status = 422;
      res.set_content(status_json(422, "Invalid",
                                  "metadata.name, regarding.name and reason "
                                  "are required"),
                      "application/json");
      return;
    }
    for (const auto& e : events_)
      if (e.ns == ns && e.name == name) {
        res.status = 409;
        res.set_content(status_json(409, "AlreadyExists", "events exists"), "application/json");
        return;
      }
    events_.push_back(
        {ns, std::string(name), std::string(regarding), std::string(simdjson::minify(ev)), ""});
    res.status = 201;
    res.set_content(events_.back().json, "application/json");
    return;
  }
  if (req.path != "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews") {
    res.status = 404;
    res.set_content(
        status_json(404, "NotFound", "the server could not find the requested resource"),
        "application/json");
    return;
  }
  simdjson::dom::parser p;
  simdjson::dom::element root, attrs;
  std::string_view verb, group, resource;
  if (p.parse(req.body).get(root) != simdjson::SUCCESS ||
      root["spec"]["resourceAttributes"].get(attrs) != simdjson::SUCCESS ||
      attrs["verb"].get(verb) != simdjson::SUCCESS ||
      attrs["resource"].get(resource) != simdjson::SUCCESS) {
    res.status = 400;
    res.set_content(status_json(400, "BadRequest", "spec.resourceAttributes is required"),
                    "application/json");
    return;
  }
  if (attrs["group"].get(group) != simdjson::SUCCESS) group = {};
  bool allowed = !denied_.count({std::string(verb), std::string(group), std::string(resource)});
  res.status = 201;
  std::string body =
      R"({"kind":"SelfSubjectAccessReview","apiVersion":"authorization.k8s.io/v1","spec":)" +
      std::string(simdjson::minify(root["spec"])) + R"(,"status":{"allowed":)" +
      (allowed ? "true" : "false");
  if (!allowed) body += R"(,"reason":"denied by the fake API server")";
  res.set_content(body + "}}", "application/json");
}

std::vector<RecordedRequest> FakeApiServer::requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

size_t FakeApiServer::open_watches() const {
  std::lock_guard lock(mu_);
  return open_watches_;
}

size_t FakeApiServer::silent_watches() const {
  std::lock_guard lock(mu_);
  return silent_watches_;
}

std::string FakeApiServer::event_with_series(const StoredEvent& e) const {
  if (e.series.empty()) return e.json;
  return e.json.substr(0, e.json.size() - 1) + ",\"series\":" + e.series + "}";
}

void FakeApiServer::handle_patch(const httplib::Request& req, httplib::Response& res) {
  std::lock_guard lock(mu_);
  RecordedRequest rec;
  rec.method = req.method;
  rec.path = req.path;
  rec.at = std::chrono::steady_clock::now();
  requests_.push_back(rec);
  res.set_header("Date", http_date(clock_offset_));
  constexpr std::string_view kEvents = "/apis/events.k8s.io/v1/namespaces/";
  auto marker = req.path.find("/events/");
  if (req.path.rfind(kEvents, 0) != 0 || marker == std::string::npos) {
    res.status = 404;
    res.set_content(status_json(404, "NotFound", "not found"), "application/json");
    return;
  }
  std::string ns = req.path.substr(kEvents.size(), marker - kEvents.size());
  std::string name = req.path.substr(marker + 8);
  simdjson::dom::parser p;
  simdjson::dom::element patch, series;
  if (req.get_header_value("Content-Type") != "application/merge-patch+json" ||
      p.parse(req.body).get(patch) != simdjson::SUCCESS ||
      patch["series"].get(series) != simdjson::SUCCESS) {
    res.status = 415;
    res.set_content(status_json(415, "UnsupportedMediaType", "a merge patch of series only"),
                    "application/json");
    return;
  }
  for (auto& e : events_)
    if (e.ns == ns && e.name == name) {
      e.series = std::string(simdjson::minify(series));
      res.set_content(event_with_series(e), "application/json");
      return;
    }
  res.status = 404;
  res.set_content(status_json(404, "NotFound", "events \"" + name + "\" not found"),
                  "application/json");
}

std::vector<std::string> FakeApiServer::events(const std::string& ns) const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& e : events_)
    if (ns.empty() || e.ns == ns) out.push_back(event_with_series(e));
  return out;
}

void FakeApiServer::handle(const httplib::Request& req, httplib::Response& res) {
  std::unique_lock lock(mu_);
  RecordedRequest rec;
  rec.method = req.method;
  rec.path = req.path;
  rec.at = std::chrono::steady_clock::now();
  rec.remote_port = req.remote_port;
  for (const auto& [k, v] : req.params) rec.params.emplace(k, v);
  for (const auto& [k, v] : req.headers) {
    std::string lower = k;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    rec.headers[lower] = v;
  }
  requests_.push_back(rec);
  res.set_header("Date", http_date(clock_offset_));

  if (!required_token_.empty() && rec.header("authorization") != "Bearer " + required_token_) {
    res.status = 401;
    res.set_content(status_json(401, "Unauthorized", "Unauthorized"), "application/json");
    return;
  }
  if (fail_remaining_ > 0) {
    --fail_remaining_;
    res.status = fail_status_;
    if (fail_retry_after_ >= 0) res.set_header("Retry-After", std::to_string(fail_retry_after_));
    res.set_content(
        status_json(fail_status_, fail_status_ == 429 ? "TooManyRequests" : "InternalError",
                    "injected failure"),
        "application/json");
    return;
  }
  constexpr std::string_view kEvents = "/apis/events.k8s.io/v1/namespaces/";
  if (req.path.rfind(kEvents, 0) == 0 && req.path.size() > kEvents.size() + 7 &&
      req.path.compare(req.path.size() - 7, 7, "/events") == 0) {
    std::string ns = req.path.substr(kEvents.size(), req.path.size() - 7 - kEvents.size());
    std::string selector = req.get_param_value("fieldSelector");
    std::string want;
    if (selector.rfind("regarding.name=", 0) == 0) want = selector.substr(15);
    std::string body =
        R"({"kind":"EventList","apiVersion":"events.k8s.io/v1","metadata":{"resourceVersion":")" +
        std::to_string(rv_) + R"("},"items":[)";
    bool first = true;
    for (const auto& e : events_) {
      if (e.ns != ns || (!want.empty() && e.regarding != want)) continue;
      body += (first ? "" : ",") + event_with_series(e);
      first = false;
    }
    res.set_content(body + "]}", "application/json");
    return;
  }
  if (handle_core_events(req, res) || handle_discovery(req, res)) return;
  if (req.path == "/version") {
    res.set_content(R"({"major":"1","minor":"33","gitVersion":"v1.33.0-endpointd-fakeapi"})",
                    "application/json");
    return;
  }
  // The service-account issuer's discovery document and keys (peer token identity).
  if (req.path == "/.well-known/openid-configuration" || req.path == "/openid/v1/jwks") {
    if (issuer_keys_fail_) {
      res.status = 503;
      res.set_content(status_json(503, "ServiceUnavailable", "injected issuer failure"),
                      "application/json");
      return;
    }
    res.set_content(
        req.path == "/openid/v1/jwks" ? issuer_->jwks() : issuer_->discovery(),
        req.path == "/openid/v1/jwks" ? "application/jwk-set+json" : "application/json");
    return;
  }
  Resource* r = resource_for_path(req.path);
  if (r == nullptr) {
    res.status = 404;
    res.set_content(
        status_json(404, "NotFound", "the server could not find the requested resource"),
        "application/json");
    return;
  }
  if (rec.is_watch()) {
    handle_watch(*r, req, res, lock);
  } else {
    handle_list(*r, req, res, lock);
    bytes_sent_ += res.body.size();
  }
}

void FakeApiServer::withhold_initial_events_end(bool withhold) {
  std::lock_guard lock(mu_);
  withhold_initial_events_end_ = withhold;
}

void FakeApiServer::expire_next_watch_list_after(size_t events) {
  std::lock_guard lock(mu_);
  expire_watch_list_after_ = events;
}

void FakeApiServer::set_initial_events_end_version(std::optional<uint64_t> rv) {
  std::lock_guard lock(mu_);
  initial_events_end_rv_ = rv;
}

namespace {

// gzip at `level`, or nothing when zlib fails.
std::optional<std::string> gzip(const std::string& in, int level) {
  z_stream z{};
  if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    return std::nullopt;
  std::string out(deflateBound(&z, in.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) return std::nullopt;
  return out;
}

// As the API server compresses a list: gzip at level 1 when the body is 128 KiB or more, and
// not at all otherwise (its response writer's level and threshold).
std::optional<std::string> compress_list(const std::string& body) {
  constexpr size_t kThreshold = 128 * 1024;
  if (body.size() < kThreshold) return std::nullopt;
  return gzip(body, 1);
}

bool accepts_gzip(const httplib::Request& req) {
  return req.get_header_value("Accept-Encoding").find("gzip") != std::string::npos;
}

bool accepts_protobuf(const httplib::Request& req) {
  return req.get_header_value("Accept").find("application/vnd.kubernetes.protobuf") !=
         std::string::npos;
}
constexpr const char* kProtobufType = "application/vnd.kubernetes.protobuf";

// The page's items in protobuf, when every one has that form.
template <typename Items>
std::optional<std::vector<std::string_view>> protobuf_items(const Items& items, size_t begin,
                                                            size_t end) {
  std::vector<std::string_view> out;
  for (size_t i = begin; i < end; ++i) {
    if (!items[i]->protobuf) return std::nullopt;
    out.push_back(*items[i]->protobuf);
  }
  return out;
}

// The content type carries its charset so that cpp-httplib, which compresses a body typed
// exactly "application/json" on its own (level 6, and brotli first), leaves it as it is.
constexpr const char* kListType = "application/json;charset=utf-8";

std::string list_body(std::string_view kind, std::string_view api_version, uint64_t rv,
                      const std::string& next, const std::vector<std::string_view>& items) {
  std::string body = "{\"kind\":\"" + std::string(kind) + "List\",\"apiVersion\":\"" +
                     std::string(api_version) + "\",\"metadata\":{\"resourceVersion\":\"" +
                     std::to_string(rv) + "\"";
  if (!next.empty()) body += ",\"continue\":\"" + next + "\"";
  body += "},\"items\":[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) body.push_back(',');
    body += items[i];
  }
  body += "]}";
  return body;
}

}  // namespace

void FakeApiServer::set_list_body(const httplib::Request& req, httplib::Response& res,
                                  std::string body, const char* type) {
  if (accepts_gzip(req)) {
    if (auto z = compress_list(body)) {
      res.set_header("Content-Encoding", "gzip");
      res.set_content(std::move(*z), type);
      return;
    }
  }
  res.set_content(std::move(body), type);
}

void FakeApiServer::set_serve_protobuf(bool serve) {
  std::lock_guard lock(mu_);
  serve_protobuf_ = serve;
}

bool FakeApiServer::protobuf_for(const Resource& r, const httplib::Request& req) const {
  return serve_protobuf_ && std::string_view(r.info.kind) == "EndpointSlice" &&
         accepts_protobuf(req);
}

void FakeApiServer::prepare_lists(size_t limit) {
  std::lock_guard lock(mu_);
  prepared_.clear();
  if (limit == 0) return;
  for (auto& [name, r] : resources_) {
    Prepared p;
    p.rv = rv_;
    p.limit = limit;
    p.snapshot = next_snapshot_id_++;
    auto& items = snapshots_[p.snapshot];
    for (const auto& [_, s] : r->objects) items.push_back(s);
    snapshot_rv_[p.snapshot] = rv_;
    size_t offset = 0;
    do {
      size_t end = std::min(items.size(), offset + limit);
      std::string next =
          end < items.size() ? std::to_string(p.snapshot) + ":" + std::to_string(end) : "";
      std::vector<std::string_view> page;
      for (size_t i = offset; i < end; ++i) page.push_back(items[i]->json);
      p.raw.push_back(list_body(r->info.kind, r->info.api_version, rv_, next, page));
      p.gzipped.push_back(compress_list(p.raw.back()).value_or(std::string()));
      if (std::string_view(r->info.kind) == "EndpointSlice")
        if (auto pb = protobuf_items(items, offset, end)) {
          p.protobuf.push_back(protobuf_list_page(
              r->info.api_version, std::string(r->info.kind) + "List", rv_, next, *pb));
          p.protobuf_gzipped.push_back(compress_list(p.protobuf.back()).value_or(std::string()));
        }
      offset = end;
    } while (offset < items.size());
    prepared_[name] = std::move(p);
  }
}

bool FakeApiServer::serve_prepared(Resource& r, const httplib::Request& req,
                                   httplib::Response& res) {
  auto it = prepared_.find(r.info.resource);
  if (it == prepared_.end() || expire_next_continue_) return false;
  const Prepared& p = it->second;
  if (req.has_param("labelSelector") || req.has_param("fieldSelector") ||
      req.get_param_value("limit") != std::to_string(p.limit))
    return false;
  size_t page = 0;
  const std::string cont = req.get_param_value("continue");
  if (cont.empty()) {
    if (p.rv != rv_) return false;
  } else {
    const std::string prefix = std::to_string(p.snapshot) + ":";
    if (!cont.starts_with(prefix)) return false;
    size_t offset = 0;
    try {
      offset = std::stoull(cont.substr(prefix.size()));
    } catch (const std::exception&) {
      return false;
    }
    if (offset % p.limit != 0 || offset / p.limit >= p.raw.size()) return false;
    page = offset / p.limit;
  }
  res.status = 200;
  const bool protobuf = protobuf_for(r, req) && p.protobuf.size() == p.raw.size();
  const auto& raw = protobuf ? p.protobuf : p.raw;
  const auto& gzipped = protobuf ? p.protobuf_gzipped : p.gzipped;
  const char* type = protobuf ? kProtobufType : kListType;
  if (accepts_gzip(req) && !gzipped[page].empty()) {
    res.set_header("Content-Encoding", "gzip");
    res.set_content(gzipped[page], type);
  } else {
    res.set_content(raw[page], type);
  }
  ++prepared_served_;
  return true;
}

void FakeApiServer::set_cache_behind(bool behind) {
  std::lock_guard lock(mu_);
  cache_behind_ = behind;
}

bool FakeApiServer::list_version_servable(const httplib::Request& req, httplib::Response& res) {
  // The semantics of a list's resourceVersion (the API concepts' "Semantics for get and
  // list"): unset, the most recent state; "0", any state (a watch cache's); N with
  // resourceVersionMatch=NotOlderThan (or no match and no limit), a state at least as new as N,
  // which a cache not there yet answers 504 "Too large resource version"; N with Exact (or no
  // match and a limit), the state at N, which this server keeps only while it is the current
  // one (410 otherwise). A continued list names no version.
  const std::string rv = req.get_param_value("resourceVersion");
  const std::string match = req.get_param_value("resourceVersionMatch");
  auto refuse = [&](int code, const char* reason, const std::string& message) {
    res.status = code;
    res.set_content(status_json(code, reason, message), "application/json");
    return false;
  };
  if (!req.get_param_value("continue").empty() && !rv.empty() && rv != "0")
    return refuse(400, "BadRequest",
                  "specifying resource version is not allowed when using continue");
  if (!match.empty() && match != "NotOlderThan" && match != "Exact")
    return refuse(400, "BadRequest", "resourceVersionMatch: Unsupported value: \"" + match + "\"");
  if (!match.empty() && rv.empty())
    return refuse(400, "BadRequest",
                  "resourceVersionMatch is forbidden unless resourceVersion is provided");
  if (rv == "0" && match == "Exact")
    return refuse(400, "BadRequest",
                  "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"");
  if (rv.empty() || rv == "0") return true;
  auto parsed = model::parse_revision(rv);
  if (!parsed) return refuse(400, "BadRequest", parsed.error());
  const uint64_t n = *parsed;
  const bool exact = match == "Exact" || (match.empty() && req.has_param("limit"));
  if (exact) {
    if (n == rv_) return true;
    return refuse(410, "Expired",
                  "too old resource version: " + rv + " (" + std::to_string(rv_) + ")");
  }
  if (cache_behind_ || n > rv_)
    return refuse(504, "Timeout",
                  "Too large resource version: " + rv + ", current: " + std::to_string(rv_));
  return true;
}

void FakeApiServer::handle_list(Resource& r, const httplib::Request& req, httplib::Response& res,
                                std::unique_lock<std::mutex>& lock) {
  if (!list_version_servable(req, res)) return;
  if (serve_prepared(r, req, res)) return;
  std::vector<std::shared_ptr<const Stored>> items;
  uint64_t list_rv = rv_;
  size_t offset = 0;
  std::string cont = req.get_param_value("continue");
  if (!cont.empty()) {
    auto colon = cont.find(':');
    uint64_t id = 0;
    try {
      id = std::stoull(cont.substr(0, colon));
      offset = colon == std::string::npos ? 0 : std::stoull(cont.substr(colon + 1));
    } catch (const std::exception&) {
      id = 0;
    }
    auto it = snapshots_.find(id);
    if (expire_next_continue_ || it == snapshots_.end()) {
      expire_next_continue_ = false;
      res.status = 410;
      res.set_content(status_json(410, "Expired",
                                  "The provided continue parameter is too old to display a "
                                  "consistent list result. You can start a new list without "
                                  "the continue parameter."),
                      "application/json");
      return;
    }
    items = it->second;
    list_rv = snapshot_rv_[id];
    if (offset > items.size()) offset = items.size();
  } else {
    auto labels = parse_selector(req.get_param_value("labelSelector"));
    auto fields = parse_selector(req.get_param_value("fieldSelector"));
    for (const auto& [_, s] : r.objects) {
      if (matches(labels, s->labels) && matches(fields, s->fields)) items.push_back(s);
    }
  }
  size_t limit = 0;
  if (req.has_param("limit")) {
    try {
      limit = std::stoull(req.get_param_value("limit"));
    } catch (const std::exception&) {
      limit = 0;
    }
  }
  size_t end = items.size();
  std::string next;
  if (limit > 0 && items.size() - offset > limit) {
    end = offset + limit;
    uint64_t id = 0;
    if (!cont.empty()) {
      id = std::stoull(cont.substr(0, cont.find(':')));
    } else {
      id = next_snapshot_id_++;
      snapshots_[id] = items;
      snapshot_rv_[id] = list_rv;
    }
    next = std::to_string(id) + ":" + std::to_string(end);
  }
  std::vector<std::string_view> page;
  std::string body;
  const char* type = kListType;
  std::optional<std::vector<std::string_view>> pb;
  if (protobuf_for(r, req)) pb = protobuf_items(items, offset, end);
  if (pb) {
    body = protobuf_list_page(r.info.api_version, std::string(r.info.kind) + "List", list_rv, next,
                              *pb);
    type = kProtobufType;
  } else {
    for (size_t i = offset; i < end; ++i) page.push_back(items[i]->json);
    body = list_body(r.info.kind, r.info.api_version, list_rv, next, page);
  }
  // The items are shared and immutable: compressing needs no lock, and two lists (as an
  // agent's Services and EndpointSlices at start) are compressed at once, as the API server
  // would.
  lock.unlock();
  res.status = 200;
  set_list_body(req, res, std::move(body), type);
}

void FakeApiServer::handle_watch(Resource& r, const httplib::Request& req, httplib::Response& res,
                                 std::unique_lock<std::mutex>&) {
  if (expire_next_watch_ && expire_next_watch_http_) {
    expire_next_watch_ = false;
    res.status = 410;
    res.set_content(status_json(410, "Expired", "too old resource version"), "application/json");
    return;
  }
  auto w = std::make_shared<Watch>();
  w->resource = &r;
  w->bookmarks = req.get_param_value("allowWatchBookmarks") == "true";
  w->labels = parse_selector(req.get_param_value("labelSelector"));
  w->fields = parse_selector(req.get_param_value("fieldSelector"));
  int64_t timeout_s = 1800;
  if (req.has_param("timeoutSeconds")) {
    try {
      timeout_s = std::stoll(req.get_param_value("timeoutSeconds"));
    } catch (const std::exception&) {
    }
  }
  auto now = std::chrono::steady_clock::now();
  w->deadline = now + std::chrono::seconds(timeout_s);
  w->close_epoch = close_epoch_;
  w->bookmark_epoch = bookmark_epoch_;
  w->raw_seq = r.raw_seq;
  w->lines_before_silence = silence_next_watch_;
  silence_next_watch_.reset();

  const std::string rv_param = req.get_param_value("resourceVersion");
  // WatchList: kube-apiserver's validation of ListOptions, then the state it was asked for.
  const bool send_initial = req.get_param_value("sendInitialEvents") == "true" &&
                            options_.watch_list != Options::WatchList::kIgnored;
  if (send_initial) {
    auto invalid = [&](const std::string& message) {
      res.status = 422;
      res.set_content(status_json(422, "Invalid", message), "application/json");
    };
    if (options_.watch_list == Options::WatchList::kOff)
      return invalid(
          "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: "
          "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled");
    if (req.get_param_value("resourceVersionMatch") != "NotOlderThan")
      return invalid(
          "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: "
          "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan");
    if (!w->bookmarks)
      return invalid(
          "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Forbidden: "
          "sendInitialEvents requires setting allowWatchBookmarks to true");
    if (!rv_param.empty()) {
      auto n = model::parse_revision(rv_param);
      if (!n) {
        res.status = 400;
        res.set_content(status_json(400, "BadRequest", n.error()), "application/json");
        return;
      }
      // A state at least as new as N: a watch cache not there yet times out.
      if (cache_behind_ || *n > rv_) {
        res.status = 504;
        res.set_content(status_json(504, "Timeout",
                                    "Too large resource version: " + rv_param +
                                        ", current: " + std::to_string(rv_)),
                        "application/json");
        return;
      }
    }
  }
  if (expire_next_watch_) {
    expire_next_watch_ = false;
    w->pending.push_back(R"({"type":"ERROR","object":)" +
                         status_json(410, "Expired", "too old resource version: " + rv_param) +
                         "}");
    w->finish_after_pending = true;
  } else if (send_initial) {
    size_t sent = 0;
    for (const auto& [_, s] : r.objects) {
      if (!w->selected(*s)) continue;
      if (expire_watch_list_after_ && sent == *expire_watch_list_after_) break;
      w->pending.push_back(R"({"type":"ADDED","object":)" + s->json + "}");
      ++sent;
    }
    if (expire_watch_list_after_) {
      expire_watch_list_after_.reset();
      w->pending.push_back(R"({"type":"ERROR","object":)" +
                           status_json(410, "Expired", "too old resource version") + "}");
      w->finish_after_pending = true;
    } else if (!withhold_initial_events_end_) {
      const uint64_t end_rv = initial_events_end_rv_.value_or(rv_);
      w->pending.push_back("{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"" +
                           std::string(r.info.kind) + "\",\"apiVersion\":\"" + r.info.api_version +
                           "\",\"metadata\":{\"resourceVersion\":\"" + std::to_string(end_rv) +
                           "\",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}");
    }
    w->pos = rv_;
  } else if (rv_param.empty() || rv_param == "0") {
    // Synthetic ADDED events for the current state, then changes.
    for (const auto& [_, s] : r.objects) {
      if (w->selected(*s)) w->pending.push_back(R"({"type":"ADDED","object":)" + s->json + "}");
    }
    w->pos = rv_;
  } else {
    uint64_t from = 0;
    try {
      from = std::stoull(rv_param);
    } catch (const std::exception&) {
      res.status = 400;
      res.set_content(status_json(400, "BadRequest", "invalid resourceVersion"),
                      "application/json");
      return;
    }
    if (from < r.compacted_rv) {
      w->pending.push_back(R"({"type":"ERROR","object":)" +
                           status_json(410, "Expired",
                                       "too old resource version: " + rv_param + " (" +
                                           std::to_string(r.compacted_rv) + ")") +
                           "}");
      w->finish_after_pending = true;
    }
    w->pos = from;
  }
  ++open_watches_;
  res.status = 200;
  res.set_chunked_content_provider(
      "application/json;stream=watch",
      [this, w](size_t, httplib::DataSink& sink) -> bool {
        std::unique_lock lock(mu_);
        while (true) {
          if (stopping_ || w->close_epoch != close_epoch_) return false;
          if (w->lines_before_silence && *w->lines_before_silence == 0) {
            // Silent: write nothing, keep the connection, until closed or stopped.
            ++silent_watches_;
            cv_.wait(lock, [&] { return stopping_ || w->close_epoch != close_epoch_; });
            --silent_watches_;
            return false;
          }
          Resource& res_ = *w->resource;
          if (w->pending.empty() && !w->finish_after_pending) {
            // Only the events after the watch's position (the history is in rv order).
            auto first =
                std::upper_bound(res_.history.begin(), res_.history.end(), w->pos,
                                 [](uint64_t pos, const HistoryEvent& e) { return pos < e.rv; });
            for (auto it = first; it != res_.history.end(); ++it) {
              const HistoryEvent& ev = *it;
              w->pos = ev.rv;
              bool now_in = w->selected(*ev.now);
              bool before_in = ev.before && w->selected(*ev.before);
              std::string type = ev.type;
              if (type == "MODIFIED" && now_in && !before_in) type = "ADDED";
              if (type == "MODIFIED" && !now_in && before_in) {
                type = "DELETED";
                now_in = true;
              }
              if (!now_in) continue;
              w->pending.push_back("{\"type\":\"" + type + "\",\"object\":" + ev.now->json + "}");
            }
            for (const auto& [seq, line] : res_.raw_lines) {
              if (seq > w->raw_seq) {
                w->pending.push_back(line);
                w->raw_seq = seq;
              }
            }
            if (w->bookmark_epoch != bookmark_epoch_) {
              w->bookmark_epoch = bookmark_epoch_;
              if (w->bookmarks) {
                w->pending.push_back(
                    "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"" + std::string(res_.info.kind) +
                    "\",\"apiVersion\":\"" + res_.info.api_version +
                    "\",\"metadata\":{\"resourceVersion\":\"" + std::to_string(rv_) + "\"}}}");
                w->pos = std::max(w->pos, rv_);
              }
            }
          }
          if (!w->pending.empty()) {
            std::string line = std::move(w->pending.front()) + "\n";
            w->pending.pop_front();
            const bool cut = cut_next_event_;
            cut_next_event_ = false;
            const size_t pieces = cut ? 2 : split_pieces_;
            const auto delay = split_delay_;
            lock.unlock();
            const size_t piece = (line.size() + pieces - 1) / pieces;
            for (size_t off = 0, i = 0; off < line.size(); off += piece, ++i) {
              if (i > 0 && delay.count() > 0) std::this_thread::sleep_for(delay);
              const size_t len = std::min(piece, line.size() - off);
              if (!sink.write(line.data() + off, len)) return false;
              bytes_sent_ += len;
              if (cut) return false;
            }
            ++events_sent_;
            lock.lock();
            if (w->lines_before_silence) --*w->lines_before_silence;
            if (close_after_events_) {
              if (*close_after_events_ <= 1) {
                close_after_events_.reset();
                return false;
              }
              --*close_after_events_;
            }
            continue;
          }
          if (w->finish_after_pending || std::chrono::steady_clock::now() >= w->deadline) {
            lock.unlock();
            sink.done();
            return true;
          }
          // Woken by every change (events, bookmarks, closes, stop) and at the watch's own
          // timeout; once a second besides, to notice a client that hung up.
          cv_.wait_until(lock, std::min(w->deadline, std::chrono::steady_clock::now() +
                                                         std::chrono::seconds(1)));
        }
      },
      [this](bool) {
        std::lock_guard lock(mu_);
        --open_watches_;
      });
}

std::vector<std::string> load_manifest_dir(const std::string& dir,
                                           std::vector<std::string>* errors) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  auto fail = [&](const std::string& msg) {
    if (errors) errors->push_back(msg);
  };
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    files.push_back(dir);  // a single file: a JSON state (`kind: List`) or one manifest
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  if (ec) fail(dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    const std::string ext = path.extension().string();
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::vector<std::string> docs;
    if (ext == ".json") {
      docs.push_back(ss.str());
    } else if (ext == ".yaml" || ext == ".yml") {
#ifdef ENDPOINTD_FAKEAPI_YAML
      auto converted = watcher::yaml_to_json_documents(ss.str());
      if (!converted) {
        fail(path.string() + ": " + converted.error());
        continue;
      }
      docs = std::move(*converted);
#else
      fail(path.string() + ": YAML is not supported in this build");
      continue;
#endif
    } else {
      continue;
    }
    for (const auto& doc : docs) {
      simdjson::dom::parser parser;
      simdjson::dom::element root;
      if (parser.parse(doc).get(root) != simdjson::SUCCESS) {
        fail(path.string() + ": not valid JSON");
        continue;
      }
      simdjson::dom::array items;
      if (root["items"].get(items) == simdjson::SUCCESS) {
        for (auto item : items) out.push_back(simdjson::minify(item));
      } else {
        out.push_back(simdjson::minify(root));
      }
    }
  }
  return out;
}

}  // namespace endpointd::fakeapi
