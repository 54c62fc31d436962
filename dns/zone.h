// The cluster zone of one Snapshot: every answer encoded once, when the snapshot arrives (on
// the sink's thread), so that serving a query is a hash lookup and a few memcpys.
//
// A zone is built from blocks of names that are shared between generations: the names of one
// service, one reverse (PTR) name, one pod name. The ZoneBuilder keeps them between snapshots
// and, for a Delta, rebuilds only the blocks of the services that changed; the new zone's
// index copies only the shards those names hash into.
//
// Building lives in zone_build.cc (a block's records encoded in zone_block.cc), answering a
// lookup in zone_lookup.cc.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dns/message.h"
#include "model/snapshot.h"

namespace endpointd::dns {

enum class PodMode : uint8_t { kDisabled, kInsecure, kVerified };
std::optional<PodMode> parse_pod_mode(std::string_view s);

struct ZoneOptions {
  std::string zone = "cluster.local";
  uint32_t ttl = 5;           // of every positive answer
  uint32_t negative_ttl = 5;  // the SOA's minimum: how long NXDOMAIN/NODATA may be cached
  PodMode pod_mode = PodMode::kDisabled;
  // CoreDNS's `loadbalance`: A and AAAA answers of several records come rotated, a record
  // further each reply, so clients that take the first address spread over all of them.
  bool loadbalance = false;
  // CoreDNS's `endpoint_pod_names`: a headless endpoint without a hostname is named by the pod
  // it targets (when that name is a DNS label), not by its dashed address.
  bool endpoint_pod_names = false;
  // CoreDNS's `noendpoints`: no records from endpoints. Headless services and their endpoint
  // names answer NXDOMAIN; services with a cluster IP answer as always.
  bool no_endpoints = false;
  // CoreDNS's `ignore empty_service`: a service with a cluster IP and no ready endpoint answers
  // NXDOMAIN, so a client's search list moves on to its next domain.
  bool ignore_empty_service = false;
  // CoreDNS's `namespaces`: only these namespaces' names exist (services, their endpoints,
  // pods); empty: every namespace.
  std::vector<std::string> namespaces;
  // PTR names for the services' and endpoints' addresses (in-addr.arpa, ip6.arpa). An
  // additional zone leaves them to the first, as CoreDNS answers reverse lookups with names
  // of its primary zone.
  bool reverse = true;
  // The agent's other zones: an ExternalName naming something in one of them is answered
  // with the CNAME alone, never asked of the upstream.
  std::vector<std::string> other_zones;

  bool exposes(std::string_view ns) const {
    return namespaces.empty() ||
           std::find(namespaces.begin(), namespaces.end(), ns) != namespaces.end();
  }
};

// One pre-encoded answer: the records that follow the question, for one name and type.
// Compression pointers in `body` assume the question name starts at offset 12 and has the
// length of the name it was built for, which holds for every case variant of that name.
// Its bytes live in the NameBlock that owns it.
struct RecordSet {
  std::span<const uint8_t> body;
  uint16_t ancount = 0, nscount = 0, arcount = 0;
  uint32_t answer_bytes = 0;  // of the answer and authority sections: additional may be cut
  // The size of each answer record when the set is two or more A or AAAA records and nothing
  // else (each owned by a pointer to the question name): a reply may rotate them. Else 0.
  uint16_t rotate_rr = 0;
  std::span<const model::IpAddr> addresses;  // the addresses this answer hands out
  // steady_clock nanoseconds of the newest reply that carried this set; written by the server
  // workers only when it moves forward, read by drain support. A set outlives the zones that
  // share it, so its record carries over from one generation to the next.
  mutable std::atomic<int64_t> last_served_ns{0};
};

struct TypedSet {
  uint16_t type = 0;
  const RecordSet* set = nullptr;
};

// One owner name and its record sets (none: an empty non-terminal, which answers NODATA).
struct ZoneNode {
  std::string_view name;           // wire form, lower case
  std::span<const TypedSet> sets;  // sorted by type
  // ExternalName: the CNAME answers every type without a set of its own; an in-zone target's
  // A and AAAA records come in sets of the type, each the CNAME and then the target's records.
  bool cname = false;
  // Negative answers carry the SOA owned by the last `soa_suffix` bytes of the name: the
  // cluster zone's apex, or in-addr.arpa / ip6.arpa for reverse names.
  uint8_t soa_suffix = 0;
  // ExternalName to a name outside the zone: its wire form (as the service gives it) follows
  // `name` in the block's bytes; A and AAAA answers are completed through the forwarder with
  // the target's records, as CoreDNS asks its upstream.
  uint8_t chase_len = 0;
  std::string_view chase_target() const { return {name.data() + name.size(), chase_len}; }
};

// Names built together, immutable once built, shared by every zone that holds them.
class NameBlock {
 public:
  std::span<const ZoneNode> nodes() const { return nodes_; }
  std::span<const RecordSet> sets() const { return {sets_.get(), set_count_}; }

 private:
  friend class BlockWriter;
  std::vector<uint8_t> bytes_;  // names and answer bodies
  std::vector<model::IpAddr> addresses_;
  std::unique_ptr<RecordSet[]> sets_;
  size_t set_count_ = 0;
  std::vector<TypedSet> typed_;
  std::vector<ZoneNode> nodes_;
};
using BlockPtr = std::shared_ptr<const NameBlock>;

// Replies synthesised for pod names in insecure mode carry any address a client asks for;
// they are remembered here without allocation: each address stamps two slots chosen by its
// hash, and the older of its two slots bounds its newest reply from above (collisions only
// make the bound later, never earlier). Shared by every zone of a sink.
class AnswerLog {
 public:
  static constexpr size_t kSlots = size_t{1} << 14;
  AnswerLog() : slots_(new std::atomic<int64_t>[kSlots]) {
    for (size_t i = 0; i < kSlots; ++i) slots_[i].store(0, std::memory_order_relaxed);
  }
  void stamp(const model::IpAddr& a, int64_t now_ns) const;
  // 0 when no reply carried `a` (or any address sharing both its slots).
  int64_t last(const model::IpAddr& a) const;

 private:
  std::unique_ptr<std::atomic<int64_t>[]> slots_;
};

class Zone {
 public:
  enum class Kind : uint8_t { kAnswer, kNoData, kNxDomain, kNotSynced, kNotOurs, kPodAddress };
  struct Lookup {
    Kind kind = Kind::kNotOurs;
    const RecordSet* set = nullptr;
    bool soa = true;            // negative answers: add the SOA
    uint8_t soa_at = 0;         // where the SOA's owner starts inside the question name
    model::IpAddr pod_address;  // kPodAddress (insecure pod mode, name not pre-encoded)
    // The zone that answered when it is not the one asked: an additional zone (its SOA, TTL
    // and pod log are the ones to use). Null: the zone asked.
    const Zone* zone = nullptr;
    // An A or AAAA answer that is an ExternalName's CNAME to a name outside the zone: that
    // name (wire form), whose records of the type asked the server may add from upstream.
    std::string_view chase;
  };

  // A zone built whole from `snap` (a fresh ZoneBuilder; tests and one-off uses).
  static std::shared_ptr<const Zone> build(const model::Snapshot& snap, const ZoneOptions& opts);
  // The zone before the first sync: every name inside it answers SERVFAIL.
  static std::shared_ptr<const Zone> unsynced(const ZoneOptions& opts);
  // `first` answering for `also` too (CoreDNS's additional zones): a name outside `first`
  // is looked up in the zone of `also` it falls in. Shares first's index.
  static std::shared_ptr<const Zone> with_also(const std::shared_ptr<const Zone>& first,
                                               std::vector<std::shared_ptr<const Zone>> also);

  // `qname_lower` in wire form, lower case. No allocation, no lock.
  Lookup lookup(const WireName& qname_lower, uint16_t qtype) const;
  const ZoneNode* find(std::string_view name_lower) const;
  // For a worker that looks up a batch of names: prefetch(h, stage) for stage 0, 1, 2, 3 in
  // turn, each over the whole batch, starts loading what the next stage (and at last
  // lookup()) reads of the index, so that the batch's cache misses overlap. `h`: name_hash().
  void prefetch(uint64_t name_hash, int stage) const;
  Lookup lookup(const WireName& qname_lower, uint16_t qtype, uint64_t name_hash) const;

  const WireName& apex() const { return apex_; }
  std::span<const uint8_t> soa_tail() const { return soa_tail_; }  // type..rdata of the SOA
  uint32_t ttl() const { return opts_.ttl; }
  bool loadbalance() const { return opts_.loadbalance; }
  uint64_t generation() const { return generation_; }
  bool synced() const { return synced_; }
  size_t name_count() const { return name_count_; }
  const ZoneOptions& options() const { return opts_; }
  const AnswerLog* pod_answers() const { return pod_answers_.get(); }

  // Every name, in text form, sorted (tests and debugging; not for the hot path).
  std::vector<std::string> names() const;

  // Whether `qname_lower` is the zone apex or below it.
  bool in_zone(const WireName& qname_lower) const;

  // The index: names hashed into a fixed number of shards, each a small open-addressing table
  // shared with the previous zone unless one of its names changed.
  static constexpr size_t kShardBits = 10;
  static constexpr size_t kShards = size_t{1} << kShardBits;
  struct Entry {
    uint64_t hash = 0;
    std::shared_ptr<const ZoneNode> node;  // aliases the node's NameBlock
  };
  struct Shard {
    std::vector<Entry> slots;  // a power of two, at most half full
    size_t count = 0;
  };

 private:
  friend class ZoneBuilder;
  const ZoneNode* find_hashed(std::string_view name_lower, uint64_t hash) const;

  ZoneOptions opts_;
  WireName apex_;
  WireName pod_suffix_;  // "pod.<zone>"
  std::vector<uint8_t> soa_tail_;
  uint64_t generation_ = 0;
  bool synced_ = false;
  size_t name_count_ = 0;
  std::vector<std::shared_ptr<const Shard>> shards_ =
      std::vector<std::shared_ptr<const Shard>>(kShards);
  std::shared_ptr<const AnswerLog> pod_answers_;
  std::vector<std::shared_ptr<const Zone>> also_;  // additional zones (with_also)
};

using ZonePtr = std::shared_ptr<const Zone>;

uint64_t name_hash(std::string_view wire);
// Whether `name` is `apex` or below it (label boundaries; both lower case).
bool name_under(const WireName& name, const WireName& apex);

// Builds zones from snapshots, keeping the blocks of the previous one: apply() rebuilds the
// names of the services a Delta lists (and the reverse and pod names they own) and shares
// everything else. One thread calls apply(); the drain queries may come from another thread
// only when the caller serialises them with apply() (the DnsSink holds a mutex).
class ZoneBuilder {
 public:
  explicit ZoneBuilder(ZoneOptions opts);
  ~ZoneBuilder();
  ZoneBuilder(const ZoneBuilder&) = delete;
  ZoneBuilder& operator=(const ZoneBuilder&) = delete;

  // The zone of `snap`. Incremental when `delta` leads from the snapshot applied last to
  // `snap`; otherwise the builder diffs the two snapshots itself (cheap: unchanged services
  // are shared pointers), and builds everything when there is no previous snapshot.
  ZonePtr apply(const model::SnapshotPtr& snap, const model::Delta& delta);
  ZonePtr apply(const model::SnapshotPtr& snap) { return apply(snap, model::Delta{}); }
  // The zone of the snapshot applied last, built whole again under `opts` (a reloaded
  // configuration). Drain support keeps what it knew of the replies already sent.
  ZonePtr reconfigure(ZoneOptions opts);
  ZonePtr current() const;

  struct Stats {
    bool full = false;
    size_t services = 0;  // service blocks built or removed
    size_t names = 0;     // index entries inserted or removed
    size_t shards = 0;    // index shards copied
  };
  const Stats& last_stats() const;

  // Drain support. The newest reply (steady_clock ns) that carried `a`: in the current zone,
  // in blocks that left it (while a worker may still serve an older zone, and for the TTL
  // after), and in the insecure-mode pod replies. nullopt when none did.
  std::optional<int64_t> last_served_ns(const model::IpAddr& a) const;
  // Every address a reply carried, newer than `horizon_ns`, from blocks that left the zone
  // (departed and retired): into `out` as the newest reply's time, the larger kept.
  void left_zone_stamps(int64_t horizon_ns, std::map<model::IpAddr, int64_t>& out) const;
  // The newest reply that carried `a` from the current zone or the insecure-mode pod replies
  // (what left_zone_stamps does not see); 0 when none did. No scan of retired blocks.
  int64_t live_served_ns(const model::IpAddr& a) const;
  // Folds blocks that no zone holds any more into the departed record and forgets departed
  // addresses whose last reply is older than `horizon_ns`.
  void harvest(int64_t horizon_ns);
  size_t retired_blocks() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace endpointd::dns
