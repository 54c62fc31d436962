// ServiceList: a snapshot's services, sorted by key, held in shared chunks. The next snapshot
// shares every chunk that holds no changed service, so building it and diffing it against the
// previous one cost what changed, not the size of the cluster.
#pragma once

#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "model/objects.h"

namespace endpointd::model {

struct ServiceState;
using ServiceStatePtr = std::shared_ptr<const ServiceState>;

class ServiceList {
 public:
  // Chunks hold up to 2 * kChunk services; a rebuilt chunk is split back to kChunk pieces.
  static constexpr size_t kChunk = 64;
  struct Chunk {
    std::vector<ServiceStatePtr> items;  // sorted by key, never empty
  };
  using ChunkPtr = std::shared_ptr<const Chunk>;

  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = ServiceStatePtr;
    using difference_type = std::ptrdiff_t;
    using pointer = const ServiceStatePtr*;
    using reference = const ServiceStatePtr&;
    const_iterator() = default;
    reference operator*() const { return (*chunks_)[chunk_]->items[item_]; }
    pointer operator->() const { return &**this; }
    const_iterator& operator++() {
      if (++item_ == (*chunks_)[chunk_]->items.size()) {
        ++chunk_;
        item_ = 0;
      }
      return *this;
    }
    const_iterator operator++(int) {
      auto copy = *this;
      ++*this;
      return copy;
    }
    friend bool operator==(const const_iterator& a, const const_iterator& b) {
      return a.chunk_ == b.chunk_ && a.item_ == b.item_;
    }

   private:
    friend class ServiceList;
    const_iterator(const std::vector<ChunkPtr>* c, size_t chunk, size_t item)
        : chunks_(c), chunk_(chunk), item_(item) {}
    const std::vector<ChunkPtr>* chunks_ = nullptr;
    size_t chunk_ = 0;
    size_t item_ = 0;
  };
  using iterator = const_iterator;

  ServiceList() = default;
  // From services in any order (sorted here). Keys must be unique.
  ServiceList(std::vector<ServiceStatePtr> services);  // NOLINT: implicit on purpose
  ServiceList(std::initializer_list<ServiceStatePtr> services)
      : ServiceList(std::vector<ServiceStatePtr>(services)) {}

  const_iterator begin() const { return {&chunks_, 0, 0}; }
  const_iterator end() const { return {&chunks_, chunks_.size(), 0}; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const ServiceStatePtr* find(const ServiceKey& key) const;
  const std::vector<ChunkPtr>& chunks() const { return chunks_; }

  // The list with `changes` applied: each (key, state) replaces or inserts that service, a
  // null state removes it. `changes` must be sorted by key, one entry per key. Chunks
  // without a change are shared with this list.
  ServiceList with(const std::vector<std::pair<ServiceKey, ServiceStatePtr>>& changes) const;

 private:
  std::vector<ChunkPtr> chunks_;
  size_t size_ = 0;
};

}  // namespace endpointd::model
