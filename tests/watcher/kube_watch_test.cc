// Watch stream framing and event parsing, on bytes.
#include <gtest/gtest.h>
#include <simdjson.h>

#include "watcher/kube_watch.h"

namespace endpointd::watcher {
namespace {

std::vector<std::string> feed_in_pieces(const std::string& stream, size_t piece) {
  LineBuffer buf(1 << 20);
  std::vector<std::string> lines;
  for (size_t off = 0; off < stream.size(); off += piece) {
    EXPECT_TRUE(buf.feed(std::string_view(stream).substr(off, piece), [&](std::string_view l) {
      lines.emplace_back(l);
      return true;
    }));
  }
  return lines;
}

TEST(LineBuffer, ReassemblesLinesSplitAnywhere) {
  const std::string stream = "{\"a\":1}\n{\"b\":2}\r\n\n  \n{\"c\":3}\n{\"partial";
  for (size_t piece = 1; piece <= stream.size(); ++piece) {
    auto lines = feed_in_pieces(stream, piece);
    ASSERT_EQ(lines.size(), 3u) << "piece " << piece;
    EXPECT_EQ(lines[0], "{\"a\":1}");
    EXPECT_EQ(lines[1], "{\"b\":2}");
    EXPECT_EQ(lines[2], "{\"c\":3}");
  }
}

TEST(LineBuffer, RefusesAnOverlongLineAndStopsWhenAsked) {
  LineBuffer buf(8);
  auto ignore = [](std::string_view) { return true; };
  EXPECT_TRUE(buf.feed("12345", ignore));
  EXPECT_FALSE(buf.feed("67890", ignore));
  EXPECT_EQ(buf.pending_bytes(), 0u);

  LineBuffer stop(100);
  int seen = 0;
  EXPECT_FALSE(stop.feed("a\nb\nc\n", [&](std::string_view) { return ++seen < 2; }));
  EXPECT_EQ(seen, 2);
}

constexpr const char* kService =
    R"({"kind":"Service","apiVersion":"v1","metadata":{"name":"web","namespace":"prod","resourceVersion":"42"},"spec":{"clusterIP":"10.96.0.7","ports":[{"port":80}]}})";

TEST(WatchEvent, ParsesEachType) {
  simdjson::dom::parser p;
  for (const char* type : {"ADDED", "MODIFIED", "DELETED"}) {
    auto ev =
        parse_watch_event(std::string("{\"type\":\"") + type + "\",\"object\":" + kService + "}",
                          model::ObjectKind::kService, p);
    ASSERT_TRUE(ev.ok()) << ev.error();
    EXPECT_EQ(to_string(ev->type), type);
    EXPECT_EQ(ev->resource_version, "42");
    EXPECT_EQ(ev->key.ns, "prod");
    EXPECT_EQ(ev->key.name, "web");
    ASSERT_TRUE(ev->object.has_value()) << ev->decode_error;
  }
  auto bm = parse_watch_event(
      R"({"type":"BOOKMARK","object":{"kind":"Service","metadata":{"resourceVersion":"99"}}})",
      model::ObjectKind::kService, p);
  ASSERT_TRUE(bm.ok());
  EXPECT_EQ(bm->type, WatchEventType::kBookmark);
  EXPECT_EQ(bm->resource_version, "99");

  auto err = parse_watch_event(
      R"j({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version: 1 (5)"}})j",
      model::ObjectKind::kService, p);
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->type, WatchEventType::kError);
  EXPECT_TRUE(err->status.expired());
  auto other = parse_watch_event(
      R"({"type":"ERROR","object":{"kind":"Status","code":500,"reason":"InternalError","message":"boom"}})",
      model::ObjectKind::kService, p);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->status.expired());
}

TEST(WatchEvent, MalformedObjectKeepsPositionAndKey) {
  simdjson::dom::parser p;
  auto ev = parse_watch_event(
      R"({"type":"MODIFIED","object":{"kind":"Service","metadata":{"name":"web","namespace":"prod","resourceVersion":"43"},"spec":{"clusterIP":"bogus","ports":[{"port":80}]}}})",
      model::ObjectKind::kService, p);
  ASSERT_TRUE(ev.ok());
  EXPECT_FALSE(ev->object.has_value());
  EXPECT_FALSE(ev->decode_error.empty());
  EXPECT_EQ(ev->resource_version, "43");
  EXPECT_EQ(ev->key.name, "web");
}

TEST(WatchEvent, RejectsLinesThatAreNotEvents) {
  simdjson::dom::parser p;
  EXPECT_FALSE(parse_watch_event("{not json", model::ObjectKind::kService, p).ok());
  EXPECT_FALSE(parse_watch_event(R"({"object":{}})", model::ObjectKind::kService, p).ok());
  EXPECT_FALSE(parse_watch_event(R"({"type":"ADDED"})", model::ObjectKind::kService, p).ok());
  EXPECT_FALSE(
      parse_watch_event(R"({"type":"WHAT","object":{}})", model::ObjectKind::kService, p).ok());
  EXPECT_FALSE(parse_watch_event(R"({"type":"BOOKMARK","object":{"metadata":{}}})",
                                 model::ObjectKind::kService, p)
                   .ok());
}

TEST(ApiStatus, ParsesErrorBodies) {
  simdjson::dom::parser p;
  auto st = parse_status(R"({"kind":"Status","code":410,"reason":"Gone","message":"x"})", p);
  EXPECT_EQ(st.code, 410);
  EXPECT_TRUE(st.expired());
  EXPECT_EQ(parse_status("<html>", p).code, 0);
}

}  // namespace
}  // namespace endpointd::watcher
