#include "drain/watermark.h"

#include <algorithm>

namespace endpointd::drain {

uint64_t member_hash(std::string_view node) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : node) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  h += 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

Tree::Tree(std::vector<std::string> members, size_t fan_in) : fan_in_(std::max<size_t>(2, fan_in)) {
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  std::vector<std::pair<uint64_t, std::string>> keyed;
  keyed.reserve(members.size());
  for (auto& m : members) keyed.emplace_back(member_hash(m), std::move(m));
  std::sort(keyed.begin(), keyed.end());
  order_.reserve(keyed.size());
  for (auto& [h, name] : keyed) {
    pos_.emplace(name, order_.size());
    coverage_.add(name);
    order_.push_back(std::move(name));
  }
}

const std::string* Tree::parent(std::string_view node) const {
  auto it = pos_.find(node);
  if (it == pos_.end() || it->second == 0) return nullptr;
  return &order_[(it->second - 1) / fan_in_];
}

std::vector<std::string> Tree::children(std::string_view node) const {
  std::vector<std::string> out;
  auto it = pos_.find(node);
  if (it == pos_.end()) return out;
  size_t first = it->second * fan_in_ + 1;
  for (size_t i = first; i < first + fan_in_ && i < order_.size(); ++i) out.push_back(order_[i]);
  return out;
}

Coverage Tree::subtree(std::string_view node) const {
  Coverage c;
  auto it = pos_.find(node);
  if (it == pos_.end()) return c;
  // A heap's subtree is one run of positions per level: [lo, hi] → [lo·f+1, hi·f+f].
  size_t lo = it->second, hi = it->second;
  while (lo < order_.size()) {
    for (size_t i = lo; i <= hi && i < order_.size(); ++i) c.add(order_[i]);
    lo = lo * fan_in_ + 1;
    hi = hi * fan_in_ + fan_in_;
  }
  return c;
}

std::vector<std::string> Tree::ancestors(std::string_view node) const {
  std::vector<std::string> out;
  auto it = pos_.find(node);
  if (it == pos_.end()) return out;
  for (size_t i = it->second; i > 0;) {
    i = (i - 1) / fan_in_;
    out.push_back(order_[i]);
  }
  return out;
}

const std::string& Tree::root() const {
  static const std::string kNone;
  return order_.empty() ? kNone : order_.front();
}

size_t Tree::depth() const {
  size_t levels = 0;
  size_t covered = 0;
  size_t width = 1;
  while (covered < order_.size()) {
    covered += width;
    width *= fan_in_;
    ++levels;
  }
  return levels;
}

}  // namespace endpointd::drain
