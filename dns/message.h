// DNS wire codec: a bounds-checked query parser for the hot path, a writer that builds
// messages into a caller's buffer with name compression, and a general (allocating) message
// parser for responses from upstreams and for tests.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace endpointd::dns {

inline constexpr size_t kHeaderSize = 12;
inline constexpr size_t kMaxNameWire = 255;
inline constexpr size_t kMaxLabel = 63;
inline constexpr uint16_t kMinUdpSize = 512;
inline constexpr uint16_t kMaxUdpSize = 4096;  // the most we ever send over UDP
inline constexpr uint16_t kOurUdpSize = 1232;  // what we advertise in our OPT

namespace type {
inline constexpr uint16_t kA = 1, kNS = 2, kCNAME = 5, kSOA = 6, kPTR = 12, kTXT = 16, kAAAA = 28,
                          kSRV = 33, kOPT = 41, kIXFR = 251, kAXFR = 252, kANY = 255;
}
inline constexpr uint16_t kClassIN = 1, kClassANY = 255;

enum class Rcode : uint8_t {
  kNoError = 0,
  kFormErr = 1,
  kServFail = 2,
  kNxDomain = 3,
  kNotImp = 4,
  kRefused = 5,
};
inline constexpr uint16_t kRcodeBadVers = 16;  // extended: upper 8 bits in the OPT TTL

namespace flag {
inline constexpr uint16_t kQR = 0x8000, kAA = 0x0400, kTC = 0x0200, kRD = 0x0100, kRA = 0x0080,
                          kAD = 0x0020, kCD = 0x0010;
}

// A domain name in uncompressed wire form (labels, then the root's zero byte).
struct WireName {
  std::array<uint8_t, kMaxNameWire> bytes{};
  uint8_t len = 0;
  std::span<const uint8_t> span() const { return {bytes.data(), len}; }
  std::string_view view() const {
    return {reinterpret_cast<const char*>(bytes.data()), len};  // our own bytes, not a packet
  }
};

// Text ("a.b.c" or "a.b.c.") to wire form; nullopt on empty labels or lengths past the limits.
std::optional<WireName> name_from_text(std::string_view text);
std::string name_to_text(std::span<const uint8_t> wire);  // "a.b.c." (root: ".")
void lowercase_name(std::span<uint8_t> wire);

// What the query parser decided.
enum class ParseStatus : uint8_t {
  kOk,
  kDrop,     // too short for a header, or a response: never answered
  kFormErr,  // answer FORMERR with the header only
  kNotImp,   // an opcode other than QUERY
  kBadVers,  // EDNS version > 0
};

struct Query {
  ParseStatus status = ParseStatus::kDrop;
  uint16_t id = 0;
  uint16_t flags = 0;    // as received
  WireName qname;        // as received (case kept, for the echo)
  WireName qname_lower;  // for lookups
  uint16_t qtype = 0;
  uint16_t qclass = 0;
  bool edns = false;
  uint16_t edns_udp_size = 0;  // as advertised
  uint8_t edns_version = 0;
  bool edns_do = false;
  uint8_t opcode() const { return (flags >> 11) & 0xF; }
  bool rd() const { return (flags & flag::kRD) != 0; }
  // The most the client accepts over UDP: 512 without EDNS, the advertised size clamped
  // to [512, kMaxUdpSize] with it.
  uint16_t udp_limit() const;
};

// Parses a query. Never reads past `pkt`; rejects compression loops and forward pointers,
// labels past the packet or longer than 63, names longer than 255, qdcount != 1, more than
// one OPT, an OPT not owned by the root.
Query parse_query(std::span<const uint8_t> pkt);
// The same into a Query the caller keeps (a server worker, one per query of a batch): its
// name buffers are not cleared first, only their first `len` bytes are written and mean
// anything, so parsing costs what the packet holds and not the Query's size.
void parse_query(std::span<const uint8_t> pkt, Query* q);

// Writes a message into a caller's buffer. Every write is bounds-checked: once something
// does not fit, `ok()` turns false and nothing more is written. Names are compressed against
// the names written before (a fixed table, no allocation).
class Writer {
 public:
  Writer(uint8_t* buf, size_t cap) : buf_(buf), cap_(cap) {}
  bool ok() const { return ok_; }
  size_t size() const { return pos_; }
  uint8_t* data() { return buf_; }

  void header(uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns, uint16_t ar);
  void u8(uint8_t v);
  void u16(uint16_t v);
  void u32(uint32_t v);
  void bytes(std::span<const uint8_t> b);
  // A name, compressed against earlier names when `compress`.
  void name(std::span<const uint8_t> wire, bool compress = true);
  // Starts a resource record; returns the offset of its RDLENGTH for end_rr().
  size_t begin_rr(std::span<const uint8_t> owner, uint16_t type, uint16_t cls, uint32_t ttl);
  void end_rr(size_t rdlength_at);
  void opt(uint16_t udp_size, uint8_t ext_rcode, uint8_t version, bool do_bit);
  void patch_u16(size_t at, uint16_t v);

 private:
  bool fits(size_t n);
  bool equal_suffix(size_t at, std::span<const uint8_t> wire, size_t from) const;
  void remember(size_t at, std::span<const uint8_t> wire);

  uint8_t* buf_;
  size_t cap_;
  size_t pos_ = 0;
  bool ok_ = true;
  static constexpr size_t kTable = 64;
  std::array<uint16_t, kTable> names_{};  // offsets of names written uncompressed
  size_t n_names_ = 0;
};

// Header-only error response (FORMERR, NOTIMP): never longer than the query. Returns the size
// written, 0 when `out` is too small or the query has no header.
size_t write_header_only(std::span<const uint8_t> query, Rcode rc, uint8_t* out, size_t cap);

// Builds a query (for the forwarder and tests). `edns_size` 0: no OPT.
size_t write_query(uint16_t id, std::span<const uint8_t> qname, uint16_t qtype, bool rd,
                   uint16_t edns_size, uint8_t* out, size_t cap);

// --- The general parser, for responses (allocates; not on the zone's hot path). ---
struct Record {
  std::string name;  // text, lower case as received
  uint16_t type = 0;
  uint16_t cls = 0;
  uint32_t ttl = 0;
  size_t ttl_offset = 0;  // where the TTL sits in the message
  std::vector<uint8_t> rdata;
  size_t rdata_offset = 0;
  // Decoded for convenience: A/AAAA address text, names in CNAME/PTR/NS/SRV target, TXT text.
  std::string text;
  uint16_t srv_priority = 0, srv_weight = 0, srv_port = 0;
};

struct Message {
  uint16_t id = 0;
  uint16_t flags = 0;
  uint16_t rcode = 0;  // with the extended bits from OPT
  std::string qname;
  uint16_t qtype = 0, qclass = 0;
  std::vector<Record> answer, authority, additional;  // additional excludes OPT
  bool edns = false;
  uint16_t edns_udp_size = 0;
  bool tc() const { return (flags & flag::kTC) != 0; }
};

std::optional<Message> parse_message(std::span<const uint8_t> pkt);

// Reads a (possibly compressed) name at `*pos`; advances `*pos` past it in the original
// position. Pointers must point strictly backwards; at most 127 of them per name.
bool read_name(std::span<const uint8_t> pkt, size_t* pos, WireName* out);

inline uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>((p[0] << 8) | p[1]);
}
inline uint32_t load_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
inline void store_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void store_u32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

std::string_view type_name(uint16_t t);  // "A", "AAAA", ..., "other"

}  // namespace endpointd::dns
