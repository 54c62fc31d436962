// nft syntax for the table model. The text mirrors, rule by rule, the bytecode that
// netlink.cc emits; tests/proxy checks that both list the same.
#include "proxy/render.h"

#include <cstdio>
#include <cstring>

namespace endpointd::proxy {
namespace {

std::string addr_text(IpFamily f, const std::string& bytes, size_t off) {
  size_t n = f == IpFamily::kV4 ? 4 : 16;
  uint8_t b[16] = {};
  std::memcpy(b, bytes.data() + off, n);
  return model::IpAddr::from_bytes(f, b).str();
}

std::string proto_text(uint8_t p) {
  switch (p) {
    case 6:
      return "tcp";
    case 17:
      return "udp";
    case 132:
      return "sctp";
    default:
      return std::to_string(p);
  }
}

uint16_t port_at(const std::string& bytes, size_t off) {
  return static_cast<uint16_t>((static_cast<uint8_t>(bytes[off]) << 8) |
                               static_cast<uint8_t>(bytes[off + 1]));
}

uint32_t u32_at(const std::string& bytes, size_t off) {
  uint32_t v = 0;
  std::memcpy(&v, bytes.data() + off, 4);
  return v;
}

// "10.0.0.1 . tcp . 80"
std::string vip_text(IpFamily f, const std::string& k) {
  size_t a = f == IpFamily::kV4 ? 4 : 16;
  return addr_text(f, k, 0) + " . " + proto_text(static_cast<uint8_t>(k[a])) + " . " +
         std::to_string(port_at(k, a + 4));
}

int prefix_len(IpFamily f, const std::string& lo, const std::string& hi, size_t off) {
  size_t n = f == IpFamily::kV4 ? 4 : 16;
  int len = 0;
  for (size_t i = 0; i < n; ++i) {
    auto x =
        static_cast<uint8_t>(static_cast<uint8_t>(lo[off + i]) ^ static_cast<uint8_t>(hi[off + i]));
    if (x == 0) {
      len += 8;
      continue;
    }
    while (!(x & 0x80)) {
      ++len;
      x = static_cast<uint8_t>(x << 1);
    }
    break;
  }
  return len;
}

std::string addr_range_text(IpFamily f, const std::string& lo, const std::string& hi, size_t off) {
  int len = prefix_len(f, lo, hi, off);
  int full = f == IpFamily::kV4 ? 32 : 128;
  if (len == full) return addr_text(f, lo, off);
  return addr_text(f, lo, off) + "/" + std::to_string(len);
}

std::string element_text(IpFamily f, const Set& s, const Element& e) {
  size_t a = f == IpFamily::kV4 ? 4 : 16;
  std::string out;
  switch (s.shape) {
    case SetShape::kAddrInterval:
      out = addr_range_text(f, e.key, e.key_end, 0);
      break;
    case SetShape::kAddrSet:
      out = addr_text(f, e.key, 0);
      break;
    case SetShape::kAddrPair:
      out = addr_text(f, e.key, 0) + " . " + addr_text(f, e.key, a);
      break;
    case SetShape::kVipSet:
    case SetShape::kVipVerdictMap:
      out = vip_text(f, e.key);
      break;
    case SetShape::kVipSrcInterval:
      out = vip_text(f, e.key) + " . " + addr_range_text(f, e.key, e.key_end, a + 8);
      break;
    case SetShape::kVipBackendSet:
      out = vip_text(f, e.key) + " . " + addr_text(f, e.key, a + 8) + " . " +
            std::to_string(port_at(e.key, 2 * a + 8));
      break;
    case SetShape::kAffinity:  // its elements are the packet path's, never the model's
    case SetShape::kDigest:    // rendered from the table's digest entries
      break;
    case SetShape::kBackends: {
      std::string addr = addr_text(f, e.data, 0);
      if (f == IpFamily::kV6) addr = "[" + addr + "]";
      out = vip_text(f, e.key) + " . " + std::to_string(u32_at(e.key, a + 8)) + " : " + addr +
            " . " + std::to_string(port_at(e.data, a));
      break;
    }
  }
  if (e.verdict == Verdict::kGoto) out += " : goto " + e.chain;
  if (e.verdict == Verdict::kDrop) out += " : drop";
  return out;
}

std::string set_type(IpFamily f, SetShape shape) {
  std::string addr = f == IpFamily::kV4 ? "ipv4_addr" : "ipv6_addr";
  switch (shape) {
    case SetShape::kAddrInterval:
    case SetShape::kAddrSet:
      return "type " + addr;
    case SetShape::kAddrPair:
      return "type " + addr + " . " + addr;
    case SetShape::kVipSet:
      return "type " + addr + " . inet_proto . inet_service";
    case SetShape::kVipSrcInterval:
      return "type " + addr + " . inet_proto . inet_service . " + addr;
    case SetShape::kVipVerdictMap:
      return "type " + addr + " . inet_proto . inet_service : verdict";
    case SetShape::kVipBackendSet:
      return "type " + addr + " . inet_proto . inet_service . " + addr + " . inet_service";
    case SetShape::kAffinity:
      return "type " + addr + " . " + addr + " . inet_proto . inet_service : " + addr +
             " . inet_service";
    case SetShape::kDigest:
      return "type mark";
    case SetShape::kBackends:
      return "";
  }
  return "";
}

// A duration as nft prints it: "3h", "1h30m", "45s".
std::string timeout_text(uint32_t seconds) {
  std::string out;
  for (auto [unit, size] :
       {std::pair<const char*, uint32_t>{"d", 86400}, {"h", 3600}, {"m", 60}, {"s", 1}}) {
    if (seconds >= size) {
      out += std::to_string(seconds / size) + unit;
      seconds %= size;
    }
  }
  return out.empty() ? "0s" : out;
}

std::string affinity_rule_text(IpFamily f, const Rule& r) {
  std::string ip = f == IpFamily::kV4 ? "ip" : "ip6";
  if (r.shape == RuleShape::kAffinityStick) {
    return "dnat " + ip + " to " + ip + " saddr . " + ip +
           " daddr . meta l4proto . th dport map @" + r.set;
  }
  std::string vip = "ct original " + ip + " daddr . meta l4proto . ct original proto-dst";
  std::string backend = ip + " daddr . th dport";
  return "meta l4proto " + proto_text(r.l4proto) + " " + vip + " . " + backend + " @" + r.set +
         " update @" + r.affinity + " { " + ip + " saddr . " + vip + " timeout " +
         timeout_text(r.timeout_s) + " : " + backend + " }";
}

}  // namespace

std::string render_rule(IpFamily f, const Rule& r) {
  std::string ip = f == IpFamily::kV4 ? "ip" : "ip6";
  std::string vip = ip + " daddr . meta l4proto . th dport";
  std::string saddr = ip + " saddr";
  switch (r.shape) {
    case RuleShape::kCtNewJump:
      return "ct state new jump " + r.target;
    case RuleShape::kAcceptEstablished:
      return "ct state established,related accept";
    case RuleShape::kAcceptDnat:
      return "ct status dnat accept";
    case RuleShape::kJump:
      return "jump " + r.target;
    case RuleShape::kFirewallCheck:
      return vip + " @" + names::kFirewallIps + " " + vip + " . " + saddr + " != @" +
             names::kFirewallAllow + " drop";
    case RuleShape::kVipVmap:
      return vip + " vmap @" + r.set;
    case RuleShape::kReject:
      return "reject";
    case RuleShape::kMarkForMasquerade:
      return "meta mark set meta mark | 0x00004000";
    case RuleShape::kHairpinMark:
      return "ct status dnat " + saddr + " . " + ip + " daddr @" + names::kHairpin + " jump " +
             r.target;
    case RuleShape::kMasqReturnUnmarked:
      return "meta mark & 0x00004000 == 0x00000000 return";
    case RuleShape::kMasqClearMark:
      return "meta mark set meta mark ^ 0x00004000";
    case RuleShape::kMasquerade:
      return "masquerade fully-random";
    case RuleShape::kSaddrNotInJump:
      return saddr + " != @" + r.set + " jump " + r.target;
    case RuleShape::kSaddrInVmap:
      return saddr + " @" + names::kClusterCidrs + " " + vip + " vmap @" + r.set;
    case RuleShape::kFibLocalJump:
      return "fib saddr type local jump " + r.target;
    case RuleShape::kFibLocalVmap:
      return "fib saddr type local " + vip + " vmap @" + r.set;
    case RuleShape::kDnatRandom:
      return "dnat " + ip + " to " + vip + " . numgen random mod " + std::to_string(r.modulus) +
             " map @" + r.set;
    case RuleShape::kAffinityStick:
    case RuleShape::kAffinityRecord:
      return affinity_rule_text(f, r);
    case RuleShape::kGoto:
      return "goto " + r.target;
    case RuleShape::kVipInSetGoto:
      return vip + " @" + r.set + " goto " + r.target;
    case RuleShape::kVipInSetDrop:
      return vip + " @" + r.set + " drop";
    case RuleShape::kRejectTcpReset:
      return "meta l4proto tcp reject with tcp reset";
    case RuleShape::kDrop:
      return "drop";
    case RuleShape::kIifnameNotJump:
      return "iifname != \"" + r.iifname + "\" jump " + r.target;
    case RuleShape::kIifnameVmap:
      return "iifname \"" + r.iifname + "\" " + vip + " vmap @" + r.set;
    case RuleShape::kDaddrInSetGoto:
      return ip + " daddr @" + r.set + " goto " + r.target;
    case RuleShape::kDaddrInSetDrop:
      return ip + " daddr @" + r.set + " drop";
    case RuleShape::kNotrackDaddr:
      return ip + " daddr " + addr_text(f, r.addr, 0) + " " + proto_text(r.l4proto) + " dport " +
             std::to_string(r.port) + " notrack";
    case RuleShape::kNotrackSaddr:
      return ip + " saddr " + addr_text(f, r.addr, 0) + " " + proto_text(r.l4proto) + " sport " +
             std::to_string(r.port) + " notrack";
  }
  return "";
}

std::string render(const Table& t) {
  const IpFamily f = t.family;
  std::string ip = f == IpFamily::kV4 ? "ip" : "ip6";
  std::string out = "table " + ip + " " + kTableName + " {\n";
  for (const auto& [name, s] : t.sets) {
    bool is_map = s.shape == SetShape::kVipVerdictMap || s.shape == SetShape::kBackends ||
                  s.shape == SetShape::kAffinity;
    out += std::string("\t") + (is_map ? "map " : "set ") + name + " {\n";
    if (s.shape == SetShape::kBackends) {
      out += "\t\ttypeof " + ip + " daddr . meta l4proto . th dport . numgen random mod " +
             std::to_string(s.modulus) + " : " + ip + " daddr . th dport\n";
    } else {
      out += "\t\t" + set_type(f, s.shape) + "\n";
    }
    // A fresh load's size (a kernel set keeps the size it was made with; see table.h).
    if (sized(s.shape)) out += "\t\tsize " + std::to_string(set_size_for(s.elements.size())) + "\n";
    if (s.shape == SetShape::kAddrInterval || s.shape == SetShape::kVipSrcInterval)
      out += "\t\tflags interval\n";
    if (s.shape == SetShape::kAffinity) {
      out += "\t\tsize " + std::to_string(kAffinityMapSize) + "\n";
      out += "\t\tflags dynamic,timeout\n";
    }
    if (!s.elements.empty()) {
      out += "\t\telements = { ";
      bool first = true;
      for (const auto& e : s.elements) {
        if (!first) out += ",\n\t\t\t     ";
        first = false;
        out += element_text(f, s, e.element());
      }
      out += " }\n";
    }
    out += "\t}\n";
  }
  // The content digest of each set (see Table's DigestEntry), as the kernel has them.
  out +=
      std::string("\tset ") + names::kDigests + " {\n\t\t" + set_type(f, SetShape::kDigest) + "\n";
  auto digests = digest_entries(t);
  for (size_t i = 0; i < digests.size(); ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "0x%08x", digests[i].key);
    out += (i == 0 ? "\t\telements = { " : ",\n\t\t\t     ") + std::string(key) + " comment \"" +
           digests[i].comment + "\"";
  }
  if (!digests.empty()) out += " }\n";
  out += "\t}\n";
  for (const auto& [name, c] : t.chains) {
    out += "\tchain " + name + " {\n";
    if (c.base) {
      out += "\t\ttype " + c.base->type + " hook " + c.base->hook + " priority " +
             std::to_string(c.base->priority) + "; policy accept;\n";
    }
    for (const auto& r : c.rules) out += "\t\t" + render_rule(f, r) + "\n";
    out += "\t}\n";
  }
  out += "}\n";
  return out;
}

}  // namespace endpointd::proxy
