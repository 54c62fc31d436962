// The zone tests' fixture: a snapshot with every kind of service, its zone, and ask(), which
// puts a query through the hot path (answer()) and parses the reply.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "dns/answer.h"
#include "dns/zone.h"
#include "tests/dns/test_util.h"

namespace endpointd::dns::testing {

struct Asked {
  Reply reply;
  std::optional<Message> msg;
  std::vector<uint8_t> bytes;
};

inline Asked ask(const Zone& z, const std::string& name, uint16_t qtype, uint16_t edns = 0,
                 size_t limit = 0, int64_t now = 1) {
  auto pkt = query(name, qtype, edns);
  Query q = parse_query(pkt);
  Asked a;
  a.bytes.resize(65535);
  a.reply = answer(z, pkt, q, a.bytes.data(), a.bytes.size(), limit ? limit : q.udp_limit(), now);
  a.bytes.resize(a.reply.size);
  if (a.reply.action == Reply::Action::kSend) a.msg = parse_message(a.bytes);
  return a;
}

inline std::vector<std::string> texts(const std::vector<Record>& rs, uint16_t t = 0) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    if (t == 0 || r.type == t) out.push_back(r.text);
  std::sort(out.begin(), out.end());
  return out;
}

class ZoneFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto web = service("default", "web", {"10.96.0.10", "fd00::10"});
    auto v4only = service("default", "v4only", {"10.96.0.11"});
    auto headless = service(
        "default", "db", {"None"},
        {endpoint("10.1.0.1", true, false, "db-0"), endpoint("10.1.0.2"),
         endpoint("10.1.0.3", false), endpoint("10.1.0.4", true, true), endpoint("fd00::1:5")});
    auto empty = service("default", "empty", {"None"}, {endpoint("10.1.1.1", false)});
    auto pub = service("default", "pub", {"None"}, {endpoint("10.1.2.1", false)});
    std::const_pointer_cast<model::ServiceState>(pub)->service.publish_not_ready_addresses = true;
    auto ext = service("default", "ext", {});
    auto& e = std::const_pointer_cast<model::ServiceState>(ext)->service;
    e.type = model::ServiceType::kExternalName;
    e.external_name = "example.org";
    snap_ = snapshot({web, v4only, headless, empty, pub, ext});
    zone_ = Zone::build(*snap_, opts_);
  }
  ZoneOptions opts_;
  model::SnapshotPtr snap_;
  ZonePtr zone_;
};

}  // namespace endpointd::dns::testing
