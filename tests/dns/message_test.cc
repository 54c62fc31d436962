// The wire codec: round trips, compression, and every kind of bad input the issue lists.
#include "dns/message.h"

#include <gtest/gtest.h>

#include "tests/dns/test_util.h"

namespace endpointd::dns {
namespace {

using testing::query;

TEST(Message, QueryRoundTrip) {
  auto pkt = query("Web.Default.svc.cluster.local", type::kAAAA, 1232, 0xBEEF);
  Query q = parse_query(pkt);
  ASSERT_EQ(q.status, ParseStatus::kOk);
  EXPECT_EQ(q.id, 0xBEEF);
  EXPECT_TRUE(q.rd());
  EXPECT_EQ(q.qtype, type::kAAAA);
  EXPECT_EQ(q.qclass, kClassIN);
  EXPECT_EQ(name_to_text(q.qname.span()), "Web.Default.svc.cluster.local.");
  EXPECT_EQ(name_to_text(q.qname_lower.span()), "web.default.svc.cluster.local.");
  EXPECT_TRUE(q.edns);
  EXPECT_EQ(q.edns_udp_size, 1232);
  EXPECT_EQ(q.udp_limit(), 1232);
}

// A worker parses every query of a batch into a Query it keeps: what the previous packet left
// in it (a longer name, EDNS, another status) must not show through.
TEST(Message, ParseIntoAReusedQueryForgetsThePreviousOne) {
  Query q;
  parse_query(query("A-Long-Name.With.Many.Labels.default.svc.cluster.local", type::kSRV, 4096, 7),
              &q);
  ASSERT_EQ(q.status, ParseStatus::kOk);
  ASSERT_TRUE(q.edns);
  parse_query(query("Web.X", type::kA, 0, 9), &q);
  ASSERT_EQ(q.status, ParseStatus::kOk);
  EXPECT_EQ(q.id, 9);
  EXPECT_EQ(q.qtype, type::kA);
  EXPECT_FALSE(q.edns);
  EXPECT_EQ(q.edns_udp_size, 0);
  EXPECT_EQ(q.udp_limit(), kMinUdpSize);
  EXPECT_EQ(name_to_text(q.qname.span()), "Web.X.");
  EXPECT_EQ(q.qname_lower.view(), name_from_text("web.x")->view());
  // A packet that is not a query at all: nothing of the last one is left to answer.
  std::vector<uint8_t> short_pkt(5, 0);
  parse_query(short_pkt, &q);
  EXPECT_EQ(q.status, ParseStatus::kDrop);
  EXPECT_EQ(q.qname.len, 0);
  EXPECT_EQ(q.qname_lower.len, 0);
  EXPECT_EQ(q.qtype, 0);
}

// Every byte value in a label: only A-Z change in the lookup name; the echoed name keeps them.
TEST(Message, LowercasesOnlyAsciiLetters) {
  std::vector<uint8_t> pkt = query("x.y", type::kA);
  // Replace the first label "x" by one of 63 bytes covering the values around 'A'..'Z'.
  std::vector<uint8_t> label;
  for (int c = '@' - 20; label.size() < 63; ++c) label.push_back(static_cast<uint8_t>(c));
  pkt.erase(pkt.begin() + 12, pkt.begin() + 14);
  pkt.insert(pkt.begin() + 12, static_cast<uint8_t>(label.size()));
  pkt.insert(pkt.begin() + 13, label.begin(), label.end());
  Query q = parse_query(pkt);
  ASSERT_EQ(q.status, ParseStatus::kOk);
  ASSERT_EQ(q.qname_lower.len, q.qname.len);
  for (size_t i = 0; i < label.size(); ++i) {
    uint8_t c = label[i];
    uint8_t want = (c >= 'A' && c <= 'Z') ? static_cast<uint8_t>(c + 32) : c;
    EXPECT_EQ(q.qname.bytes[1 + i], c);
    EXPECT_EQ(q.qname_lower.bytes[1 + i], want) << "byte " << int{c};
  }
}

TEST(Message, UdpLimitClamped) {
  Query q = parse_query(query("a.b", type::kA, 65535));
  EXPECT_EQ(q.udp_limit(), kMaxUdpSize);
  q = parse_query(query("a.b", type::kA, 100));
  EXPECT_EQ(q.udp_limit(), kMinUdpSize);
  q = parse_query(query("a.b", type::kA, 0));
  EXPECT_EQ(q.udp_limit(), kMinUdpSize);
}

TEST(Message, NameText) {
  EXPECT_FALSE(name_from_text("a..b"));
  EXPECT_FALSE(name_from_text(std::string(64, 'a') + ".b"));
  std::string long_name;
  for (int i = 0; i < 50; ++i) long_name += "abcd.";
  EXPECT_FALSE(name_from_text(long_name + "abcdef"));
  EXPECT_EQ(name_to_text(name_from_text(".")->span()), ".");
}

TEST(Message, WriterCompressesNames) {
  uint8_t buf[512];
  Writer w(buf, sizeof buf);
  w.header(1, 0, 1, 1, 0, 0);
  auto n = name_from_text("web.default.svc.cluster.local");
  w.name(n->span());
  w.u16(type::kCNAME);
  w.u16(kClassIN);
  size_t at = w.begin_rr(n->span(), type::kCNAME, kClassIN, 5);
  auto t = name_from_text("other.DEFAULT.svc.cluster.local");
  w.name(t->span());
  w.end_rr(at);
  ASSERT_TRUE(w.ok());
  // Owner is a pointer to the question; the target is "other" + a pointer.
  EXPECT_EQ(w.size(), 12u + n->len + 4 + 2 + 10 + 1 + 5 + 2);
  auto m = parse_message({buf, w.size()});
  ASSERT_TRUE(m);
  ASSERT_EQ(m->answer.size(), 1u);
  EXPECT_EQ(m->answer[0].name, "web.default.svc.cluster.local.");
  EXPECT_EQ(m->answer[0].text, "other.default.svc.cluster.local.");
}

TEST(Message, WriterStopsAtCapacity) {
  uint8_t buf[20];
  Writer w(buf, sizeof buf);
  w.header(1, 0, 1, 0, 0, 0);
  auto n = name_from_text("web.default.svc.cluster.local");
  w.name(n->span());
  EXPECT_FALSE(w.ok());
  EXPECT_LE(w.size(), sizeof buf);
}

std::vector<uint8_t> header(uint16_t qd, uint16_t flags = 0) {
  std::vector<uint8_t> p(12, 0);
  store_u16(p.data(), 7);
  store_u16(p.data() + 2, flags);
  store_u16(p.data() + 4, qd);
  return p;
}

TEST(MessageBadInput, TruncatedHeaderDropped) {
  std::vector<uint8_t> p = {1, 2, 3};
  EXPECT_EQ(parse_query(p).status, ParseStatus::kDrop);
  EXPECT_EQ(parse_query({}).status, ParseStatus::kDrop);
}

TEST(MessageBadInput, ResponsesDropped) {
  auto p = query("a.b", type::kA);
  p[2] |= 0x80;
  EXPECT_EQ(parse_query(p).status, ParseStatus::kDrop);
}

TEST(MessageBadInput, QdcountNotOne) {
  auto p = header(0);
  EXPECT_EQ(parse_query(p).status, ParseStatus::kFormErr);
  p = query("a.b", type::kA);
  store_u16(p.data() + 4, 2);
  EXPECT_EQ(parse_query(p).status, ParseStatus::kFormErr);
}

TEST(MessageBadInput, OpcodeNotImplemented) {
  auto p = query("a.b", type::kA);
  p[2] |= 0x28;  // opcode 5 (UPDATE)
  EXPECT_EQ(parse_query(p).status, ParseStatus::kNotImp);
}

TEST(MessageBadInput, CompressionLoop) {
  auto p = header(1);
  p.push_back(0xC0);
  p.push_back(12);  // points at itself
  p.insert(p.end(), {0, 1, 0, 1});
  EXPECT_EQ(parse_query(p).status, ParseStatus::kFormErr);
  auto q = header(1);
  q.insert(q.end(), {1, 'a', 0xC0, 12, 0, 1, 0, 1});  // back to its own start
  EXPECT_EQ(parse_query(q).status, ParseStatus::kFormErr);
  auto f = header(1);
  f.insert(f.end(), {0xC0, 16, 0, 1, 0, 1, 0});  // forward pointer
  EXPECT_EQ(parse_query(f).status, ParseStatus::kFormErr);
}

TEST(MessageBadInput, LabelPastPacket) {
  auto p = header(1);
  p.insert(p.end(), {40, 'a', 'b'});
  EXPECT_EQ(parse_query(p).status, ParseStatus::kFormErr);
  auto r = header(1);
  r.insert(r.end(), {0x41, 'a', 0, 0, 1, 0, 1});  // reserved label type
  EXPECT_EQ(parse_query(r).status, ParseStatus::kFormErr);
}

TEST(MessageBadInput, NameTooLong) {
  auto p = header(1);
  for (int i = 0; i < 5; ++i) {
    p.push_back(63);
    p.insert(p.end(), 63, 'x');
  }
  p.insert(p.end(), {0, 0, 1, 0, 1});
  EXPECT_EQ(parse_query(p).status, ParseStatus::kFormErr);
}

TEST(MessageBadInput, MissingQtype) {
  auto p = header(1);
  p.insert(p.end(), {1, 'a', 0, 0});
  EXPECT_EQ(parse_query(p).status, ParseStatus::kFormErr);
}

TEST(MessageBadInput, EdnsProblems) {
  // Two OPT records.
  auto p = query("a.b", type::kA, 1232);
  store_u16(p.data() + 10, 2);
  p.insert(p.end(), {0, 0, 41, 4, 0, 0, 0, 0, 0, 0, 0});
  EXPECT_EQ(parse_query(p).status, ParseStatus::kFormErr);
  // OPT rdata longer than the packet.
  auto q = query("a.b", type::kA, 1232);
  store_u16(q.data() + q.size() - 2, 50);
  EXPECT_EQ(parse_query(q).status, ParseStatus::kFormErr);
  // Option length past the rdata.
  auto o = query("a.b", type::kA, 1232);
  store_u16(o.data() + o.size() - 2, 4);
  o.insert(o.end(), {0, 10, 0, 9});
  EXPECT_EQ(parse_query(o).status, ParseStatus::kFormErr);
  // Version 1: BADVERS.
  auto v = query("a.b", type::kA, 1232);
  v[v.size() - 5] = 1;
  EXPECT_EQ(parse_query(v).status, ParseStatus::kBadVers);
  // OPT in the question.
  EXPECT_EQ(parse_query(query("a.b", type::kOPT)).status, ParseStatus::kFormErr);
}

TEST(MessageBadInput, HeaderOnlyErrorsNeverAmplify) {
  auto p = header(3);
  uint8_t out[512];
  size_t n = write_header_only(p, Rcode::kFormErr, out, sizeof out);
  EXPECT_EQ(n, 12u);
  EXPECT_LE(n, p.size());
  EXPECT_EQ(out[3] & 0xF, 1);
  EXPECT_EQ(out[2] & 0x80, 0x80);
}

TEST(Message, ParseMessageRejectsGarbage) {
  std::vector<uint8_t> p = header(1);
  store_u16(p.data() + 6, 5);
  p.insert(p.end(), {0, 0, 1, 0, 1, 0xC0});
  EXPECT_FALSE(parse_message(p));
}

}  // namespace
}  // namespace endpointd::dns
