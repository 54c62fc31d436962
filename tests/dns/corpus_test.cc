// Replays malformed packets through the parser and the hot path: what the fuzzer does, in
// every build (no clang needed). A fixed seed keeps it deterministic.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "dns/answer.h"
#include "dns/message.h"
#include "dns/zone.h"
#include "tests/dns/test_util.h"

namespace endpointd::dns {
namespace {

using namespace testing;

// What the server's worker does instead of parse_query() and answer(): a Query it keeps from
// packet to packet, the lookup apart from the reply. It must come to the same reply.
void same_through_the_worker_path(const Zone& z, const std::vector<uint8_t>& pkt, const Query& q,
                                  const Reply& r, const std::vector<uint8_t>& out) {
  static Query kept;  // what the previous packets left in it must not matter
  parse_query(pkt, &kept);
  ASSERT_EQ(kept.status, q.status);
  ASSERT_EQ(kept.id, q.id);
  ASSERT_EQ(kept.flags, q.flags);
  ASSERT_EQ(kept.qname.view(), q.qname.view());
  ASSERT_EQ(kept.qname_lower.view(), q.qname_lower.view());
  ASSERT_EQ(kept.qtype, q.qtype);
  ASSERT_EQ(kept.qclass, q.qclass);
  ASSERT_EQ(kept.edns, q.edns);
  ASSERT_EQ(kept.udp_limit(), q.udp_limit());
  if (!wants_lookup(kept)) return;
  Zone::Lookup lk = z.lookup(kept.qname_lower, kept.qtype);
  prefetch_answer(lk);
  std::vector<uint8_t> out2(65535);
  Reply r2 = answer_lookup(z, lk, pkt, kept, out2.data(), out2.size(), kept.udp_limit(), 1);
  ASSERT_EQ(r2.action, r.action);
  ASSERT_EQ(r2.size, r.size);
  ASSERT_EQ(r2.rcode, r.rcode);
  ASSERT_EQ(r2.truncated, r.truncated);
  if (r.action != Reply::Action::kSend) return;
  // The header and question are the same; the records may come rotated (loadbalance).
  size_t head = std::min(r.size, kHeaderSize + q.qname.len + 4);
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + static_cast<long>(head), out2.begin()));
}

void replay(const Zone& z, const std::vector<uint8_t>& pkt) {
  Query q = parse_query(pkt);
  std::vector<uint8_t> out(65535);
  Reply r = answer(z, pkt, q, out.data(), out.size(), q.udp_limit(), 1);
  same_through_the_worker_path(z, pkt, q, r, out);
  if (r.action != Reply::Action::kSend) return;
  if (r.rcode == 1 || r.rcode == 4 || r.rcode == 5) {
    EXPECT_LE(r.size, pkt.size()) << "an error reply larger than its query";
  }
  EXPECT_TRUE(parse_message({out.data(), r.size}));
  (void)parse_message(pkt);
}

ZonePtr fuzz_zone() {
  ZoneOptions o;
  o.pod_mode = PodMode::kInsecure;
  o.loadbalance = true;  // db's two A records are rotated
  return Zone::build(
      *snapshot({service("default", "web", {"10.96.0.10", "fd00::10"}),
                 service("default", "db", {"None"},
                         {endpoint("10.1.0.1", true, false, "db-0"), endpoint("10.1.0.2")})}),
      o);
}

TEST(MalformedCorpus, SeedFilesNeverCrash) {
  auto z = fuzz_zone();
  std::filesystem::path dir = std::filesystem::path(ENDPOINTD_DNS_CORPUS);
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    std::vector<uint8_t> pkt((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    replay(*z, pkt);
    ++n;
  }
  EXPECT_GT(n, 5u);
}

TEST(MalformedCorpus, MutationsNeverCrash) {
  auto z = fuzz_zone();
  std::mt19937 rng(42);
  std::vector<std::vector<uint8_t>> seeds = {
      query("web.default.svc.cluster.local", type::kA, 1232),
      query("_http._tcp.db.default.svc.cluster.local", type::kSRV),
      query("10-1-2-3.default.pod.cluster.local", type::kA, 4096),
      query("example.org", type::kAAAA),
  };
  for (int i = 0; i < 50000; ++i) {
    std::vector<uint8_t> p = seeds[rng() % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      switch (rng() % 4) {
        case 0:
          p[rng() % p.size()] = static_cast<uint8_t>(rng());
          break;
        case 1:
          p.resize(rng() % (p.size() + 1));
          break;
        case 2:
          p.insert(p.begin() + static_cast<long>(rng() % (p.size() + 1)),
                   static_cast<uint8_t>(rng()));
          break;
        case 3:
          if (p.size() > 13) {
            p[12 + rng() % (p.size() - 12)] = 0xC0;
          }
          break;
      }
      if (p.empty()) break;
    }
    replay(*z, p);
  }
}

}  // namespace
}  // namespace endpointd::dns
