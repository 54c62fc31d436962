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

  // Re-reads changed files and posts the full state; what the watch thread does on a change.
  void rescan();

  // Errors of the latest read of each file that has one (for /debug/state and tests).
  std::vector<ManifestError> errors() const;
  uint64_t error_count() const { return error_count_.load(); }
  uint64_t reloads() const { return reloads_.load(); }

 private:
  struct FileState;
  struct Metrics;
  void run();
  using Key = std::pair<model::ObjectKind, std::string>;
  using Decoded = std::vector<std::pair<Key, model::Object>>;
  // Re-reads one file: decodes the objects whose text changed (all of them with `force`).
  void load_file(const std::filesystem::path& path, FileState& st, bool force, Decoded& out);

  std::filesystem::path dir_;
  Post post_;
  std::unique_ptr<Metrics> metrics_;
  mutable std::mutex mu_;  // guards files_ (read by errors())
  std::map<std::string, FileState> files_;
  // Which file each object comes from (the last file, in name order, that defines it): the
  // file's name, shared with its FileState rather than a copy per object.
  std::map<Key, std::shared_ptr<const std::string>> owners_;
  // Every file that defines each object, in name order (the last one owns it). Kept up to
  // date file by file, so that a change costs what the changed files hold, not the directory.
  std::map<Key, std::set<std::string>> definers_;
  int inotify_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> error_count_{0};
  std::atomic<uint64_t> reloads_{0};
};

}  // namespace endpointd::watcher
