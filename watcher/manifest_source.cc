// Manifest directory: per file, the objects of its last good read; a file that fails to parse
// keeps its previous objects, and an object that fails to decode keeps its previous version.
#include "watcher/manifest_source.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <simdjson.h>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <system_error>

#include "watcher/decode.h"
#include "watcher/yaml_json.h"

namespace endpointd::watcher {

namespace fs = std::filesystem;
using model::ObjectKind;

struct ManifestSource::FileState {
  // The file's path, shared with objects_ (an entry per object there).
  std::shared_ptr<const std::string> name;
  // Identity of the content last read: a rename or in-place write changes one of these.
  uint64_t inode = 0;
  int64_t mtime_ns = -1;
  int64_t size = -1;
  bool link = false;  // the directory entry is a symbolic link
  // (kind, ns/name) → a hash of the object's text, from the last good read. The objects
  // themselves live only in the Store: a change of text is what makes one be decoded again.
  std::unordered_map<Key, uint64_t, KeyHash> objects;
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

// Kind and key of a parsed object, read before it is decoded: an unchanged object is then
// skipped, and one that fails to decode keeps its previous good version.
std::optional<std::pair<ObjectKind, std::string>> identity(const simdjson::dom::element& root) {
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

// A hash of a parsed object's content, walked on the parser's tape: whether an object changed
// is known without writing it out as text again. Strings are length-prefixed and every value
// carries its type, so different structures do not collide by construction. The object's
// metadata.managedFields (often a third of its text) is left out: the decoder never reads it.
class ContentHash {
 public:
  uint64_t value() const { return h_; }
  void add_object(const simdjson::dom::element& root) { add(root, Level::kRoot); }

 private:
  enum class Level : uint8_t { kRoot, kMetadata, kOther };
  void add(const simdjson::dom::element& e, Level level = Level::kOther) {
    namespace dom = simdjson::dom;
    switch (e.type()) {
      case dom::element_type::ARRAY: {
        mix('[');
        dom::array a;
        if (e.get_array().get(a) == simdjson::SUCCESS)
          for (dom::element x : a) add(x);
        mix(']');
        break;
      }
      case dom::element_type::OBJECT: {
        mix('{');
        dom::object o;
        if (e.get_object().get(o) == simdjson::SUCCESS)
          for (dom::key_value_pair kv : o) {
            if (level == Level::kMetadata && kv.key == "managedFields") continue;
            text(kv.key);
            add(kv.value,
                level == Level::kRoot && kv.key == "metadata" ? Level::kMetadata : Level::kOther);
          }
        mix('}');
        break;
      }
      case dom::element_type::STRING: {
        std::string_view s;
        if (e.get_string().get(s) == simdjson::SUCCESS) text(s);
        break;
      }
      case dom::element_type::INT64: {
        int64_t i = 0;
        if (e.get_int64().get(i) == simdjson::SUCCESS) mix('i', static_cast<uint64_t>(i));
        break;
      }
      case dom::element_type::UINT64: {
        uint64_t u = 0;
        if (e.get_uint64().get(u) == simdjson::SUCCESS) mix('u', u);
        break;
      }
      case dom::element_type::DOUBLE: {
        double d = 0;
        uint64_t bits = 0;
        if (e.get_double().get(d) == simdjson::SUCCESS) std::memcpy(&bits, &d, sizeof bits);
        mix('d', bits);
        break;
      }
      case dom::element_type::BOOL: {
        bool b = false;
        if (e.get_bool().get(b) == simdjson::SUCCESS) mix(b ? 't' : 'f');
        break;
      }
      case dom::element_type::NULL_VALUE:
        mix('n');
        break;
    }
  }

  void mix(uint64_t tag, uint64_t v = 0) {
    h_ = (h_ ^ tag) * 0x100000001b3ull;
    h_ = (h_ ^ v) * 0x9e3779b97f4a7c15ull;
    h_ ^= h_ >> 29;
  }
  // Inline, eight bytes a step: the strings are short and many (keys, names, addresses), and
  // a library call per string was a fifth of reading a directory. Each step is a bijection
  // of the state for a given word, so strings of one length differing in one word never
  // collide.
  void text(std::string_view s) {
    uint64_t h = s.size() * 0x9e3779b97f4a7c15ull;
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      h = (h ^ w) * 0xff51afd7ed558ccdull;
      h ^= h >> 32;
    }
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 32;
    mix('"' + (s.size() << 8), h);
  }

  uint64_t h_ = 1469598103934665603ull;
};

uint64_t content_hash(const simdjson::dom::element& e) {
  ContentHash h;
  h.add_object(e);
  return h.value();
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
    // Only the files the events name are looked at again, unless the kernel dropped events
    // (IN_Q_OVERFLOW) or the directory itself changed: then every file is.
    bool full = false;
    std::set<std::string> names;
    for (;;) {
      ssize_t n = read(inotify_fd_, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        inotify_event ev;
        std::memcpy(&ev, buf + off, sizeof ev);
        const char* name_at = buf + off + sizeof ev;
        std::string name = ev.len ? std::string(name_at, strnlen(name_at, ev.len)) : std::string();
        off += static_cast<ssize_t>(sizeof ev + ev.len);
        if ((ev.mask & IN_Q_OVERFLOW) || name.empty()) {
          full = true;
          continue;
        }
        if (ev.mask & IN_ISDIR) continue;  // never read; links into it have their own events
        struct stat st;
        if (ev.mask & IN_CREATE) {
          // Only a symlink is complete at creation (the way ConfigMap volumes swap content).
          if (lstat((dir_ / name).c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) continue;
        }
        if (is_manifest(name)) {
          names.insert(std::move(name));
        } else if (linked_files_.load() > 0) {
          // A manifest that is a link may read through this entry (a ConfigMap volume's
          // `..data`, swapped by rename): which ones is not known here.
          full = true;
        }
      }
    }
    if (full)
      rescan_files(nullptr);
    else if (!names.empty())
      rescan_files(&names);
  }
}

struct ManifestSource::Scratch {
  simdjson::dom::parser parser;
  std::string text;  // the file read, then SIMDJSON_PADDING bytes
};

namespace {

// Reads a whole file into `buf` (reused from file to file: no new pages per file), followed
// by the padding simdjson reads past the end. Its length, or nothing when it cannot be read.
std::optional<size_t> read_padded(const fs::path& path, std::string& buf) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return std::nullopt;
  }
  size_t len = 0;
  size_t want = static_cast<size_t>(std::max<off_t>(sb.st_size, 0)) + 1;  // +1: sees EOF
  for (;;) {
    if (buf.size() < len + want + simdjson::SIMDJSON_PADDING)
      buf.resize(len + want + simdjson::SIMDJSON_PADDING);
    ssize_t n = read(fd, buf.data() + len, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    len += static_cast<size_t>(n);
    want = std::max<size_t>(want - std::min<size_t>(want, static_cast<size_t>(n)), 64 * 1024);
  }
  close(fd);
  std::memset(buf.data() + len, 0, simdjson::SIMDJSON_PADDING);
  return len;
}

}  // namespace

void ManifestSource::load_file(const fs::path& path, FileState& st, bool force, Decoded& out,
                               Scratch& scratch) {
  // Read straight into simdjson's padded buffer: a JSON file is parsed where it was read.
  auto& parser = scratch.parser;
  auto read = read_padded(path, scratch.text);
  if (!read) {
    st.errors = {"cannot read the file"};
    return;
  }
  std::vector<std::string> yaml_docs;
  const bool json = path.extension() == ".json";
  if (!json) {
    auto conv = yaml_to_json_documents(std::string_view(scratch.text.data(), *read));
    if (!conv) {
      st.errors = {conv.error()};  // keep every object of the last good read
      return;
    }
    yaml_docs = std::move(*conv);
  }

  // Each document is parsed once; a List's items are read from that parse (identity, content
  // hash, and — only when the hash changed — the decoder), never written out and parsed again.
  std::vector<std::string> errors;
  bool any_object = false;  // of any kind: a file of Deployments is not a broken file
  decltype(st.objects) next;
  auto one = [&](const simdjson::dom::element& obj, size_t bytes) {
    any_object = true;
    auto id = identity(obj);
    if (!id) {
      // Not a kind endpointd reads (a Deployment, a ConfigMap...): skip it quietly. One of
      // ours without a name goes on to the decoder, which says what is wrong.
      std::string_view kind;
      if (obj["kind"].get_string().get(kind) == simdjson::SUCCESS && !kind_from_name(kind)) {
        spdlog::debug("manifest {}: ignoring an object of kind {}", path.string(), kind);
        return;
      }
    }
    uint64_t h = content_hash(obj);
    if (id && !force) {
      auto old = st.objects.find(*id);
      if (old != st.objects.end() && old->second == h) {  // unchanged: the Store has it
        next.emplace(*id, h);
        return;
      }
    }
    Result<watcher::Decoded> d =
        bytes > kMaxObjectBytes
            ? Result<watcher::Decoded>(Error{"object of " + std::to_string(bytes) +
                                             " bytes exceeds the limit of " +
                                             std::to_string(kMaxObjectBytes)})
            : decode_object(obj);
    decoded_objects_.fetch_add(1);
    if (!d) {
      errors.push_back(d.error());
      if (id) {
        metrics_->decode_error(id->first);
        // Keep the last good version: the Store still holds it.
        if (auto old = st.objects.find(*id); old != st.objects.end()) next.insert(*old);
      }
      return;
    }
    for (const auto& w : d->warnings) spdlog::warn("manifest {}: {}", path.string(), w);
    Key key{model::kind_of(d->object), model::key_string(d->object)};
    next.insert_or_assign(key, h);
    out.emplace_back(std::move(key), std::move(d->object));
  };
  auto document = [&](simdjson::simdjson_result<simdjson::dom::element> parsed, size_t bytes) {
    simdjson::dom::element root;
    if (auto err = parsed.get(root); err != simdjson::SUCCESS) {
      errors.push_back(std::string("malformed JSON: ") + simdjson::error_message(err));
      return;
    }
    // A `kind: List` (or `FooList`) stands for its items.
    std::string_view kind;
    simdjson::dom::array items;
    if (root["kind"].get_string().get(kind) == simdjson::SUCCESS && kind.ends_with("List") &&
        root["items"].get_array().get(items) == simdjson::SUCCESS) {
      for (simdjson::dom::element item : items) one(item, 0);
      return;
    }
    one(root, bytes);
  };
  if (json) {
    // Parsed where it was read: the padding is there, nothing is copied.
    document(parser.parse(scratch.text.data(), *read, false), *read);
  } else {
    for (const auto& d : yaml_docs) document(parser.parse(d), d.size());
  }
  if (!errors.empty() && !any_object) {
    st.errors = std::move(errors);  // nothing readable: keep every object of the last good read
    return;
  }
  st.objects = std::move(next);
  st.errors = std::move(errors);
}

void ManifestSource::load_files(const std::vector<Load>& files, Scratch& scratch) {
  // A thread more per kLoadsPerThread files, up to the cores: one file or a few (the usual
  // change) are read right here, without starting any.
  constexpr size_t kLoadsPerThread = 16;
  size_t threads =
      std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()),
                        (files.size() + kLoadsPerThread - 1) / kLoadsPerThread, kMaxLoadThreads});
  std::atomic<size_t> next{0};
  auto work = [&](Scratch& s) {
    for (size_t i; (i = next.fetch_add(1)) < files.size();)
      load_file(*files[i].path, *files[i].state, false, *files[i].out, s);
  };
  std::vector<std::thread> helpers;
  std::vector<Scratch> scratches(threads > 1 ? threads - 1 : 0);
  for (auto& s : scratches) {
    try {
      helpers.emplace_back(work, std::ref(s));
    } catch (const std::system_error&) {
      break;  // no thread to be had: this one reads the rest
    }
  }
  work(scratch);
  for (auto& t : helpers) t.join();
}

void ManifestSource::rescan() {
  rescan_files(nullptr);
}

void ManifestSource::rescan_files(const std::set<std::string>* names) {
  // The files to look at: those named, or (a full rescan) every manifest listed plus every
  // file known from before (one that is gone is forgotten below).
  std::set<std::string> paths;
  if (names) {
    for (const auto& n : *names)
      if (fs::path p = dir_ / n; is_manifest(p)) paths.insert(p.string());
  } else {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir_, ec))
      if (is_manifest(entry.path())) paths.insert(entry.path().string());
    if (ec) {
      spdlog::error("manifest source: cannot list {}: {}", dir_.string(), ec.message());
      return;  // keep what we had
    }
  }
  std::map<std::string, Decoded> decoded;  // by file, what was decoded in this scan
  Scratch scratch;
  std::vector<Load> to_load;  // in name order
  const bool first = reloads_.load() == 0;
  bool changed = first;  // the first read always posts: it marks the kinds synced
  model::Event ev;
  ev.received = std::chrono::steady_clock::now();  // the scan's start
  {
    std::lock_guard lock(mu_);
    if (!names)
      for (const auto& [file, st] : files_) paths.insert(file);
    // The objects whose owner may have changed: those of every file re-read or gone.
    const uint64_t scan = ++scans_;
    std::vector<std::pair<const Key*, Definers*>> touched;
    auto touch = [&](const Key& key, Definers& d) {
      if (d.scan == scan) return;
      d.scan = scan;
      touched.emplace_back(&key, &d);
    };
    auto forget = [&](const std::string& file, const FileState& st) {
      for (const auto& [key, h] : st.objects) {
        auto it = objects_.find(key);
        if (it == objects_.end()) continue;
        touch(it->first, it->second);
        std::erase_if(it->second.files, [&](const auto& f) { return *f == file; });
      }
    };
    auto learn = [&](const FileState& st) {
      for (const auto& [key, h] : st.objects) {
        auto& [k, d] = *objects_.try_emplace(key).first;
        touch(k, d);
        auto& files = d.files;  // in name order
        auto at = std::lower_bound(files.begin(), files.end(), *st.name,
                                   [](const auto& f, const std::string& n) { return *f < n; });
        if (at == files.end() || **at != *st.name) files.insert(at, st.name);
      }
    };
    for (const auto& file : paths) {
      // A manifest may be a link (a ConfigMap volume's are): its content is the target's.
      struct stat sb;
      bool exists = lstat(file.c_str(), &sb) == 0;
      const bool link = exists && S_ISLNK(sb.st_mode);
      if (link) exists = stat(file.c_str(), &sb) == 0;
      const bool present = exists && S_ISREG(sb.st_mode);
      auto it = files_.find(file);
      if (!present) {
        if (it == files_.end()) continue;
        forget(file, it->second);  // the file went away
        if (it->second.link) --linked_files_;
        files_.erase(it);
        changed = true;
        continue;
      }
      if (it == files_.end()) {
        it = files_.emplace(file, FileState{}).first;
        it->second.name = std::make_shared<const std::string>(file);
      }
      FileState& st = it->second;
      if (st.link != link) {
        st.link = link;
        if (link)
          ++linked_files_;
        else
          --linked_files_;
      }
      int64_t mtime = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
      if (st.inode == sb.st_ino && st.mtime_ns == mtime && st.size == sb.st_size) continue;
      st.inode = sb.st_ino;
      st.mtime_ns = mtime;
      st.size = sb.st_size;
      forget(file, st);
      to_load.push_back({&it->first, &st, &decoded[file]});
      changed = true;
    }
    // Reading and decoding a file touches only its own state: the files are read on a few
    // threads at once (a directory of a whole cluster's objects is most of a start), then
    // learnt in name order. Forgetting every old file before learning any new one is what
    // learning each right after its forgetting was: each only adds or drops its own name.
    load_files(to_load, scratch);
    for (const auto& l : to_load) {
      learn(*l.state);
      for (const auto& e : l.state->errors) {
        spdlog::error("manifest {}: {}; keeping its last good objects", *l.path, e);
        error_count_.fetch_add(1);
        if (metrics_->file_errors) metrics_->file_errors->Increment();
      }
    }
    if (!changed) return;  // an event for a file that is not a manifest, or no real change

    // Owners of the touched objects: the last file in name order that defines each (null:
    // no file does any more).
    for (auto& [key, d] : touched) {
      d->next_owner = d->files.empty() ? nullptr : d->files.back();
      if (d->files.size() > 1) {
        const std::string& file = *d->next_owner;
        for (const auto& other : d->files)
          if (*other != file && decoded.count(*other))
            spdlog::warn("manifest {}: {} {} is also defined in {}; using that one", *other,
                         model::to_string(key->first), key->second, file);
      }
    }
    auto owned_by = [&](const Key& key, const std::string& file) {
      auto it = objects_.find(key);
      if (it == objects_.end() || it->second.scan != scan) return false;
      const auto& owner = it->second.next_owner;
      return owner && *owner == file;
    };
    // An object whose owner is now a file whose version of it was not decoded in this scan
    // (the file that won before dropped it): that file is decoded again.
    for (auto& [key, d] : touched) {
      if (!d->next_owner || !d->owner || *d->owner == *d->next_owner) continue;
      const std::string& file = *d->next_owner;
      auto have = decoded.find(file);
      bool present = have != decoded.end() &&
                     std::any_of(have->second.begin(), have->second.end(),
                                 [&k = *key](const auto& kv) { return kv.first == k; });
      if (!present) {
        Decoded again;
        load_file(file, files_[file], true, again, scratch);
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
      for (const auto& [key, d] : touched) {
        if (d->next_owner || !d->owner) continue;
        model::Remove r;
        r.kind = key->first;
        if (key->first == ObjectKind::kNode) {
          r.key = {"", key->second};
        } else {
          auto slash = key->second.find('/');
          r.key = {key->second.substr(0, slash), key->second.substr(slash + 1)};
        }
        batch.removes.push_back(std::move(r));
      }
      ev.change = std::move(batch);
    }
    std::vector<Key> unused;  // objects no file defines any more
    for (auto& [key, d] : touched) {
      d->owner = std::move(d->next_owner);
      d->next_owner = nullptr;
      if (!d->owner && d->files.empty()) unused.push_back(*key);
    }
    for (const auto& key : unused) objects_.erase(key);
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
