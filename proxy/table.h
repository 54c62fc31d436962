// The in-memory model of one endpointd nftables table (ip or ip6): its sets and maps with
// their elements, and its chains with their rules. The planner builds it, render prints it,
// the netlink backend programs it. It is the authoritative copy: the kernel is never listed
// on a normal sync.
#pragma once

#include <absl/container/btree_map.h>

#include <compare>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/ip.h"
#include "model/result.h"

namespace endpointd::proxy {

using model::IpFamily;

inline constexpr const char* kTableName = "endpointd";
inline constexpr uint32_t kMasqueradeMark = 0x4000;  // kube-proxy's default masquerade bit 14
// Clients remembered per affinity map (every service with one timeout shares it). A full map
// records no one new: those clients are balanced without affinity until records expire.
inline constexpr uint32_t kAffinityMapSize = 1 << 18;

// Every set or map endpointd creates has one of these shapes. Keys are concatenations whose
// fields each take 4 bytes (16 for an IPv6 address), network byte order, as nft lays them out
// in registers.
enum class SetShape : uint8_t {
  kAddrInterval,    // type <addr>; flags interval                        (cluster-cidrs)
  kAddrPair,        // type <addr> . <addr>                               (hairpin)
  kVipSet,          // type <addr> . inet_proto . inet_service            (firewall-ips)
  kVipSrcInterval,  // type <addr> . inet_proto . inet_service . <addr>; flags interval
  kVipVerdictMap,   // type <addr> . inet_proto . inet_service : verdict
  kBackends,        // typeof ip daddr . meta l4proto . th dport . numgen random mod N
                    //        : ip daddr . th dport
  kVipBackendSet,   // type <addr> . inet_proto . inet_service . <addr> . inet_service
                    //                                              (affinity-backends-T)
  kAffinity,        // type <addr> . <addr> . inet_proto . inet_service : <addr> . inet_service;
                    // flags dynamic,timeout (affinity: written by the packet path)
  kAddrSet,         // type <addr>                                        (cluster-ips)
  kDigest,          // type mark, elements with a comment: each set's content digest (digests)
};

enum class Verdict : uint8_t { kNone, kGoto, kDrop };

struct Element {
  std::string key;      // bytes, register layout
  std::string key_end;  // interval sets: the inclusive upper bound (same layout); else empty
  std::string data;     // kBackends: address . port in register layout
  Verdict verdict = Verdict::kNone;
  std::string chain;  // kGoto target
  friend bool operator==(const Element&, const Element&) = default;
};

// A set's elements in key order, each packed into one map node: key, then data or key end,
// verdict and goto target inline (~130 bytes an element; a std::map<std::string, Element> took
// ~290 with its heap strings, 33 MiB at 10k services x 10 endpoints).
class ElementMap {
 public:
  // The longest key: ip6 address . proto . port . address . port (affinity-backends).
  static constexpr size_t kMaxBytes = 44;

  // One stored element; its views are valid until the map changes. `chain` is followed by a
  // NUL (it views a std::string).
  struct View {
    std::string_view key;
    std::string_view key_end;
    std::string_view data;
    Verdict verdict = Verdict::kNone;
    std::string_view chain;
    Element element() const;
  };

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  // A digest of the elements (key, key end, data, verdict, goto target), independent of their
  // order and kept as elements come and go: two maps with the same elements have the same.
  uint64_t digest() const { return digest_; }
  static uint64_t element_digest(std::string_view key, std::string_view key_end,
                                 std::string_view data, Verdict verdict, std::string_view chain);
  bool contains(std::string_view key) const { return items_.count(key) > 0; }
  size_t count(std::string_view key) const { return items_.count(key); }
  std::optional<Element> get(std::string_view key) const;
  static constexpr size_t kMaxChains = UINT8_MAX;  // goto targets in one map

  // Adds `e`, or replaces the element with its key and returns the one replaced. An element
  // the map cannot hold (a field longer than kMaxBytes, both data and a key end, one goto
  // target too many) is an error naming what was wrong, and the map is left as it was.
  Result<std::optional<Element>> put(const Element& e);
  bool erase(std::string_view key) {
    auto it = items_.find(key);
    if (it == items_.end()) return false;
    digest_ -= digest_of(*it);
    items_.erase(it);
    return true;
  }

 private:
  struct Bytes {
    uint8_t size = 0;
    char bytes[kMaxBytes] = {};
    std::string_view view() const { return {bytes, size}; }
  };
  struct Value {
    Bytes bytes;  // data, or the key end of an interval element
    bool is_key_end = false;
    Verdict verdict = Verdict::kNone;
    uint8_t chain = 0;  // index into chains_
  };
  struct Less {
    using is_transparent = void;
    static std::string_view v(const Bytes& b) { return b.view(); }
    static std::string_view v(std::string_view s) { return s; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return v(a) < v(b);
    }
  };
  // A B-tree: a full sync puts every element of a set (100,000 in a large backend map) into
  // an empty map, and a red-black tree's node per element, reached through a pointer per
  // level, made that a third of planning; B-tree nodes hold many elements side by side.
  using Items = absl::btree_map<Bytes, Value, Less>;
  View view(const Items::value_type& item) const;
  uint64_t digest_of(const Items::value_type& item) const;

 public:
  class const_iterator {
   public:
    View operator*() const { return map_->view(*it_); }
    const_iterator& operator++() {
      ++it_;
      return *this;
    }
    bool operator==(const const_iterator& o) const { return it_ == o.it_; }

   private:
    friend class ElementMap;
    const_iterator(const ElementMap* m, Items::const_iterator it) : map_(m), it_(it) {}
    const ElementMap* map_;
    Items::const_iterator it_;
  };
  const_iterator begin() const { return {this, items_.begin()}; }
  const_iterator end() const { return {this, items_.end()}; }

 private:
  Items items_;
  std::vector<std::string> chains_ = {""};  // goto targets in use, interned
  uint64_t digest_ = 0;                     // the sum of element_digest over items_
};

struct Set {
  std::string name;
  SetShape shape = SetShape::kVipSet;
  uint32_t modulus = 0;  // kBackends only
  // kAffinity: filled by the packet path, so empty here, and a full sync leaves the kernel's
  // elements alone (a client's affinity survives an endpointd restart).
  ElementMap elements;
};

enum class RuleShape : uint8_t {
  kCtNewJump,           // ct state new jump <target>
  kAcceptEstablished,   // ct state established,related accept
  kAcceptDnat,          // ct status dnat accept
  kJump,                // jump <target>
  kFirewallCheck,       // <vip> @firewall-ips <vip> . <saddr> != @firewall-allow drop
  kVipVmap,             // <vip> vmap @<set>
  kReject,              // reject
  kMarkForMasquerade,   // meta mark set meta mark | 0x4000
  kHairpinMark,         // ct status dnat <saddr> . <daddr> @hairpin jump <target>
  kMasqReturnUnmarked,  // meta mark & 0x4000 == 0 return
  kMasqClearMark,       // meta mark set meta mark ^ 0x4000
  kMasquerade,          // masquerade fully-random
  kSaddrNotInJump,      // <saddr> != @cluster-cidrs jump <target>
  kSaddrInVmap,         // <saddr> @cluster-cidrs <vip> vmap @<set>
  kFibLocalJump,        // fib saddr type local jump <target>
  kFibLocalVmap,        // fib saddr type local <vip> vmap @<set>
  kDnatRandom,          // dnat to <vip> . numgen random mod N map @<set>
  // ClientIP affinity. <client> is <saddr> . <vip>, and after DNAT <saddr> . ct original
  // <vip>; <backend> is <daddr> . th dport after DNAT.
  kAffinityStick,   // dnat to <client> map @<set>
  kAffinityRecord,  // meta l4proto P ct original <vip> . <backend> @<set>
                    //   update @<affinity> { <client> timeout T : <backend> }
                    // (nft types ct original proto-dst only once it knows the protocol)
  kGoto,            // goto <target>
  kVipInSetGoto,    // <vip> @<set> goto <target>
  kVipInSetDrop,    // <vip> @<set> drop
  kRejectTcpReset,  // meta l4proto tcp reject with tcp reset
  kDrop,            // drop
  // Local-traffic detection by interface (--detect-local-mode BridgeInterface or
  // InterfaceNamePrefix): Rule::iifname is a name, or a prefix followed by '*'.
  kIifnameNotJump,  // iifname != "<iifname>" jump <target>
  kIifnameVmap,     // iifname "<iifname>" <vip> vmap @<set>
  kDaddrInSetGoto,  // <daddr> @<set> goto <target>
  kDaddrInSetDrop,  // <daddr> @<set> drop
  // Node-local DNS (NodeContext::dns_node_local): its traffic skips conntrack. Rule::addr is
  // the address (register layout), Rule::l4proto P (tcp or udp), Rule::port the DNS port.
  kNotrackDaddr,  // <daddr> <addr> P dport <port> notrack
  kNotrackSaddr,  // <saddr> <addr> P sport <port> notrack
};

struct Rule {
  RuleShape shape;
  std::string target;  // chain jumped to
  std::string set;     // set or map looked up
  uint32_t modulus = 0;
  std::string affinity{};  // kAffinityRecord: the map it records into
  uint32_t timeout_s = 0;  // kAffinityRecord: the record's lifetime
  uint8_t l4proto = 0;     // kAffinityRecord, kNotrack*: P
  std::string iifname{};   // kIifnameNotJump, kIifnameVmap
  std::string addr{};      // kNotrack*: the address, register layout
  uint16_t port = 0;       // kNotrack*: the port
  friend bool operator==(const Rule&, const Rule&) = default;
};

// kube-proxy's hooks, and raw (-300, before conntrack at -200) for the node-local DNS chains.
inline constexpr int kRawPriority = -300;

struct BaseHook {
  std::string type;  // "filter" or "nat"
  std::string hook;  // "prerouting", "input", "forward", "output", "postrouting"
  int priority = 0;
  friend bool operator==(const BaseHook&, const BaseHook&) = default;
};

struct Chain {
  std::string name;
  std::optional<BaseHook> base;
  std::vector<Rule> rules;
  friend bool operator==(const Chain&, const Chain&) = default;
};

struct Table {
  IpFamily family = IpFamily::kV4;
  std::map<std::string, Set> sets;
  std::map<std::string, Chain> chains;
  size_t element_count() const;
};

// Set sizes (proxy/LAYOUT.md, "Set sizes"). The hash sets and maps are made with a size
// (NFTA_SET_DESC_SIZE): the kernel then keeps them in its fixed-size hash, built once, rather
// than a table it rehashes as it grows. A set holds at most its size, so one that outgrows it
// is made anew, larger, by a full sync.
inline constexpr uint32_t kMinSetSize = 1024;
// Whether sets of this shape get a size (not the interval sets, nor the affinity map, whose
// size is kAffinityMapSize, nor `digests`).
bool sized(SetShape shape);
// The size a set made for `elements` gets: room to double, at least kMinSetSize.
uint32_t set_size_for(size_t elements);
// Whether a kernel set of `kernel_size` (0: made without a size, it has no limit) is too small
// for `elements`: it must be made anew.
inline bool outgrows(uint32_t kernel_size, size_t elements) {
  return kernel_size != 0 && elements > kernel_size;
}

// Content digests (proxy/LAYOUT.md, "Restart without listing"). The `digests` set holds one
// element per set endpointd keeps, keyed by digest_key(name) and commented
// "v1 <name> <elements> <digest>", written in the same transaction as every change to that
// set: so the element claims what the kernel's set holds, and a restarted agent that wants
// the same content need not list the set.
struct DigestEntry {
  uint32_t key = 0;  // host byte order (a `mark`)
  std::string comment;
  friend bool operator==(const DigestEntry&, const DigestEntry&) = default;
};
// One key per set name endpointd makes (the fixed names, backends-N, local-backends-N,
// affinity-backends-T), different for different names; none for other names, for the plain
// interval sets (listed whole: a few ranges) and for the affinity map (the packet path's).
std::optional<uint32_t> digest_key(std::string_view set_name);
std::optional<DigestEntry> digest_entry(const Set& s);
// Every entry of the table, by key.
std::vector<DigestEntry> digest_entries(const Table& t);

// What to do to a table already programmed to reach the next one, in the order a batch
// carries it: create sets and chains (with their rules), delete elements, add elements,
// then delete chains and sets nothing refers to any more.
struct TableChanges {
  IpFamily family = IpFamily::kV4;
  std::vector<Set> add_sets;      // without elements
  std::vector<Chain> add_chains;  // with rules
  // Existing chains whose rules are all replaced (flushed and added again, in one batch): the
  // load-balancing chains carry one rule per backend-map size in use.
  std::vector<Chain> replace_chains;
  std::vector<std::pair<std::string, Element>> del_elements;
  std::vector<std::pair<std::string, Element>> add_elements;
  std::vector<std::string> del_chains;
  std::vector<std::string> del_sets;
  // ClientIP affinity: <vip> . <backend> pairs no longer routed. Once the batch is committed,
  // the packet path records none of them again, and the records it kept for them are deleted
  // (the backend lists the affinity map and deletes those records).
  std::vector<std::string> forget_affinity;
  // The content digests of the sets this changes: entries deleted (by key) first, then added;
  // a set that stays is in both (its entry replaced).
  std::vector<uint32_t> del_digests;
  std::vector<DigestEntry> add_digests;
  bool empty() const {
    return add_sets.empty() && add_chains.empty() && replace_chains.empty() &&
           del_elements.empty() && add_elements.empty() && del_chains.empty() && del_sets.empty() &&
           forget_affinity.empty();
  }
  size_t size() const {
    return add_sets.size() + add_chains.size() + replace_chains.size() + del_elements.size() +
           add_elements.size() + del_chains.size() + del_sets.size() + forget_affinity.size();
  }
};

// Field helpers: the register layout of key and data fields.
std::string addr_field(const model::IpAddr& a);
std::string proto_field(uint8_t l4proto);
std::string port_field(uint16_t port);
std::string u32_field(uint32_t v);  // numgen / hash result, host byte order as the kernel has it

// The bytes of the last address of a prefix (for interval keys).
std::string prefix_last(const model::IpPrefix& p);

// Names of the fixed chains and sets.
namespace names {
inline constexpr const char* kClusterCidrs = "cluster-cidrs";
inline constexpr const char* kClusterIps = "cluster-ips";
inline constexpr const char* kServiceCidrs = "service-cidrs";
inline constexpr const char* kClusterIpsCheck = "cluster-ips-check";
inline constexpr const char* kHairpin = "hairpin";
inline constexpr const char* kFirewallIps = "firewall-ips";
inline constexpr const char* kFirewallAllow = "firewall-allow";
inline constexpr const char* kNoEndpointReject = "no-endpoint-reject";
inline constexpr const char* kNoEndpointDrop = "no-endpoint-drop";
inline constexpr const char* kServiceIps = "service-ips";
inline constexpr const char* kServiceLb = "service-lb";
inline constexpr const char* kLb = "lb";
inline constexpr const char* kAffinity = "affinity";
inline constexpr const char* kLbAffinity = "lb-affinity";
inline constexpr const char* kAffinityRecord = "affinity-record";
inline constexpr const char* kLocalLb = "local-lb";
inline constexpr const char* kRejectChain = "reject-chain";
inline constexpr const char* kMarkForMasquerade = "mark-for-masquerade";
inline constexpr const char* kSvcInternal = "svc-internal";
inline constexpr const char* kSvcExternal = "svc-external";
inline constexpr const char* kSvcExternalLocal = "svc-external-local";
inline constexpr const char* kDigests = "digests";
// Node-local DNS: notrack for its queries and answers, at raw priority.
inline constexpr const char* kDnsNotrackPrerouting = "dns-notrack-prerouting";
inline constexpr const char* kDnsNotrackOutput = "dns-notrack-output";
std::string backends(uint32_t n);                   // "backends-N"
std::string local_backends(uint32_t n);             // "local-backends-N"
std::string affinity_backends(uint32_t timeout_s);  // "affinity-backends-T"
}  // namespace names

}  // namespace endpointd::proxy
