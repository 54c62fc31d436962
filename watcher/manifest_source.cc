// Manifest directory: per file, the objects of its last good read; a file that fails to parse
// keeps its previous objects, and an object that fails to decode keeps its previous version.
#include "watcher/manifest_source.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <simdjson.h>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "watcher/decode.h"
#include "watcher/yaml_json.h"

namespace endpointd::watcher {

namespace fs = std::filesystem;
using model::ObjectKind;

struct ManifestSource::FileState {
  // The file's path, shared with owners_ (an entry per object there).
  std::shared_ptr<const std::string> name;
  // Identity of the content last read: a rename or in-place write changes one of these.
  uint64_t inode = 0;
  int64_t mtime_ns = -1;
  int64_t size = -1;
  // (kind, ns/name) → a hash of the object's text, from the last good read. The objects
  // themselves live only in the Store: a change of text is what makes one be decoded again.
  std::map<std::pair<ObjectKind, std::string>, uint64_t> objects;
  std::vector<std::string> errors;
};

struct ManifestSource::Metrics {
  prometheus::Family<prometheus::Counter>* decode_errors = nullptr;
  prometheus::Counter* file_errors = nullptr;
  prometheus::Counter* reloads = nullptr;
  void decode_error(ObjectKind k) {
    if (decode_errors) decode_errors->Add({{"kind", std::string(model::to_string(k))}}).Increment();
  }
};

namespace {

bool is_manifest(const fs::path& p) {
  auto ext = p.extension().string();
  auto name = p.filename().string();
  if (name.empty() || name[0] == '.') return false;  // editor swap files, ConfigMap internals
  return ext == ".yaml" || ext == ".yml" || ext == ".json";
}

// Kind and key read straight from the JSON, for objects that fail to decode: the previous
// good version of that object is then kept.
std::optional<std::pair<ObjectKind, std::string>> identity(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(json.data(), json.size()).get(root) != simdjson::SUCCESS) return std::nullopt;
  std::string_view kind, ns = "default", name;
  if (root["kind"].get_string().get(kind) != simdjson::SUCCESS) return std::nullopt;
  auto k = kind_from_name(kind);
  if (!k) return std::nullopt;
  if (root["metadata"]["name"].get_string().get(name) != simdjson::SUCCESS) return std::nullopt;
  if (*k == ObjectKind::kNode) return std::make_pair(*k, std::string(name));
  std::string_view n;
  if (root["metadata"]["namespace"].get_string().get(n) == simdjson::SUCCESS && !n.empty()) ns = n;
  return std::make_pair(*k, std::string(ns) + "/" + std::string(name));
}

// Splits a document into objects: a `kind: List` (or `FooList`) yields its items.
Result<std::vector<std::string>> expand(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(json.data(), json.size()).get(root); err != simdjson::SUCCESS)
    return Error{std::string("malformed JSON: ") + simdjson::error_message(err)};
  std::vector<std::string> out;
  std::string_view kind;
  simdjson::dom::array items;
  if (root["kind"].get_string().get(kind) == simdjson::SUCCESS && kind.ends_with("List") &&
      root["items"].get_array().get(items) == simdjson::SUCCESS) {
    for (simdjson::dom::element item : items) out.push_back(simdjson::minify(item));
    return out;
  }
  out.emplace_back(json);
  return out;
}

}  // namespace

ManifestSource::ManifestSource(fs::path dir, Post post, prometheus::Registry* registry)
    : dir_(std::move(dir)), post_(std::move(post)), metrics_(std::make_unique<Metrics>()) {
  if (registry) {
    metrics_->decode_errors = &prometheus::BuildCounter()
                                   .Name("endpointd_decode_errors_total")
                                   .Help("Objects refused because they did not decode")
                                   .Register(*registry);
    auto& f = prometheus::BuildCounter()
                  .Name("endpointd_manifest_file_errors_total")
                  .Help("Manifest files that could not be read or parsed")
                  .Register(*registry);
    metrics_->file_errors = &f.Add({});
    auto& r = prometheus::BuildCounter()
                  .Name("endpointd_manifest_reloads_total")
                  .Help("Times the manifest directory was re-read after a change")
                  .Register(*registry);
    metrics_->reloads = &r.Add({});
  }
}

ManifestSource::~ManifestSource() {
  stop();
}

Status ManifestSource::start() {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec))
    return Error{"source directory " + dir_.string() + " is not a readable directory"};
  inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (inotify_fd_ < 0 || wake_fd_ < 0) return Error{"inotify: " + std::string(strerror(errno))};
  // No IN_MODIFY or IN_CREATE: a file is read once it is complete (closed after writing, or
  // renamed into place), never half-written.
  uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE |
                  IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB;
  if (inotify_add_watch(inotify_fd_, dir_.c_str(), mask) < 0)
    return Error{"inotify on " + dir_.string() + ": " + std::string(strerror(errno))};
  rescan();
  thread_ = std::thread([this] { run(); });
  return {};
}

void ManifestSource::stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] auto n = write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  if (inotify_fd_ >= 0) close(inotify_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  inotify_fd_ = wake_fd_ = -1;
}

void ManifestSource::run() {
  alignas(struct inotify_event) char buf[16384];
  while (!stopping_.load()) {
    pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("manifest source: poll: {}", strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    bool relevant = false;
    for (;;) {
      ssize_t n = read(inotify_fd_, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        inotify_event ev;
        std::memcpy(&ev, buf + off, sizeof ev);
        std::string name = ev.len ? std::string(buf + off + sizeof ev) : std::string();
        off += static_cast<ssize_t>(sizeof ev + ev.len);
        if (ev.mask & IN_CREATE) {
          // Only a symlink is complete at creation (the way ConfigMap volumes swap content).
          struct stat st;
          if (lstat((dir_ / name).c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) continue;
        }
        relevant = true;
      }
    }
    if (relevant) rescan();
  }
}

namespace {

uint64_t text_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

void ManifestSource::load_file(const fs::path& path, FileState& st, bool force, Decoded& out) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) {
    st.errors = {"cannot read the file"};
    return;
  }
  std::string text = ss.str();
  std::vector<std::string> docs;
  if (path.extension() == ".json") {
    docs.push_back(std::move(text));
  } else {
    auto conv = yaml_to_json_documents(text);
    if (!conv) {
      st.errors = {conv.error()};  // keep every object of the last good read
      return;
    }
    docs = std::move(*conv);
  }
  std::vector<std::string> objects;
  std::vector<std::string> errors;
  for (const auto& d : docs) {
    auto expanded = expand(d);
    if (!expanded) {
      errors.push_back(expanded.error());
      continue;
    }
    for (auto& o : *expanded) objects.push_back(std::move(o));
  }
  if (!errors.empty() && objects.empty()) {
    st.errors = std::move(errors);
    return;
  }
  decltype(st.objects) next;
  for (const auto& json : objects) {
    auto id = identity(json);
    if (!id) {
      // Not a kind endpointd reads (a Deployment, a ConfigMap...): skip it quietly. One of
      // ours without a name goes on to the decoder, which says what is wrong.
      simdjson::dom::parser p;
      simdjson::dom::element root;
      std::string_view kind;
      if (p.parse(json).get(root) == simdjson::SUCCESS &&
          root["kind"].get_string().get(kind) == simdjson::SUCCESS && !kind_from_name(kind)) {
        spdlog::debug("manifest {}: ignoring an object of kind {}", path.string(), kind);
        continue;
      }
    }
    uint64_t h = text_hash(json);
    if (id && !force) {
      auto old = st.objects.find(*id);
      if (old != st.objects.end() && old->second == h) {  // unchanged: the Store has it
        next.emplace(*id, h);
        continue;
      }
    }
    auto d = decode_json(json);
    if (!d) {
      errors.push_back(d.error());
      if (id) {
        metrics_->decode_error(id->first);
        // Keep the last good version: the Store still holds it.
        if (auto old = st.objects.find(*id); old != st.objects.end()) next.insert(*old);
      }
      continue;
    }
    for (const auto& w : d->warnings) spdlog::warn("manifest {}: {}", path.string(), w);
    Key key{model::kind_of(d->object), model::key_string(d->object)};
    next.insert_or_assign(key, h);
    out.emplace_back(std::move(key), std::move(d->object));
  }
  st.objects = std::move(next);
  st.errors = std::move(errors);
}

void ManifestSource::rescan() {
  std::error_code ec;
  std::map<std::string, FileState> next;
  std::map<std::string, Decoded> decoded;  // by file, what was decoded in this scan
  const bool first = reloads_.load() == 0;
  bool changed = first;  // the first read always posts: it marks the kinds synced
  model::Event ev;
  {
    std::lock_guard lock(mu_);
    // The objects whose owner may have changed: those of every file re-read or gone.
    std::set<Key> touched;
    auto forget = [&](const std::string& file, const FileState& st) {
      for (const auto& [key, h] : st.objects) {
        touched.insert(key);
        if (auto it = definers_.find(key); it != definers_.end()) {
          it->second.erase(file);
          if (it->second.empty()) definers_.erase(it);
        }
      }
    };
    auto learn = [&](const std::string& file, const FileState& st) {
      for (const auto& [key, h] : st.objects) {
        touched.insert(key);
        definers_[key].insert(file);
      }
    };
    for (const auto& entry : fs::directory_iterator(dir_, ec)) {
      const auto& path = entry.path();
      if (!is_manifest(path)) continue;
      struct stat sb;
      if (stat(path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
      FileState st;
      auto old = files_.find(path.string());
      if (old != files_.end())
        st = std::move(old->second);
      else
        st.name = std::make_shared<const std::string>(path.string());
      int64_t mtime = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
      if (st.inode != sb.st_ino || st.mtime_ns != mtime || st.size != sb.st_size) {
        st.inode = sb.st_ino;
        st.mtime_ns = mtime;
        st.size = sb.st_size;
        forget(path.string(), st);
        load_file(path, st, false, decoded[path.string()]);
        learn(path.string(), st);
        changed = true;
        for (const auto& e : st.errors) {
          spdlog::error("manifest {}: {}; keeping its last good objects", path.string(), e);
          error_count_.fetch_add(1);
          if (metrics_->file_errors) metrics_->file_errors->Increment();
        }
      }
      next.emplace(path.string(), std::move(st));
    }
    if (ec) {
      spdlog::error("manifest source: cannot list {}: {}", dir_.string(), ec.message());
      for (auto& [file, st] : next) files_[file] = std::move(st);
      return;  // keep what we had
    }
    for (const auto& [file, st] : files_) {
      if (next.count(file)) continue;
      forget(file, st);  // a file went away (its entry was not moved into next)
      changed = true;
    }
    files_ = std::move(next);
    if (!changed) return;  // an event for a file that is not a manifest, or no real change

    // Owners of the touched objects: the last file in name order that defines each.
    std::map<Key, std::shared_ptr<const std::string>> owners;  // touched ones; null: gone
    for (const Key& key : touched) {
      auto d = definers_.find(key);
      if (d == definers_.end()) {
        owners.emplace(key, nullptr);
        continue;
      }
      const std::string& file = *d->second.rbegin();
      owners.emplace(key, files_.at(file).name);
      if (d->second.size() > 1)
        for (const auto& other : d->second)
          if (other != file && decoded.count(other))
            spdlog::warn("manifest {}: {} {} is also defined in {}; using that one", other,
                         model::to_string(key.first), key.second, file);
    }
    auto owned_by = [&](const Key& key, const std::string& file) {
      auto it = owners.find(key);
      return it != owners.end() && it->second && *it->second == file;
    };
    // An object whose owner is now a file whose version of it was not decoded in this scan
    // (the file that won before dropped it): that file is decoded again.
    for (const auto& [key, owner] : owners) {
      if (!owner) continue;
      const std::string& file = *owner;
      auto old = owners_.find(key);
      if (old == owners_.end() || *old->second == file) continue;
      auto have = decoded.find(file);
      bool present = have != decoded.end() &&
                     std::any_of(have->second.begin(), have->second.end(),
                                 [&k = key](const auto& kv) { return kv.first == k; });
      if (!present) {
        Decoded again;
        load_file(file, files_[file], true, again);
        decoded[file] = std::move(again);
      }
    }
    if (first) {
      std::vector<model::Replace> replaces = {{ObjectKind::kService, {}},
                                              {ObjectKind::kEndpointSlice, {}},
                                              {ObjectKind::kNode, {}},
                                              {ObjectKind::kPod, {}}};
      for (auto& [file, objs] : decoded)
        for (auto& [key, obj] : objs)
          if (owned_by(key, file))
            replaces[static_cast<size_t>(key.first)].objects.push_back(std::move(obj));
      ev.change = model::ReplaceMany{std::move(replaces)};
    } else {
      model::Batch batch;
      for (auto& [file, objs] : decoded)
        for (auto& [key, obj] : objs)
          if (owned_by(key, file)) batch.upserts.push_back(std::move(obj));
      for (const auto& [key, owner] : owners) {
        if (owner || !owners_.count(key)) continue;
        model::Remove r;
        r.kind = key.first;
        if (key.first == ObjectKind::kNode) {
          r.key = {"", key.second};
        } else {
          auto slash = key.second.find('/');
          r.key = {key.second.substr(0, slash), key.second.substr(slash + 1)};
        }
        batch.removes.push_back(std::move(r));
      }
      ev.change = std::move(batch);
    }
    for (auto& [key, owner] : owners) {
      if (owner)
        owners_[key] = std::move(owner);
      else
        owners_.erase(key);
    }
  }
  reloads_.fetch_add(1);
  if (metrics_->reloads) metrics_->reloads->Increment();
  post_(std::move(ev));
}

std::vector<ManifestError> ManifestSource::errors() const {
  std::lock_guard lock(mu_);
  std::vector<ManifestError> out;
  for (const auto& [file, st] : files_)
    for (const auto& e : st.errors) out.push_back({file, e});
  return out;
}

}  // namespace endpointd::watcher
