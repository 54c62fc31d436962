// The request-head parser and query decoding.
#include "httpd/request.h"

#include <gtest/gtest.h>

namespace endpointd::httpd {
namespace {

TEST(RequestHead, ParsesLineAndHeaders) {
  auto r = parse_request_head(
      "GET /debug/state?format=full&x=1 HTTP/1.1\r\nHost: a\r\nX-Thing:  v1 \r\nx-thing: v2");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->method, "GET");
  EXPECT_EQ(r->path, "/debug/state");
  EXPECT_EQ(r->query, "format=full&x=1");
  EXPECT_EQ(r->version_minor, 1);
  EXPECT_EQ(r->header("host"), "a");
  EXPECT_EQ(r->header("x-thing"), "v1, v2");
  EXPECT_EQ(r->header("absent"), "");
}

TEST(RequestHead, Http10) {
  auto r = parse_request_head("HEAD / HTTP/1.0");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->version_minor, 0);
  EXPECT_EQ(r->query, "");
}

TEST(RequestHead, RejectsMalformed) {
  for (const char* bad :
       {"", "GET", "GET /", "GET / HTTP/2.0", "GET x HTTP/1.1", "GET http://a/ HTTP/1.1",
        "G(T / HTTP/1.1", "GET / HTTP/1.1\r\nNoColon", "GET / HTTP/1.1\r\n folded: x",
        "GET / HTTP/1.1\r\nBad Name: x", "GET / HTTP/1.1\nHost: a", "GET /a\rb HTTP/1.1",
        "GET / HTTP/1.1\r\n\r\nHost: a"}) {
    EXPECT_FALSE(parse_request_head(bad).ok()) << "accepted: " << bad;
  }
}

TEST(RequestHead, ParamDecoding) {
  Request r;
  r.query = "a=1&name=hello%20world&plus=a+b&enc=%2Fx%3D&bad=%zz%4&empty=&flag&a=2&k%20y=v";
  EXPECT_EQ(r.param("a"), "1");
  EXPECT_EQ(r.param("name"), "hello world");
  EXPECT_EQ(r.param("plus"), "a b");
  EXPECT_EQ(r.param("enc"), "/x=");
  EXPECT_EQ(r.param("bad"), "%zz%4");
  EXPECT_EQ(r.param("empty"), "");
  EXPECT_EQ(r.param("flag"), "");
  EXPECT_EQ(r.param("k y"), "v");
  EXPECT_EQ(r.param("missing"), "");
}

}  // namespace
}  // namespace endpointd::httpd
