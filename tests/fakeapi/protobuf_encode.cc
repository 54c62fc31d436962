// Protobuf encoding for the fake API server (protobuf_encode.h).
#include "tests/fakeapi/protobuf_encode.h"

#include <simdjson.h>

namespace endpointd::fakeapi {
namespace dom = simdjson::dom;

namespace {

// Appends fields to a message; a nested message is written whole, then added as bytes.
class Writer {
 public:
  void varint(uint32_t field, uint64_t v) {
    tag(field, 0);
    raw_varint(v);
  }
  void bytes(uint32_t field, std::string_view b) {
    tag(field, 2);
    raw_varint(b.size());
    out_.append(b);
  }
  std::string& str() { return out_; }

 private:
  void tag(uint32_t field, uint32_t type) {
    raw_varint((static_cast<uint64_t>(field) << 3) | type);
  }
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

// Thrown when a value has no protobuf form.
struct NotRepresentable {};

std::optional<dom::element> field(const dom::element& obj, std::string_view name) {
  dom::element v;
  if (obj.at_key(name).get(v) != simdjson::SUCCESS || v.is_null()) return std::nullopt;
  return v;
}

void string_field(Writer& w, uint32_t number, const dom::element& obj, std::string_view name) {
  auto v = field(obj, name);
  if (!v) return;
  std::string_view s;
  if (v->get_string().get(s) != simdjson::SUCCESS) throw NotRepresentable{};
  w.bytes(number, s);
}

void bool_field(Writer& w, uint32_t number, const dom::element& obj, std::string_view name) {
  auto v = field(obj, name);
  if (!v) return;
  bool b;
  if (v->get_bool().get(b) != simdjson::SUCCESS) throw NotRepresentable{};
  w.varint(number, b ? 1 : 0);
}

// An int32 field: negative values as ten-byte varints, as protobuf writes them.
void int32_field(Writer& w, uint32_t number, const dom::element& obj, std::string_view name) {
  auto v = field(obj, name);
  if (!v) return;
  int64_t i;
  if (v->get_int64().get(i) != simdjson::SUCCESS || i < INT32_MIN || i > INT32_MAX)
    throw NotRepresentable{};
  w.varint(number, static_cast<uint64_t>(i));
}

template <typename Each>
void each(const dom::element& obj, std::string_view name, const Each& f) {
  auto v = field(obj, name);
  if (!v) return;
  dom::array a;
  if (v->get_array().get(a) != simdjson::SUCCESS) throw NotRepresentable{};
  for (dom::element e : a) f(e);
}

void string_map(Writer& w, uint32_t number, const dom::element& obj, std::string_view name) {
  auto v = field(obj, name);
  if (!v) return;
  dom::object o;
  if (v->get_object().get(o) != simdjson::SUCCESS) throw NotRepresentable{};
  for (auto [k, val] : o) {
    std::string_view s;
    if (val.get_string().get(s) != simdjson::SUCCESS) throw NotRepresentable{};
    Writer entry;
    entry.bytes(1, k);
    entry.bytes(2, s);
    w.bytes(number, entry.str());
  }
}

// A message-valued field, written by `fill` when present.
template <typename Fill>
void message(Writer& w, uint32_t number, const dom::element& obj, std::string_view name,
             const Fill& fill) {
  auto v = field(obj, name);
  if (!v) return;
  if (!v->is_object()) throw NotRepresentable{};
  Writer m;
  fill(m, *v);
  w.bytes(number, m.str());
}

void named(Writer& w, const dom::element& e) {
  if (!e.is_object()) throw NotRepresentable{};
  string_field(w, 1, e, "name");
}

void endpoint(Writer& w, const dom::element& e) {
  if (!e.is_object()) throw NotRepresentable{};
  each(e, "addresses", [&](const dom::element& a) {
    std::string_view s;
    if (a.get_string().get(s) != simdjson::SUCCESS) throw NotRepresentable{};
    w.bytes(1, s);
  });
  message(w, 2, e, "conditions", [](Writer& c, const dom::element& v) {
    bool_field(c, 1, v, "ready");
    bool_field(c, 2, v, "serving");
    bool_field(c, 3, v, "terminating");
  });
  string_field(w, 3, e, "hostname");
  message(w, 4, e, "targetRef", [](Writer& r, const dom::element& v) {
    string_field(r, 1, v, "kind");
    string_field(r, 2, v, "namespace");
    string_field(r, 3, v, "name");
    string_field(r, 4, v, "uid");
    string_field(r, 5, v, "apiVersion");
    string_field(r, 6, v, "resourceVersion");
  });
  string_field(w, 6, e, "nodeName");
  string_field(w, 7, e, "zone");
  message(w, 8, e, "hints", [](Writer& h, const dom::element& v) {
    each(v, "forZones", [&](const dom::element& z) {
      Writer m;
      named(m, z);
      h.bytes(1, m.str());
    });
    each(v, "forNodes", [&](const dom::element& n) {
      Writer m;
      named(m, n);
      h.bytes(2, m.str());
    });
  });
}

}  // namespace

std::optional<std::string> endpoint_slice_protobuf(std::string_view json) {
  dom::parser parser;
  dom::element root;
  if (parser.parse(json.data(), json.size()).get(root) != simdjson::SUCCESS || !root.is_object())
    return std::nullopt;
  try {
    Writer w;
    message(w, 1, root, "metadata", [](Writer& m, const dom::element& v) {
      string_field(m, 1, v, "name");
      string_field(m, 3, v, "namespace");
      string_field(m, 5, v, "uid");
      string_field(m, 6, v, "resourceVersion");
      string_map(m, 11, v, "labels");
      string_map(m, 12, v, "annotations");
    });
    each(root, "endpoints", [&](const dom::element& e) {
      Writer m;
      endpoint(m, e);
      w.bytes(2, m.str());
    });
    each(root, "ports", [&](const dom::element& p) {
      if (!p.is_object()) throw NotRepresentable{};
      Writer m;
      string_field(m, 1, p, "name");
      string_field(m, 2, p, "protocol");
      int32_field(m, 3, p, "port");
      string_field(m, 4, p, "appProtocol");
      w.bytes(3, m.str());
    });
    string_field(w, 4, root, "addressType");
    return std::move(w.str());
  } catch (const NotRepresentable&) {
    return std::nullopt;
  }
}

namespace {
std::string envelope(std::string_view api_version, std::string_view kind, std::string_view raw) {
  Writer type;
  type.bytes(1, api_version);
  type.bytes(2, kind);
  Writer unknown;
  unknown.bytes(1, type.str());
  unknown.bytes(2, raw);
  return std::string("k8s\0", 4) + unknown.str();
}
}  // namespace

std::string protobuf_list_page(std::string_view api_version, std::string_view list_kind,
                               uint64_t resource_version, std::string_view continue_token,
                               const std::vector<std::string_view>& items) {
  Writer meta;
  meta.bytes(2, std::to_string(resource_version));
  if (!continue_token.empty()) meta.bytes(3, continue_token);
  Writer list;
  list.bytes(1, meta.str());
  for (auto item : items) list.bytes(2, item);
  return envelope(api_version, list_kind, list.str());
}

std::string protobuf_status(int code, std::string_view reason, std::string_view message) {
  Writer st;
  st.bytes(2, "Failure");
  st.bytes(3, message);
  st.bytes(4, reason);
  st.varint(6, static_cast<uint64_t>(static_cast<int64_t>(code)));
  return envelope("v1", "Status", st.str());
}

}  // namespace endpointd::fakeapi
