// This agent's own watermarks from the acknowledgement board.
#include "drain/local_marks.h"

#include <algorithm>

namespace endpointd::drain {

void LocalMarks::snapshot(uint64_t generation, uint64_t revision) {
  if (revisions_.empty() || revisions_.back().second != revision ||
      revisions_.back().first < generation)
    revisions_.emplace_back(generation, revision);
  if (revisions_.size() > 4096) revisions_.pop_front();
}

uint64_t LocalMarks::revision_at(uint64_t generation) const {
  uint64_t rev = 0;
  for (const auto& [gen, r] : revisions_) {
    if (gen > generation) break;
    rev = r;
  }
  return rev;
}

LocalMarks::Marks LocalMarks::update(const std::vector<pipeline::AckBoard::Entry>& entries,
                                     const std::string& node, TimePoint now, TimePoint* next) {
  Marks m;
  if (revisions_.empty()) return m;
  uint64_t applied = revisions_.back().first;
  uint64_t dns_applied = applied;
  for (const auto& e : entries) {
    uint64_t g = e.generation();
    applied = std::min(applied, g);
    if (e.view != model::RouteView::kDns || e.cache_ttl.count() <= 0) {
      dns_applied = std::min(dns_applied, g);
      continue;
    }
    // The newest generation whose predecessors' answers have all expired: the answers of the
    // state before generation k live until k was applied plus the TTL.
    auto& seen = dns_applied_[e.consumer];
    if (g > 0 && (seen.empty() || seen.back().second != g)) seen.emplace_back(e.applied_at, g);
    uint64_t expired = 0;
    while (!seen.empty() && seen.front().first + e.cache_ttl <= now) {
      expired = seen.front().second;
      if (seen.size() == 1 || seen[1].first + e.cache_ttl > now) break;
      seen.pop_front();
    }
    if (!seen.empty() && seen.front().first + e.cache_ttl > now)
      *next = std::min(*next, seen.front().first + e.cache_ttl);
    else if (seen.size() > 1)
      *next = std::min(*next, seen[1].first + e.cache_ttl);
    dns_applied = std::min(dns_applied, expired);
  }
  m.routing = revision_at(applied);
  m.dns = std::min(m.routing, revision_at(dns_applied));
  // Generations below every consumer are no longer needed (keep the one that answers).
  const uint64_t oldest = std::min(applied, dns_applied);
  while (revisions_.size() > 1 && revisions_[1].first <= oldest) revisions_.pop_front();
  for (const auto& e : entries)
    for (const auto& h : e.holdouts)
      m.holdouts.push_back(Holdout{node, e.consumer + "/" + h.client,
                                   h.snapshot ? h.snapshot->slice_revision : 0, h.reason});
  return m;
}

}  // namespace endpointd::drain
