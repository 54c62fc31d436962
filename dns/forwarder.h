// Forwarding of names outside the cluster zone to upstream servers through c-ares, with a
// bounded cache that respects the records' TTLs (positive and negative) and a limit on the
// number of queries in flight (beyond it the caller sheds with REFUSED).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dns/message.h"
#include "dns/metrics.h"
#include "model/result.h"

namespace endpointd::dns {

struct ForwarderOptions {
  // "ADDR", "ADDR:PORT" or "[V6]:PORT". Empty: the servers of /etc/resolv.conf.
  std::vector<std::string> upstreams;
  std::chrono::milliseconds timeout{2000};  // per try
  int tries = 2;
  size_t max_inflight = 1024;
  size_t cache_entries = 10000;
  // The longest an answer stays cached: a positive one (CoreDNS's cache `success` TTL), a
  // negative one, NXDOMAIN or NODATA (its `denial` TTL). The TTLs in the replies, the first
  // included, are capped with it, as CoreDNS's cache caps them.
  uint32_t cache_max_ttl = 3600;
  uint32_t cache_denial_max_ttl = 1800;
  std::function<std::chrono::steady_clock::time_point()> now = [] {
    return std::chrono::steady_clock::now();
  };
};

class Forwarder {
 public:
  // Called once with the reply (the client's ID restored), on the forwarder's thread.
  using Done = std::function<void(std::span<const uint8_t> reply)>;
  using Clock = std::chrono::steady_clock;

  explicit Forwarder(ForwarderOptions opts);
  ~Forwarder();
  Forwarder(const Forwarder&) = delete;
  Forwarder& operator=(const Forwarder&) = delete;

  // Sets up the c-ares channel and starts the thread. An error message on failure.
  // Before start(); may stay null.
  void set_metrics(Metrics* m) { metrics_ = m; }
  Status start();
  void stop();

  // Any thread. Writes the cached reply for `q` (ID, question case and TTLs adjusted) and
  // returns its size; 0 on a miss.
  size_t cached(const Query& q, uint8_t* out, size_t cap);
  // Any thread. False when the concurrency limit is reached: the caller answers REFUSED.
  bool forward(const Query& q, Done done);

  uint64_t cache_hits() const { return cache_hits_.load(); }
  uint64_t cache_misses() const { return cache_misses_.load(); }
  uint64_t errors() const { return errors_.load(); }  // timeouts and unreachable upstreams
  uint64_t shed() const { return shed_.load(); }
  // Unexpired entries dropped because the cache was full (the oldest stored goes first).
  uint64_t evictions() const { return evictions_.load(); }
  size_t cache_size() const;

 private:
  struct Request;
  struct CacheEntry {
    std::vector<uint8_t> msg;
    std::vector<std::pair<size_t, uint32_t>> ttls;  // offset, TTL as received
    Clock::time_point stored, expires;
    std::list<std::string>::iterator age;  // its place in age_
  };
  static void on_answer(void* arg, int status, int timeouts, unsigned char* abuf, int alen);
  void run();
  void finish(Request* r, int status, std::span<const uint8_t> reply);
  // Caches `reply` (when it may be) and caps its TTLs at the time it stays cached.
  void store(const std::string& key, std::span<uint8_t> reply);
  std::string upstream_label() const;

  ForwarderOptions opts_;
  Metrics* metrics_ = nullptr;
  struct Channel;
  std::unique_ptr<Channel> channel_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> inflight_{0};

  std::mutex queue_mu_;
  std::deque<std::unique_ptr<Request>> queue_;

  mutable std::mutex cache_mu_;
  std::unordered_map<std::string, CacheEntry> cache_;
  std::list<std::string> age_;  // the cache's keys, oldest stored first: eviction is O(1)

  std::atomic<uint64_t> cache_hits_{0}, cache_misses_{0}, errors_{0}, shed_{0}, evictions_{0};
};

// The cache key of a query: its lower-case name, type and whether it carried EDNS.
std::string cache_key(const Query& q);

}  // namespace endpointd::dns
