// The one ADDR:PORT parser: every form a listen flag, an upstream or a config key takes.
#include "model/hostport.h"

#include <gtest/gtest.h>

namespace endpointd::model {
namespace {

TEST(HostPort, AcceptsEveryFormItDocuments) {
  struct Row {
    const char* in;
    std::optional<uint16_t> default_port;
    const char* host;
    uint16_t port;
  };
  const Row rows[] = {
      {"127.0.0.1:53", {}, "127.0.0.1", 53},
      {"[::1]:5353", {}, "::1", 5353},
      {":10256", {}, "", 10256},
      {"localhost:0", {}, "localhost", 0},
      {"0.0.0.0:65535", {}, "0.0.0.0", 65535},
      {"10.0.0.1", 53, "10.0.0.1", 53},
      {"fd00::1", 53, "fd00::1", 53},
      {"[fd00::1]", 53, "fd00::1", 53},
      {"[fd00::1]:54", 53, "fd00::1", 54},
  };
  for (const auto& r : rows) {
    auto hp = parse_host_port(r.in, r.default_port);
    ASSERT_TRUE(hp) << r.in << ": " << hp.error();
    EXPECT_EQ(hp->host, r.host) << r.in;
    EXPECT_EQ(hp->port, r.port) << r.in;
  }
}

TEST(HostPort, RejectsWithAnErrorNamingTheValue) {
  const char* bad[] = {"nope:53", "1.2.3.4:99999", "1.2.3.4:", "1.2.3.4:x",  "[::1",       "[::1]x",
                       "1.2.3.4", "::1",           "",         "1.2.3.4:-1", "1.2.3.4:53 "};
  for (const char* in : bad) {
    auto hp = parse_host_port(in);
    ASSERT_FALSE(hp) << in;
    EXPECT_NE(hp.error().find(std::string("\"") + in + "\""), std::string::npos) << hp.error();
  }
  EXPECT_FALSE(parse_host_port("", 53));
  EXPECT_FALSE(parse_host_port("nope", 53));
}

TEST(HostPort, LoopbackIsOnlyWhatThisHostAloneCanReach) {
  EXPECT_TRUE(parse_host_port("127.0.0.1:1")->loopback());
  EXPECT_TRUE(parse_host_port("127.1.2.3:1")->loopback());
  EXPECT_TRUE(parse_host_port("[::1]:1")->loopback());
  EXPECT_TRUE(parse_host_port("localhost:1")->loopback());
  EXPECT_FALSE(parse_host_port(":1")->loopback());  // every address
  EXPECT_FALSE(parse_host_port("0.0.0.0:1")->loopback());
  EXPECT_FALSE(parse_host_port("[::]:1")->loopback());
  EXPECT_FALSE(parse_host_port("10.0.0.1:1")->loopback());
}

TEST(HostPort, PrintsIPv6InBrackets) {
  EXPECT_EQ((HostPort{"::1", 80}.str()), "[::1]:80");
  EXPECT_EQ((HostPort{"10.0.0.1", 80}.str()), "10.0.0.1:80");
}

}  // namespace
}  // namespace endpointd::model
