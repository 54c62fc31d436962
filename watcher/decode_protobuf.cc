// Kubernetes protobuf list pages → model types, for the lists that carry most of what an agent
// reads at start: EndpointSlices (100,000 endpoints in a 10k-service cluster). The same checks
// as the JSON decoder (decode_rules.h), so that an object is kept or refused alike whichever
// encoding the API server chose.
//
// The wire format, read by hand: a page is the bytes "k8s\0", then a runtime.Unknown message
// (typeMeta = 1 {apiVersion = 1, kind = 2}, raw = 2, contentEncoding = 3, contentType = 4)
// whose `raw` is the list (EndpointSliceList: metadata = 1 ListMeta {resourceVersion = 2,
// continue = 3}, items = 2). Field numbers are those of k8s.io/api's generated.proto (proto2).
// Strings are read as views into the page and copied once, into the model; protobuf's
// generated classes would copy each into a message first and allocate for every endpoint's
// nested messages, on the path that decides how soon a starting agent is ready, and would tie
// watcher/ to the generated-code library.
#include <cstdint>
#include <vector>

#include "watcher/decode.h"
#include "watcher/decode_rules.h"

namespace endpointd::watcher {

using model::ObjectKind;

namespace {

using rules::DecodeFailure;
using rules::fail;
using rules::in_item;

// Bytes that are not protobuf, or a field of the wrong wire type. In the page's own framing
// (the envelope, the list, an item's length) the whole page is refused: nothing after a wrong
// length can be trusted. Inside an item, cut out of the page by a sound length, only that item
// is, as JSON refuses one object it cannot read.
struct WireFailure {
  std::string reason;
};

class Wire {
 public:
  enum Type : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };
  struct Field {
    uint32_t number = 0;
    uint32_t type = 0;
    uint64_t varint = 0;
    std::string_view bytes;
  };

  Wire(std::string_view in, const char* what)
      : p_(in.data()), end_(in.data() + in.size()), what_(what) {}

  // The next field; false at the end of the message.
  bool next(Field& f) {
    if (p_ == end_) return false;
    const uint64_t tag = varint();
    f.number = static_cast<uint32_t>(tag >> 3);
    f.type = static_cast<uint32_t>(tag & 7);
    if (f.number == 0 || (tag >> 3) > 0x1fffffff) bad("a field number out of range");
    switch (f.type) {
      case kVarint:
        f.varint = varint();
        break;
      case kFixed64:
        skip(8);
        break;
      case kBytes: {
        const uint64_t n = varint();
        if (n > static_cast<uint64_t>(end_ - p_)) bad("a length past the end");
        f.bytes = std::string_view(p_, n);
        p_ += n;
        break;
      }
      case kFixed32:
        skip(4);
        break;
      default:
        bad("wire type " + std::to_string(f.type));
    }
    return true;
  }

  // The field's value as the type the schema gives it; another wire type is malformed.
  std::string_view bytes(const Field& f) const {
    if (f.type != kBytes) bad("field " + std::to_string(f.number) + " is not length-delimited");
    return f.bytes;
  }
  uint64_t number(const Field& f) const {
    if (f.type != kVarint) bad("field " + std::to_string(f.number) + " is not a varint");
    return f.varint;
  }

 private:
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) bad("a number cut short");
      const auto b = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    bad("a number longer than 10 bytes");
  }
  void skip(size_t n) {
    if (n > static_cast<size_t>(end_ - p_)) bad("a fixed-size value past the end");
    p_ += n;
  }
  [[noreturn]] void bad(const std::string& why) const {
    throw WireFailure{std::string(what_) + ": " + why};
  }

  const char* p_;
  const char* end_;
  const char* what_;
};

// A map<string, string> entry: key = 1, value = 2.
std::pair<std::string_view, std::string_view> map_entry(std::string_view entry) {
  Wire w(entry, "a map entry");
  Wire::Field f;
  std::string_view key, value;
  while (w.next(f)) {
    if (f.number == 1) key = w.bytes(f);
    if (f.number == 2) value = w.bytes(f);
  }
  return {key, value};
}

// A message holding only `name = 1` (ForZone, ForNode).
std::string name_of(std::string_view message) {
  Wire w(message, "a hint");
  Wire::Field f;
  std::string_view name;
  while (w.next(f))
    if (f.number == 1) name = w.bytes(f);
  return std::string(name);
}

// The endpoints and ports of the slice being read, as byte ranges until the slice's address
// type is known (fields may come in any order). One per thread: reused across slices.
struct SliceScratch {
  std::vector<std::string_view> endpoints;
  std::vector<std::string_view> ports;
};

model::Endpoint decode_endpoint(std::string_view bytes, model::AddressType type) {
  model::Endpoint e;
  Wire w(bytes, "an endpoint");
  Wire::Field f;
  std::optional<std::string_view> conditions, hints, target_ref;
  while (w.next(f)) {
    switch (f.number) {
      case 1:
        rules::add_address(e, type, w.bytes(f));
        break;
      case 2:
        conditions = w.bytes(f);
        break;
      case 3:
        e.hostname = w.bytes(f);
        break;
      case 4:
        target_ref = w.bytes(f);
        break;
      case 6:
        e.node_name = w.bytes(f);
        break;
      case 7:
        e.zone = w.bytes(f);
        break;
      case 8:
        hints = w.bytes(f);
        break;
      default:
        break;  // deprecatedTopology, and fields newer than this agent
    }
  }
  rules::check_addresses(e, type);
  if (conditions) {
    // An unset (nil) condition keeps the API's meaning (model::EndpointConditions), as in JSON.
    Wire c(*conditions, "an endpoint's conditions");
    while (c.next(f)) {
      if (f.number == 1) e.conditions.ready = c.number(f) != 0;
      if (f.number == 2) e.conditions.serving = c.number(f) != 0;
      if (f.number == 3) e.conditions.terminating = c.number(f) != 0;
    }
  }
  if (hints) {
    std::vector<std::string> zones, nodes;
    Wire h(*hints, "an endpoint's hints");
    while (h.next(f)) {
      if (f.number == 1) zones.push_back(name_of(h.bytes(f)));
      if (f.number == 2) nodes.push_back(name_of(h.bytes(f)));
    }
    e.hint_zones = std::move(zones);
    e.hint_nodes = std::move(nodes);
  }
  if (target_ref) {
    model::ObjectRef ref;
    Wire r(*target_ref, "an endpoint's targetRef");
    while (r.next(f)) {
      if (f.number == 1) ref.kind = r.bytes(f);
      if (f.number == 2) ref.ns = r.bytes(f);
      if (f.number == 3) ref.name = r.bytes(f);
      if (f.number == 4) ref.uid = r.bytes(f);
    }
    e.target_ref = std::move(ref);
  }
  return e;
}

// An EndpointSlice (metadata = 1, endpoints = 2, ports = 3, addressType = 4). `ns` and `name`
// are set as soon as the metadata is read, for the error of a slice refused after that.
model::EndpointSlice decode_slice(std::string_view bytes, std::string& ns, std::string& name) {
  thread_local SliceScratch scratch;
  scratch.endpoints.clear();
  scratch.ports.clear();
  model::EndpointSlice s;
  std::optional<std::string_view> meta;
  std::string_view address_type;
  size_t endpoint_count = 0;
  Wire w(bytes, "an EndpointSlice");
  Wire::Field f;
  // A fault in the slice's own fields is thrown once its name is read, when it can be, so
  // that the error names the slice and its last good version is kept.
  std::optional<WireFailure> fault;
  try {
    while (w.next(f)) {
      switch (f.number) {
        case 1:
          meta = w.bytes(f);
          break;
        case 2:
          // Counted past the limit, not kept: the refusal needs no more.
          if (++endpoint_count <= rules::kMaxSliceEndpoints)
            scratch.endpoints.push_back(w.bytes(f));
          break;
        case 3:
          scratch.ports.push_back(w.bytes(f));
          break;
        case 4:
          address_type = w.bytes(f);
          break;
        default:
          break;
      }
    }
  } catch (const WireFailure& e) {
    fault = e;
  }
  if (!meta) {
    if (fault) throw *fault;
    fail("metadata missing");
  }
  // ObjectMeta: name = 1, namespace = 3, resourceVersion = 6, labels = 11, annotations = 12.
  Wire m(*meta, "an EndpointSlice's metadata");
  while (m.next(f)) {
    switch (f.number) {
      case 1:
        name = m.bytes(f);
        break;
      case 3:
        ns = m.bytes(f);
        break;
      case 6:
        s.resource_version = m.bytes(f);
        break;
      case 11: {
        auto [k, v] = map_entry(m.bytes(f));
        if (k == rules::kServiceNameLabel) s.service_name = v;
        if (k == rules::kProxyNameLabel) s.service_proxy_name = v;
        break;
      }
      case 12: {
        auto [k, v] = map_entry(m.bytes(f));
        if (k == rules::kTriggerTimeAnnotation) rules::set_trigger_time(s, v);
        break;
      }
      default:
        break;
    }
  }
  if (fault) throw *fault;
  rules::check_name(name);
  s.key = {ns.empty() ? std::string("default") : ns, name};
  s.address_type = rules::address_type(address_type);

  for (size_t i = 0; i < scratch.ports.size(); ++i) {
    // EndpointPort: name = 1, protocol = 2, port = 3, appProtocol = 4. No port: "all ports",
    // nothing to program.
    auto p = in_item("ports", i, [&]() -> std::optional<model::EndpointPort> {
      model::EndpointPort p;
      std::string_view protocol;
      std::optional<int64_t> port;
      Wire pw(scratch.ports[i], "an EndpointSlice's port");
      while (pw.next(f)) {
        if (f.number == 1) p.name = pw.bytes(f);
        if (f.number == 2) protocol = pw.bytes(f);
        // int32 on the wire; the value as sent, not cut to 32 bits, so that one out of
        // range is refused as in JSON (a negative one is sign-extended to 64).
        if (f.number == 3) port = static_cast<int64_t>(pw.number(f));
        if (f.number == 4) p.app_protocol = pw.bytes(f);
      }
      p.protocol = rules::protocol(protocol, "");
      if (!port) return std::nullopt;
      p.port = rules::port(*port, ".port", false);
      return p;
    });
    if (p) s.ports.push_back(std::move(*p));
  }
  if (endpoint_count > rules::kMaxSliceEndpoints)
    fail("endpoints: more than 1000 endpoints in one slice");
  s.endpoints.reserve(scratch.endpoints.size());
  for (size_t i = 0; i < scratch.endpoints.size(); ++i)
    s.endpoints.push_back(in_item(
        "endpoints", i, [&] { return decode_endpoint(scratch.endpoints[i], s.address_type); }));
  return s;
}

// The list inside a page: runtime.Unknown's raw bytes, after the magic.
std::string_view unwrap(std::string_view body, std::string_view want_kind) {
  constexpr std::string_view kMagic("k8s\0", 4);
  if (!body.starts_with(kMagic)) throw WireFailure{"no k8s protobuf header"};
  Wire w(body.substr(kMagic.size()), "the envelope");
  Wire::Field f;
  std::string_view raw, encoding, kind;
  bool has_raw = false;
  while (w.next(f)) {
    if (f.number == 1) {
      Wire t(w.bytes(f), "the envelope's typeMeta");
      Wire::Field tf;
      while (t.next(tf))
        if (tf.number == 2) kind = t.bytes(tf);
    }
    if (f.number == 2) {
      raw = w.bytes(f);
      has_raw = true;
    }
    if (f.number == 3) encoding = w.bytes(f);
  }
  if (!has_raw) throw WireFailure{"no object in the envelope"};
  if (!encoding.empty())
    throw WireFailure{"content encoding \"" + std::string(encoding) + "\" is not supported"};
  if (!kind.empty() && kind != want_kind)
    throw WireFailure{"the envelope holds a " + std::string(kind) + ", expected " +
                      std::string(want_kind)};
  return raw;
}

void read_list_meta(Wire& w, const Wire::Field& f, ListMeta& out) {
  Wire m(w.bytes(f), "the list's metadata");
  Wire::Field mf;
  while (m.next(mf)) {
    if (mf.number == 2) out.resource_version = m.bytes(mf);
    if (mf.number == 3) out.continue_token = m.bytes(mf);
  }
}

}  // namespace

bool protobuf_list_kind(ObjectKind kind) {
  return kind == ObjectKind::kEndpointSlice;
}

Result<DecodedList> decode_list_protobuf(std::string_view body, ObjectKind kind) {
  if (!protobuf_list_kind(kind))
    return Error{"protobuf lists of " + std::string(model::to_string(kind)) + " are not read"};
  DecodedList out;
  try {
    Wire w(unwrap(body, "EndpointSliceList"), "the list");
    Wire::Field f;
    ListMeta meta;
    while (w.next(f)) {
      if (f.number == 1) read_list_meta(w, f, meta);
      if (f.number != 2) continue;
      std::string ns, name;
      const std::string_view item = w.bytes(f);
      std::string reason;
      try {
        out.objects.push_back(decode_slice(item, ns, name));
        continue;
      } catch (const DecodeFailure& e) {
        reason = e.reason;
      } catch (const WireFailure& e) {
        reason = "malformed protobuf: " + e.reason;
      }
      out.errors.push_back(rules::describe(kind, ns, name) + ": " + reason);
      if (!name.empty()) out.failed.push_back({ns.empty() ? "default" : ns, name});
    }
    out.resource_version = std::move(meta.resource_version);
    out.continue_token = std::move(meta.continue_token);
  } catch (const WireFailure& e) {
    return Error{"malformed protobuf list: " + e.reason};
  }
  return out;
}

Result<ListMeta> peek_list_meta_protobuf(std::string_view body, ObjectKind kind) {
  if (!protobuf_list_kind(kind))
    return Error{"protobuf lists of " + std::string(model::to_string(kind)) + " are not read"};
  ListMeta meta;
  try {
    // Items are skipped by their lengths, not read.
    Wire w(unwrap(body, "EndpointSliceList"), "the list");
    Wire::Field f;
    while (w.next(f))
      if (f.number == 1) read_list_meta(w, f, meta);
  } catch (const WireFailure& e) {
    return Error{"malformed protobuf list: " + e.reason};
  }
  return meta;
}

std::optional<StatusFields> decode_status_protobuf(std::string_view body) {
  try {
    // Status: message = 3, reason = 4, code = 6.
    Wire w(unwrap(body, "Status"), "the Status");
    Wire::Field f;
    StatusFields out;
    while (w.next(f)) {
      if (f.number == 3) out.message = w.bytes(f);
      if (f.number == 4) out.reason = w.bytes(f);
      if (f.number == 6) out.code = static_cast<int32_t>(w.number(f));
    }
    return out;
  } catch (const WireFailure&) {
    return std::nullopt;
  }
}

}  // namespace endpointd::watcher
