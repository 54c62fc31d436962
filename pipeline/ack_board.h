// The acknowledgement board: per consumer, the newest snapshot whose state that consumer's
// clients see. drain/ asks it whether an endpoint is still routable anywhere.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/routing.h"
#include "model/snapshot.h"

namespace endpointd::pipeline {

// What a consumer whose answers clients cache (DNS) has handed out: for each address an answer
// carried that may still be cached, when the last such answer stops being cacheable. Published
// by the consumer as data (a new map replaces the old), so a reader never calls into it.
struct AnswerExpiry {
  using Clock = std::chrono::steady_clock;
  std::map<model::IpAddr, Clock::time_point> until;
  Clock::time_point as_of{};  // when the consumer made it
  std::optional<Clock::time_point> expiry(const model::IpAddr& a) const {
    auto it = until.find(a);
    if (it == until.end()) return std::nullopt;
    return it->second;
  }
};

class AckBoard {
 public:
  using Clock = std::chrono::steady_clock;
  // A client of a consumer (a feed subscriber) that no longer holds the consumer's applied(g)
  // back — it disconnected or left a response unacknowledged past its grace — but whose last
  // accepted state may still route: `snapshot` is that state. drain/ never counts a removal
  // as confirmed while a holdout's snapshot routes to the endpoint; it names the holdout.
  struct Holdout {
    std::string client;  // the subscriber's identity (xDS node id, feed client name)
    model::SnapshotPtr snapshot;
    Clock::time_point since{};  // when it stopped holding
    std::string reason;         // "disconnected", "unacknowledged", "nacking"
    // With no snapshot (a subscriber known from before this agent's restart, whose state was
    // not kept): the EndpointSlice revision of its last accepted state, 0 if unknown. drain/
    // then takes it as routing to every endpoint terminating since.
    uint64_t revision = 0;
    bool operator==(const Holdout&) const = default;
  };
  struct Entry {
    std::string consumer;
    model::RouteView view = model::RouteView::kDataplane;  // how it routes what it applied
    model::SnapshotPtr snapshot;                           // null until the first apply
    Clock::time_point applied_at{};
    std::vector<Holdout> holdouts;
    // How long a state stays in clients' caches after the consumer moved past it (DNS: the
    // answers' TTL, as the DNS sink applies it now); zero for consumers without caches.
    std::chrono::milliseconds cache_ttl{0};
    // Its answers' expiry by address (null: a consumer without cached answers, or none yet).
    std::shared_ptr<const AnswerExpiry> answers;
    uint64_t generation() const { return snapshot ? snapshot->generation : 0; }
  };

  // A consumer counts from registration on: until it applies something, it holds back
  // every question about removal.
  void add(const std::string& consumer, model::RouteView view = model::RouteView::kDataplane);
  void remove(const std::string& consumer);
  void applied(const std::string& consumer, model::SnapshotPtr snap);
  // The consumer's holdouts now (replaces the last list).
  void set_holdouts(const std::string& consumer, std::vector<Holdout> holdouts);
  // The consumer's cache TTL now (the DNS sink at start and at every reload).
  void set_cache_ttl(const std::string& consumer, std::chrono::milliseconds ttl);
  // The consumer's answers' expiry now (replaces the last; observers are told).
  void set_answers(const std::string& consumer, std::shared_ptr<const AnswerExpiry> answers);

  std::vector<Entry> entries() const;
  // The oldest generation applied by every consumer (0 when one has applied nothing).
  uint64_t min_generation() const;
  // Waits until every consumer applied at least generation g, or the deadline passes.
  bool wait_all(uint64_t g, Clock::time_point deadline) const;
  // Called (outside the lock) after every change on the board.
  void on_change(std::function<void()> fn);

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<std::string, Entry> entries_;
  std::vector<std::function<void()>> observers_;
};

}  // namespace endpointd::pipeline
