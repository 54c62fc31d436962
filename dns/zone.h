// The cluster zone of one Snapshot: every answer encoded once, when the snapshot arrives (on
// the sink's thread), so that serving a query is a hash lookup and a few memcpys.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
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
};

// One pre-encoded answer: the records that follow the question, for one name and type.
// Compression pointers in `body` assume the question name starts at offset 12 and has the
// length of the name it was built for, which holds for every case variant of that name.
struct RecordSet {
  std::vector<uint8_t> body;
  uint16_t ancount = 0, nscount = 0, arcount = 0;
  uint32_t answer_bytes = 0;  // of the answer and authority sections: additional may be cut
  std::vector<model::IpAddr> addresses;  // the addresses this answer hands out
  // steady_clock nanoseconds of the newest reply that carried this set; written by the server
  // workers only when it moves forward, read by drain support.
  mutable std::atomic<int64_t> last_served_ns{0};
};

class Zone {
 public:
  enum class Kind : uint8_t { kAnswer, kNoData, kNxDomain, kNotSynced, kNotOurs, kPodAddress };
  struct Lookup {
    Kind kind = Kind::kNotOurs;
    const RecordSet* set = nullptr;
    bool soa = true;          // negative answers: add the SOA (only inside the cluster zone)
    model::IpAddr pod_address;  // kPodAddress (insecure pod mode, name not pre-encoded)
  };

  static std::shared_ptr<const Zone> build(const model::Snapshot& snap, const ZoneOptions& opts);
  // The zone before the first sync: every name inside it answers SERVFAIL.
  static std::shared_ptr<const Zone> unsynced(const ZoneOptions& opts);

  // `qname_lower` in wire form, lower case. No allocation, no lock.
  Lookup lookup(const WireName& qname_lower, uint16_t qtype) const;

  const WireName& apex() const { return apex_; }
  std::span<const uint8_t> soa_tail() const { return soa_tail_; }  // type..rdata of the SOA
  uint32_t ttl() const { return opts_.ttl; }
  uint64_t generation() const { return generation_; }
  bool synced() const { return synced_; }
  size_t name_count() const { return names_.size(); }
  const ZoneOptions& options() const { return opts_; }

  // The newest reply (steady_clock ns) that carried `a`, if one did.
  std::optional<int64_t> last_served_ns(const model::IpAddr& a) const;
  // Every address with a reply on record: (address, newest reply ns).
  std::vector<std::pair<model::IpAddr, int64_t>> served_addresses() const;

  // Whether `qname_lower` is the zone apex or below it.
  bool in_zone(const WireName& qname_lower) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Node {
    // Usually one or two types: a flat list beats a map.
    std::vector<std::pair<uint16_t, std::unique_ptr<RecordSet>>> sets;
    bool cname = false;  // ExternalName: the CNAME answers every type
    bool reverse = false;
  };
  friend class ZoneBuilder;

  ZoneOptions opts_;
  WireName apex_;
  WireName pod_suffix_;  // "pod.<zone>"
  std::vector<uint8_t> soa_tail_;
  uint64_t generation_ = 0;
  bool synced_ = false;
  std::unordered_map<std::string, Node, StringHash, std::equal_to<>> names_;
  std::unordered_map<model::IpAddr, std::vector<const RecordSet*>, model::IpAddrHash> by_address_;
};

using ZonePtr = std::shared_ptr<const Zone>;

}  // namespace endpointd::dns
