// Chunked service list: binary search over chunk boundaries, copy-on-write per chunk.
#include "model/service_list.h"

#include <algorithm>

#include "model/snapshot.h"

namespace endpointd::model {

namespace {

const ServiceKey& key_of(const ServiceStatePtr& p) {
  return p->key();
}

// Splits sorted items into chunks of kChunk and appends them.
void append_chunks(std::vector<ServiceStatePtr>&& items, std::vector<ServiceList::ChunkPtr>& out) {
  const size_t n = items.size();
  if (n == 0) return;
  if (n <= 2 * ServiceList::kChunk) {
    out.push_back(std::make_shared<const ServiceList::Chunk>(ServiceList::Chunk{std::move(items)}));
    return;
  }
  size_t i = 0;
  while (i < n) {
    size_t end = std::min(n, i + ServiceList::kChunk);
    if (n - end < ServiceList::kChunk / 2) end = n;  // fold a short tail into this piece
    ServiceList::Chunk c;
    c.items.assign(std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(i)),
                   std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(end)));
    out.push_back(std::make_shared<const ServiceList::Chunk>(std::move(c)));
    i = end;
  }
}

}  // namespace

ServiceList::ServiceList(std::vector<ServiceStatePtr> services) {
  std::sort(services.begin(), services.end(),
            [](const ServiceStatePtr& a, const ServiceStatePtr& b) { return a->key() < b->key(); });
  size_ = services.size();
  append_chunks(std::move(services), chunks_);
}

const ServiceStatePtr* ServiceList::find(const ServiceKey& key) const {
  // The last chunk whose first key is <= key.
  auto it = std::upper_bound(
      chunks_.begin(), chunks_.end(), key,
      [](const ServiceKey& k, const ChunkPtr& c) { return k < key_of(c->items.front()); });
  if (it == chunks_.begin()) return nullptr;
  const auto& items = (*(it - 1))->items;
  auto pos =
      std::lower_bound(items.begin(), items.end(), key,
                       [](const ServiceStatePtr& p, const ServiceKey& k) { return p->key() < k; });
  if (pos == items.end() || (*pos)->key() != key) return nullptr;
  return &*pos;
}

ServiceList ServiceList::with(
    const std::vector<std::pair<ServiceKey, ServiceStatePtr>>& changes) const {
  if (changes.empty()) return *this;
  ServiceList out;
  out.chunks_.reserve(chunks_.size() + 1);
  size_t c = 0;  // next change
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const auto& items = chunks_[i]->items;
    // Changes up to the next chunk's first key belong to this chunk (the first chunk also
    // takes those before its own first key).
    size_t end = c;
    if (i + 1 == chunks_.size()) {
      end = changes.size();
    } else {
      const ServiceKey& next_first = key_of(chunks_[i + 1]->items.front());
      while (end < changes.size() && changes[end].first < next_first) ++end;
    }
    if (end == c) {
      out.chunks_.push_back(chunks_[i]);  // untouched: shared
      out.size_ += items.size();
      continue;
    }
    std::vector<ServiceStatePtr> merged;
    merged.reserve(items.size() + (end - c));
    size_t j = 0;
    while (j < items.size() || c < end) {
      if (c == end || (j < items.size() && items[j]->key() < changes[c].first)) {
        merged.push_back(items[j++]);
      } else {
        if (j < items.size() && items[j]->key() == changes[c].first) ++j;  // replaced or removed
        if (changes[c].second) merged.push_back(changes[c].second);
        ++c;
      }
    }
    out.size_ += merged.size();
    append_chunks(std::move(merged), out.chunks_);
  }
  if (chunks_.empty()) {
    std::vector<ServiceStatePtr> merged;
    for (const auto& ch : changes)
      if (ch.second) merged.push_back(ch.second);
    out.size_ = merged.size();
    append_chunks(std::move(merged), out.chunks_);
  }
  return out;
}

}  // namespace endpointd::model
