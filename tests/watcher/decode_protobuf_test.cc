// EndpointSlice lists in protobuf: every slice the JSON decoder keeps comes out the same, every
// slice it refuses is refused with the same error, and bytes that are not such a list are an
// error for the page, never a crash or a half-read object.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/fakeapi/protobuf_encode.h"
#include "tests/watcher/kube_test_util.h"
#include "watcher/decode.h"

namespace endpointd::watcher {
namespace {

using model::ObjectKind;

// Slices in JSON, each one also encodable in protobuf.
const std::vector<std::string>& slices() {
  static const std::vector<std::string> all = {
      // Everything endpointd reads.
      R"({"metadata":{"name":"web-1","namespace":"prod","uid":"u1","resourceVersion":"41",
          "labels":{"kubernetes.io/service-name":"web",
                    "service.kubernetes.io/service-proxy-name":"other","app":"web"},
          "annotations":{"endpoints.kubernetes.io/last-change-trigger-time":"2026-11-27T10:00:00Z",
                         "note":"x"}},
         "addressType":"IPv4",
         "endpoints":[
           {"addresses":["10.0.0.1"],"conditions":{"ready":false,"terminating":true},
            "hostname":"h1","nodeName":"node-a","zone":"zone-a",
            "hints":{"forZones":[{"name":"zone-a"},{"name":"zone-b"}],"forNodes":[{"name":"node-a"}]},
            "targetRef":{"kind":"Pod","namespace":"prod","name":"web-0","uid":"p0","resourceVersion":"7"},
            "deprecatedTopology":{"k":"v"}},
           {"addresses":["10.0.0.2","10.0.0.3"]},
           {"addresses":["10.0.0.4"],"conditions":{}}],
         "ports":[{"name":"http","protocol":"TCP","port":8080,"appProtocol":"h2c"},
                  {"name":"all"},
                  {"name":"dns","protocol":"UDP","port":53}]})",
      R"({"metadata":{"name":"web-v6","labels":{"kubernetes.io/service-name":"web"}},
          "addressType":"IPv6","endpoints":[{"addresses":["fd00::1"],"conditions":{"serving":false}}],
          "ports":[{"port":80}]})",
      R"({"metadata":{"name":"ext","namespace":"prod"},"addressType":"FQDN",
          "endpoints":[{"addresses":["db.example.com"]}],"ports":[{"port":5432}]})",
      R"({"metadata":{"name":"empty","namespace":"prod"},"addressType":"IPv4"})",
      // Refused, each for its own reason.
      R"({"metadata":{"name":"no-type","namespace":"prod"},"endpoints":[{"addresses":["10.0.0.1"]}]})",
      R"({"metadata":{"name":"bad-type","namespace":"prod"},"addressType":"IPX"})",
      R"({"metadata":{"name":"bad-ip","namespace":"prod"},"addressType":"IPv4",
          "endpoints":[{"addresses":["10.0.0.1"]},{"addresses":["10.0.0.300"]}]})",
      R"({"metadata":{"name":"v6-in-v4","namespace":"prod"},"addressType":"IPv4",
          "endpoints":[{"addresses":["fd00::1"]}]})",
      R"({"metadata":{"name":"no-address","namespace":"prod"},"addressType":"IPv4",
          "endpoints":[{"addresses":[]}]})",
      R"({"metadata":{"name":"port-zero","namespace":"prod"},"addressType":"IPv4",
          "ports":[{"port":0}]})",
      R"({"metadata":{"name":"port-high","namespace":"prod"},"addressType":"IPv4",
          "ports":[{"port":80},{"port":70000}]})",
      R"({"metadata":{"name":"port-negative","namespace":"prod"},"addressType":"IPv4",
          "ports":[{"port":-1}]})",
      R"({"metadata":{"name":"icmp","namespace":"prod"},"addressType":"IPv4",
          "ports":[{"protocol":"ICMP","port":1}]})",
      R"({"metadata":{"namespace":"prod"},"addressType":"IPv4"})",
      R"({"addressType":"IPv4"})",
      R"({"metadata":{"name":")" + std::string(254, 'n') +
          R"(","namespace":"prod"},"addressType":"IPv4"})",
  };
  return all;
}

std::string json_list(const std::vector<std::string>& items, const std::string& cont) {
  std::string out = R"({"kind":"EndpointSliceList","metadata":{"resourceVersion":"99")";
  if (!cont.empty()) out += R"(,"continue":")" + cont + "\"";
  out += R"(},"items":[)";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out + "]}";
}

std::string protobuf_list(const std::vector<std::string>& items, const std::string& cont) {
  std::vector<std::string> encoded;
  for (const auto& j : items) {
    auto pb = fakeapi::endpoint_slice_protobuf(j);
    EXPECT_TRUE(pb) << j;
    encoded.push_back(pb.value_or(""));
  }
  std::vector<std::string_view> views(encoded.begin(), encoded.end());
  return fakeapi::protobuf_list_page("discovery.k8s.io/v1", "EndpointSliceList", 99, cont, views);
}

TEST(DecodeProtobuf, EverySliceDecodesOrIsRefusedAsFromJson) {
  auto from_json = decode_list(json_list(slices(), "next-7"), ObjectKind::kEndpointSlice);
  auto from_pb =
      decode_list_protobuf(protobuf_list(slices(), "next-7"), ObjectKind::kEndpointSlice);
  ASSERT_TRUE(from_json) << from_json.error();
  ASSERT_TRUE(from_pb) << from_pb.error();
  EXPECT_EQ(from_pb->resource_version, "99");
  EXPECT_EQ(from_pb->continue_token, "next-7");
  ASSERT_EQ(from_json->objects.size(), 4u);
  ASSERT_EQ(from_pb->objects.size(), from_json->objects.size());
  for (size_t i = 0; i < from_json->objects.size(); ++i)
    kubetest::expect_same_slice(std::get<model::EndpointSlice>(from_pb->objects[i]),
                                std::get<model::EndpointSlice>(from_json->objects[i]));
  EXPECT_EQ(from_pb->errors, from_json->errors);
  EXPECT_EQ(from_pb->errors.size(), 12u);
  EXPECT_EQ(from_pb->failed, from_json->failed);

  // What the first slice holds, so that "the same" is not the same mistake twice.
  const auto& s = std::get<model::EndpointSlice>(from_pb->objects[0]);
  EXPECT_EQ(s.key.str(), "prod/web-1");
  EXPECT_EQ(s.service_name, "web");
  EXPECT_EQ(s.service_proxy_name, "other");
  ASSERT_EQ(s.ports.size(), 2u);  // the port-less one means "all ports": nothing to program
  EXPECT_EQ(s.ports[0].app_protocol, "h2c");
  EXPECT_EQ(s.ports[1].protocol, model::Protocol::kUDP);
  ASSERT_EQ(s.endpoints.size(), 3u);
  EXPECT_FALSE(s.endpoints[0].conditions.ready);
  EXPECT_TRUE(s.endpoints[0].conditions.serving);  // nil serving is serving
  EXPECT_TRUE(s.endpoints[0].conditions.terminating);
  EXPECT_EQ(s.endpoints[0].hint_zones.size(), 2u);
  EXPECT_EQ(s.endpoints[0].target_ref->name, "web-0");
  EXPECT_EQ(s.endpoints[1].addresses.size(), 2u);
  EXPECT_NE(s.trigger_time, std::chrono::system_clock::time_point{});
  EXPECT_NE(std::find(from_pb->errors.begin(), from_pb->errors.end(),
                      "EndpointSlice prod/bad-ip: endpoints[1].addresses: invalid IP address "
                      "\"10.0.0.300\""),
            from_pb->errors.end());
  EXPECT_NE(std::find(from_pb->errors.begin(), from_pb->errors.end(),
                      "EndpointSlice prod/port-negative: ports[0].port: port -1 out of range"),
            from_pb->errors.end());
}

TEST(DecodeProtobuf, MoreThanAThousandEndpointsIsRefusedAsFromJson) {
  std::string big =
      R"({"metadata":{"name":"big","namespace":"prod"},"addressType":"IPv4","endpoints":[)";
  for (int i = 0; i < 1001; ++i)
    big += std::string(i ? "," : "") + R"({"addresses":["10.1.)" + std::to_string(i / 250) + "." +
           std::to_string(i % 250 + 1) + "\"]}";
  big += "]}";
  auto from_json = decode_list(json_list({big}, ""), ObjectKind::kEndpointSlice);
  auto from_pb = decode_list_protobuf(protobuf_list({big}, ""), ObjectKind::kEndpointSlice);
  ASSERT_TRUE(from_json && from_pb);
  ASSERT_EQ(from_pb->errors.size(), 1u);
  EXPECT_EQ(from_pb->errors, from_json->errors);
}

// Bytes that are wrong inside one item (its length sound) refuse that item alone, as JSON
// refuses one object it cannot read; a port is read as sent, not cut to 32 bits.
TEST(DecodeProtobuf, AMalformedItemIsRefusedAloneAndPortsAreNotTruncated) {
  auto encode = [](const std::string& json) { return *fakeapi::endpoint_slice_protobuf(json); };
  const std::string base = R"({"metadata":{"name":"NAME","namespace":"prod"},"addressType":"IPv4",
      "endpoints":[{"addresses":["10.0.0.1"]}]})";
  auto named = [&](const std::string& n) {
    std::string j = base;
    return j.replace(j.find("NAME"), 4, n);
  };
  // addressType (4) as a varint; a port (3) of 2^32 + 80 as a varint.
  const std::string bad_type = encode(named("bad-type")) + std::string("\x20\x05", 2);
  const std::string big_port =
      encode(named("big-port")) + std::string("\x1a\x06\x18\xd0\x80\x80\x80\x10", 8);
  const std::string good = encode(named("good"));
  const std::vector<std::string_view> items{bad_type, good, big_port};
  auto d = decode_list_protobuf(
      fakeapi::protobuf_list_page("discovery.k8s.io/v1", "EndpointSliceList", 1, "", items),
      ObjectKind::kEndpointSlice);
  ASSERT_TRUE(d) << d.error();
  ASSERT_EQ(d->objects.size(), 1u);
  EXPECT_EQ(std::get<model::EndpointSlice>(d->objects[0]).key.name, "good");
  EXPECT_EQ(d->errors,
            (std::vector<std::string>{
                "EndpointSlice prod/bad-type: malformed protobuf: an EndpointSlice: field 4 is "
                "not length-delimited",
                "EndpointSlice prod/big-port: ports[0].port: port 4294967376 out of range"}));
  EXPECT_EQ(d->failed.size(), 2u);
}

TEST(DecodeProtobuf, PeekReadsTheListMetaWithoutTheItems) {
  auto meta =
      peek_list_meta_protobuf(protobuf_list(slices(), "next-8"), ObjectKind::kEndpointSlice);
  ASSERT_TRUE(meta) << meta.error();
  EXPECT_EQ(meta->resource_version, "99");
  EXPECT_EQ(meta->continue_token, "next-8");
  EXPECT_FALSE(peek_list_meta_protobuf(protobuf_list(slices(), ""), ObjectKind::kService));
}

// kube-apiserver writes every string field of the envelope, empty ones too: contentEncoding (3)
// and contentType (4) after raw. Empty is none; a content encoding is refused by name.
TEST(DecodeProtobuf, EnvelopeAsTheApiServerWritesIt) {
  const std::string page = protobuf_list({slices()[0]}, "");
  auto d =
      decode_list_protobuf(page + std::string("\x1a\x00\x22\x00", 4), ObjectKind::kEndpointSlice);
  ASSERT_TRUE(d) << d.error();
  EXPECT_EQ(d->objects.size(), 1u);
  auto gz = decode_list_protobuf(page + std::string("\x1a\x04gzip", 6), ObjectKind::kEndpointSlice);
  ASSERT_FALSE(gz);
  EXPECT_EQ(gz.error(), "malformed protobuf list: content encoding \"gzip\" is not supported");
}

// Every prefix of a page (a body cut short) and every single-byte change: a result or an error,
// and a page cut inside its items is an error, never a shorter list taken as whole.
TEST(DecodeProtobuf, DamagedPagesAreErrorsNotCrashes) {
  const std::string page = protobuf_list({slices()[0], slices()[1]}, "c");
  size_t errors = 0;
  for (size_t n = 0; n < page.size(); ++n) {
    auto d = decode_list_protobuf(std::string_view(page.data(), n), ObjectKind::kEndpointSlice);
    auto m = peek_list_meta_protobuf(std::string_view(page.data(), n), ObjectKind::kEndpointSlice);
    errors += !d;
    EXPECT_EQ(static_cast<bool>(d), static_cast<bool>(m)) << "cut at " << n;
  }
  // Cut anywhere, the envelope's length for `raw` runs past the end.
  EXPECT_EQ(errors, page.size());
  for (size_t i = 0; i < page.size(); ++i) {
    std::string bad = page;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    (void)decode_list_protobuf(bad, ObjectKind::kEndpointSlice);
    (void)peek_list_meta_protobuf(bad, ObjectKind::kEndpointSlice);
  }

  auto no_magic = decode_list_protobuf(page.substr(4), ObjectKind::kEndpointSlice);
  ASSERT_FALSE(no_magic);
  EXPECT_EQ(no_magic.error(), "malformed protobuf list: no k8s protobuf header");
  const std::string services =
      fakeapi::protobuf_list_page("v1", "ServiceList", 1, "", std::vector<std::string_view>{});
  auto wrong = decode_list_protobuf(services, ObjectKind::kEndpointSlice);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(
      wrong.error(),
      "malformed protobuf list: the envelope holds a ServiceList, expected EndpointSliceList");
  // A group (wire type 3), which no Kubernetes message uses.
  auto group = decode_list_protobuf(std::string("k8s\0\x0b", 5), ObjectKind::kEndpointSlice);
  ASSERT_FALSE(group);
  EXPECT_EQ(group.error(), "malformed protobuf list: the envelope: wire type 3");
}

TEST(DecodeProtobuf, StatusIsReadForTheLog) {
  auto st = decode_status_protobuf(fakeapi::protobuf_status(410, "Expired", "too old"));
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 410);
  EXPECT_EQ(st->reason, "Expired");
  EXPECT_EQ(st->message, "too old");
  EXPECT_FALSE(decode_status_protobuf(R"({"kind":"Status","code":410})"));
}

}  // namespace
}  // namespace endpointd::watcher
