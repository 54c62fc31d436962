// The manifest-directory source: a directory of Kubernetes objects (*.yaml, *.yml, *.json;
// multi-document YAML and `kind: List`), watched with inotify and re-read when a file is
// written, replaced by rename, or removed. Decoded by the same code as API objects.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/result.h"

namespace prometheus {
class Registry;
}

namespace endpointd::watcher {

struct ManifestError {
  std::string file;
  std::string reason;
};

class ManifestSource {
 public:
  using Post = std::function<void(model::Event)>;

  ManifestSource(std::filesystem::path dir, Post post, prometheus::Registry* registry);
  ~ManifestSource();
  ManifestSource(const ManifestSource&) = delete;
  ManifestSource& operator=(const ManifestSource&) = delete;

  // Reads the directory once (posting the first full state) and starts watching it.
  // An error when the directory cannot be read or watched.
  Status start();
  void stop();

  // Looks at every file again, re-reads the changed ones and posts what changed (the first
  // time: the full state). The watch thread does this when inotify dropped events.
  void rescan();

  // Errors of the latest read of each file that has one (for /debug/state and tests).
  std::vector<ManifestError> errors() const;
  uint64_t error_count() const { return error_count_.load(); }
  uint64_t reloads() const { return reloads_.load(); }
  // Objects handed to the decoder so far (an unchanged object in a changed file is not).
  uint64_t decoded_objects() const { return decoded_objects_.load(); }

 private:
  struct FileState;
  struct Metrics;
  void run();
  // rescan() over the named files of the directory only (null: every file). A named file that
  // is gone, or no longer a regular file, is forgotten.
  void rescan_files(const std::set<std::string>* names);
  using Key = std::pair<model::ObjectKind, std::string>;
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<std::string>{}(k.second) ^ static_cast<size_t>(k.first);
    }
  };
  using Decoded = std::vector<std::pair<Key, model::Object>>;
  // What the files of one scan share: the parser and the buffer a file is read into, grown to
  // the largest file and reused rather than allocated (and faulted in) again per file; freed
  // when the scan ends.
  struct Scratch;
  // Re-reads one file: decodes the objects whose text changed (all of them with `force`).
  void load_file(const std::filesystem::path& path, FileState& st, bool force, Decoded& out,
                 Scratch& scratch);
  // One file to re-read in a scan: its name, its state and where its decoded objects go.
  struct Load {
    const std::string* path;
    FileState* state;
    Decoded* out;
  };
  // load_file() for each (not forced), on up to kMaxLoadThreads threads when there are many.
  static constexpr size_t kMaxLoadThreads = 4;
  void load_files(const std::vector<Load>& files, Scratch& scratch);

  std::filesystem::path dir_;
  Post post_;
  std::unique_ptr<Metrics> metrics_;
  mutable std::mutex mu_;  // guards files_ (read by errors())
  std::map<std::string, FileState> files_;
  // Per object, the files that define it and the one it was posted from. File names are
  // shared with their FileState rather than a copy per object.
  struct Definers {
    // Every file that defines the object, in name order (the last one owns it). Kept up to
    // date file by file, so that a change costs what the changed files hold, not the
    // directory.
    std::vector<std::shared_ptr<const std::string>> files;
    // The file whose version of the object was posted last (null: none, or it was removed).
    std::shared_ptr<const std::string> owner;
    // Within a scan that touched the object (`scan` is that scan's number): its owner after
    // the scan, null when no file defines it any more.
    std::shared_ptr<const std::string> next_owner;
    uint64_t scan = 0;
  };
  // One entry per object, every bookkeeping step of a scan on it: at 100k objects a lookup in
  // a large table is a few cache misses, and separate tables (owners, definers, the scan's
  // touched set and new owners) cost several per object read. Hashed, not ordered: the
  // ordered maps' key comparisons (memcmp) were about 5% of reading the directory.
  std::unordered_map<Key, Definers, KeyHash> objects_;
  uint64_t scans_ = 0;
  int inotify_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> error_count_{0};
  std::atomic<uint64_t> reloads_{0};
  std::atomic<uint64_t> decoded_objects_{0};
  // Known manifests that are symbolic links: while there are any, an event on any other entry
  // of the directory may change what they read.
  std::atomic<size_t> linked_files_{0};
};

}  // namespace endpointd::watcher
