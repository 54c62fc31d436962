// libFuzzer target: the query parser, the hot-path answer and the response parser on any
// bytes. Built only with -DENDPOINTD_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dns/answer.h"
#include "dns/message.h"
#include "dns/zone.h"
#include "tests/dns/test_util.h"

namespace {

const endpointd::dns::Zone& zone() {
  using namespace endpointd::dns::testing;
  static auto z = [] {
    endpointd::dns::ZoneOptions o;
    o.pod_mode = endpointd::dns::PodMode::kInsecure;
    o.loadbalance = true;  // db's two A records are rotated
    auto snap =
        snapshot({service("default", "web", {"10.96.0.10", "fd00::10"}),
                  service("default", "db", {"None"},
                          {endpoint("10.1.0.1", true, false, "db-0"), endpoint("10.1.0.2")}),
                  // ExternalNames: into the zone (A and AAAA answers carry db's records after
                  // the CNAME), and out of it (completed from upstream).
                  external_name("default", "alias", "db.default.svc.cluster.local"),
                  external_name("default", "out", "example.org")});
    // An additional zone (CoreDNS's `kubernetes cluster.local example.com`) served beside it.
    endpointd::dns::ZoneOptions extra = o;
    extra.zone = "example.com";
    extra.reverse = false;
    extra.other_zones = {"cluster.local"};
    o.other_zones = {"example.com"};
    return endpointd::dns::Zone::with_also(endpointd::dns::Zone::build(*snap, o),
                                           {endpointd::dns::Zone::build(*snap, extra)});
  }();
  return *z;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace endpointd::dns;
  std::span<const uint8_t> pkt(data, size);
  Query q = parse_query(pkt);
  static std::vector<uint8_t> out(65535);
  Reply r = answer(zone(), pkt, q, out.data(), out.size(), q.udp_limit(), 1);
  if (r.action == Reply::Action::kSend) {
    // Never an amplified error; every reply parses.
    if (r.rcode == 1 || r.rcode == 4) {
      if (r.size > size) __builtin_trap();
    }
    if (!parse_message({out.data(), r.size})) __builtin_trap();
  }
  (void)parse_message(pkt);
  // The bytes as the upstream's reply to an ExternalName's chase: spliced or refused, never
  // more than the buffer, and what comes out parses.
  static const std::vector<uint8_t> asked =
      testing::query("out.default.svc.cluster.local", type::kA, 1232);
  static const Query aq = parse_query(asked);
  static std::vector<uint8_t> cname(4096);
  static const size_t cname_size =
      answer(zone(), asked, aq, cname.data(), cname.size(), aq.udp_limit(), 1).size;
  size_t n = chase_reply(aq, {cname.data(), cname_size}, pkt, out.data(), 600);
  if (n > 600 || (n && !parse_message({out.data(), n}))) __builtin_trap();
  return 0;
}
