// This agent's own watermarks from the acknowledgement board.
#include "drain/local_marks.h"

#include <algorithm>
#include <set>

#include "model/routing.h"

namespace endpointd::drain {

namespace {

// Whether an answer `e` published as carrying `ip` is still cacheable at `now` (a DNS answer
// carries the address, not the pod: it counts for whoever is there); lowers `*expires` to when
// it stops being.
bool answer_cached(const pipeline::AckBoard::Entry& e, const model::IpAddr& ip,
                   std::chrono::steady_clock::time_point now,
                   std::chrono::steady_clock::time_point* expires) {
  if (!e.answers) return false;
  auto exp = e.answers->expiry(ip);
  if (!exp || *exp <= now) return false;
  if (expires) *expires = std::min(*expires, *exp);
  return true;
}

}  // namespace

bool consumer_routes(const pipeline::AckBoard::Entry& e, const model::IpAddr& ip,
                     const std::string& node, std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::time_point* expires) {
  // A terminating endpoint is at most a fallback, which topology hints never narrow, so the
  // node's zone does not change the answer.
  if (!e.snapshot || model::routes_to(e.view, *e.snapshot, ip, {node, {}})) return true;
  return answer_cached(e, ip, now, expires);
}

bool names_pod(const model::MergedEndpoint& e, const std::string& uid) {
  return uid.empty() || !e.target_ref || e.target_ref->uid.empty() || e.target_ref->uid == uid;
}

bool consumer_routes(const pipeline::AckBoard::Entry& e, const model::IpAddr& ip,
                     const std::string& uid, const std::string& node,
                     std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::time_point* expires) {
  if (uid.empty()) return consumer_routes(e, ip, node, now, expires);
  if (!e.snapshot || !e.snapshot->synced) return true;
  for (const auto& st : e.snapshot->services) {
    const model::MergedEndpoint* ep = st->find(ip);
    if (ep && names_pod(*ep, uid) && model::routes_to(e.view, *st, ip, {node, {}})) return true;
  }
  return answer_cached(e, ip, now, expires);
}

void LocalMarks::snapshot(const model::SnapshotPtr& snap, const std::string& node) {
  // Only the services that changed are looked at again.
  model::Delta delta = model::diff(last_.get(), *snap);
  for (const auto& k : delta.removed) fallback_by_service_.erase(k);
  for (const auto* keys : {&delta.added, &delta.changed}) {
    for (const auto& k : *keys) {
      fallback_by_service_.erase(k);
      const model::ServiceState* st = snap->find(k);
      if (!st) continue;
      std::vector<model::IpAddr> routed;
      for (const auto& ep : st->endpoints) {
        if (!ep.conditions.terminating) continue;
        if (model::routes_to(model::RouteView::kFeed, *st, ep.address, {}) ||
            model::routes_to(model::RouteView::kDataplane, *st, ep.address, {node, {}}))
          routed.push_back(ep.address);
      }
      if (!routed.empty()) fallback_by_service_.emplace(k, std::move(routed));
    }
  }
  last_ = snap;
  Seen seen{snap->generation, snap->slice_revision, {}};
  for (const auto& [k, ips] : fallback_by_service_)
    seen.fallback.insert(seen.fallback.end(), ips.begin(), ips.end());
  if (revisions_.empty() || revisions_.back().revision != seen.revision ||
      revisions_.back().generation < seen.generation || revisions_.back().fallback != seen.fallback)
    revisions_.push_back(std::move(seen));
  if (revisions_.size() > 4096) revisions_.pop_front();
}

uint64_t LocalMarks::revision_at(uint64_t generation) const {
  uint64_t rev = 0;
  for (const auto& s : revisions_) {
    if (s.generation > generation) break;
    rev = s.revision;
  }
  return rev;
}

LocalMarks::Marks LocalMarks::update(const std::vector<pipeline::AckBoard::Entry>& entries,
                                     const std::string& node, TimePoint now, TimePoint* next) {
  Marks m;
  if (revisions_.empty()) return m;
  uint64_t applied = revisions_.back().generation;
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
  while (revisions_.size() > 1 && revisions_[1].generation <= oldest) revisions_.pop_front();
  // Some consumer's state may be any of the snapshots from the oldest applied on (a feed
  // subscriber may have accepted one in between): a fallback in any of them counts. Revision 0:
  // sorted first, never cut from a report.
  std::set<model::IpAddr> fallback;
  for (auto it = revisions_.rbegin(); it != revisions_.rend(); ++it) {
    fallback.insert(it->fallback.begin(), it->fallback.end());
    if (it->generation <= applied) break;  // the oldest state a consumer may hold
  }
  // A holdout's own state (a proxy that stopped acknowledging) may route to one by the
  // fallback too, whatever its revision.
  std::map<model::SnapshotPtr, std::vector<model::IpAddr>> scanned;
  for (const auto& e : entries) {
    for (const auto& h : e.holdouts) {
      if (!h.snapshot) continue;
      auto it = holdout_fallback_.find(h.snapshot);
      if (it == holdout_fallback_.end()) {
        std::vector<model::IpAddr> routed;
        for (const auto& st : h.snapshot->services)
          for (const auto& ep : st->endpoints)
            if (ep.conditions.terminating && model::routes_to(e.view, *st, ep.address, {node, {}}))
              routed.push_back(ep.address);
        it = holdout_fallback_.emplace(h.snapshot, std::move(routed)).first;
      }
      fallback.insert(it->second.begin(), it->second.end());
      scanned.emplace(it->first, it->second);
    }
  }
  holdout_fallback_ = std::move(scanned);
  std::vector<std::pair<std::string, std::vector<pipeline::AckBoard::Holdout>>> clients;
  for (const auto& e : entries)
    if (!e.holdouts.empty()) clients.emplace_back(e.consumer, e.holdouts);
  if (fallback != last_fallback_ || clients != last_clients_ || node != last_node_) {
    std::vector<Holdout> raw;
    for (const auto& ip : fallback)
      raw.push_back(
          Holdout{node, fallback_client(ip), 0, "routes to it by the terminating fallback"});
    for (const auto& [consumer, held] : clients)
      for (const auto& h : held)
        raw.push_back(Holdout{node, consumer + "/" + h.client,
                              h.snapshot ? h.snapshot->slice_revision : h.revision, h.reason});
    last_holdouts_ = HoldoutList::of(std::move(raw));
    last_fallback_ = fallback;
    last_node_ = node;
    last_clients_ = std::move(clients);
  }
  m.holdouts = last_holdouts_;
  m.fallback = std::move(fallback);
  return m;
}

LocalRemoval local_removal(const std::vector<pipeline::AckBoard::Entry>& entries,
                           const model::IpAddr& ip, const std::string& node,
                           std::chrono::steady_clock::time_point now, uint64_t revision) {
  LocalRemoval r;
  r.removed = true;
  for (const auto& e : entries) {
    LocalRemoval::Consumer c;
    c.name = e.consumer;
    c.generation = e.generation();
    // Not applied the removal yet: its state (the oldest its clients hold, for the feed) may
    // not even hold the endpoint, while a client already holds a newer state that routes to it.
    c.routes = consumer_routes(e, ip, node, now) ||
               (revision != 0 && (!e.snapshot || e.snapshot->slice_revision < revision));
    if (c.routes) r.removed = false;
    r.consumers.push_back(c);
    // A client that stopped holding this consumer back but whose last accepted state routes
    // to it, or whose state is not known: not removed here (the asking node's drain then says
    // unconfirmed at its deadline).
    for (const auto& h : e.holdouts) {
      if (h.snapshot && !model::routes_to(e.view, *h.snapshot, ip, {node, {}})) continue;
      r.removed = false;
      r.consumers.push_back(
          {e.consumer + "/" + h.client, h.snapshot ? h.snapshot->generation : 0, true});
    }
  }
  return r;
}

}  // namespace endpointd::drain
