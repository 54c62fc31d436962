// The fake API server's core/v1 Events and API discovery, for kubectl: the events.k8s.io/v1
// Events it stores, listed as core/v1 Events the way kube-apiserver converts them (and as the
// Table `kubectl get events` asks for), and the legacy discovery documents kubectl reads first.
#include <httplib.h>
#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "model/time.h"
#include "tests/fakeapi/fake_api.h"
#include "watcher/yaml_json.h"

namespace endpointd::fakeapi {

namespace {

std::string quote(std::string_view s) {
  std::string out;
  watcher::append_json_string(out, s);
  return out;
}

std::string status(int code, const std::string& reason, const std::string& message) {
  return R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":)" +
         quote(message) + R"(,"reason":)" + quote(reason) + R"(,"code":)" + std::to_string(code) +
         "}";
}

std::string str(simdjson::dom::element e, const char* key) {
  std::string_view v;
  if (e[key].get(v) != simdjson::SUCCESS) return "";
  return std::string(v);
}

std::string raw(simdjson::dom::element e, const char* key, const char* absent) {
  simdjson::dom::element v;
  if (e[key].get(v) != simdjson::SUCCESS || v.is_null()) return absent;
  return std::string(simdjson::minify(v));
}

// An events.k8s.io/v1 Event as core/v1 (kube-apiserver's Convert_v1_Event_To_core_Event):
// regarding -> involvedObject, note -> message, reportingController -> reportingComponent,
// deprecatedSource/FirstTimestamp/LastTimestamp/Count -> source/firstTimestamp/lastTimestamp/
// count; the rest by the same name. A zero time is null, an empty source {}, a zero count left
// out, as Go marshals them.
std::string to_core(simdjson::dom::element ev) {
  std::string out = R"({"kind":"Event","apiVersion":"v1","metadata":)" + raw(ev, "metadata", "{}") +
                    R"(,"involvedObject":)" + raw(ev, "regarding", "{}");
  for (auto [from, to] : {std::pair{"reason", "reason"}, std::pair{"note", "message"}})
    out += ",\"" + std::string(to) + "\":" + quote(str(ev, from));
  out += R"(,"source":)" + raw(ev, "deprecatedSource", "{}");
  out += R"(,"firstTimestamp":)" + raw(ev, "deprecatedFirstTimestamp", "null");
  out += R"(,"lastTimestamp":)" + raw(ev, "deprecatedLastTimestamp", "null");
  int64_t count = 0;
  if (ev["deprecatedCount"].get(count) == simdjson::SUCCESS && count != 0)
    out += R"(,"count":)" + std::to_string(count);
  out += R"(,"type":)" + quote(str(ev, "type"));
  out += R"(,"eventTime":)" + raw(ev, "eventTime", "null");
  simdjson::dom::element v;
  if (ev["series"].get(v) == simdjson::SUCCESS && !v.is_null())
    out += R"(,"series":)" + std::string(simdjson::minify(v));
  if (ev["related"].get(v) == simdjson::SUCCESS && !v.is_null())
    out += R"(,"related":)" + std::string(simdjson::minify(v));
  out += R"(,"action":)" + quote(str(ev, "action"));
  out += R"(,"reportingComponent":)" + quote(str(ev, "reportingController"));
  out += R"(,"reportingInstance":)" + quote(str(ev, "reportingInstance")) + "}";
  return out;
}

// A field of a core/v1 Event a field selector may name (kube's EventToSelectableFields plus
// metadata.name and metadata.namespace); false when the field is not selectable.
bool selectable(simdjson::dom::element core, const std::string& field, std::string& value) {
  static const char* const kInvolved[] = {"kind",       "namespace",       "name",     "uid",
                                          "apiVersion", "resourceVersion", "fieldPath"};
  for (const char* f : kInvolved)
    if (field == std::string("involvedObject.") + f) {
      value = str(core["involvedObject"], f);
      return true;
    }
  if (field == "metadata.name" || field == "metadata.namespace") {
    value = str(core["metadata"], field.c_str() + 9);
    return true;
  }
  if (field == "reason" || field == "type" || field == "reportingComponent") {
    value = str(core, field.c_str());
    return true;
  }
  if (field == "source") {
    value = str(core["source"], "component");
    return true;
  }
  return false;
}

struct Term {
  std::string field, value;
  bool equal = true;
};

// "a=b,c!=d" (also "=="); an error message when a term has no operator.
std::optional<std::vector<Term>> parse_selector(const std::string& s, std::string& error) {
  std::vector<Term> out;
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    std::string t = s.substr(at, end - at);
    at = end + 1;
    if (t.empty()) continue;
    Term term;
    size_t op = t.find("!=");
    size_t len = 2;
    if (op != std::string::npos) {
      term.equal = false;
    } else if ((op = t.find("==")) == std::string::npos) {
      op = t.find('=');
      len = 1;
    }
    if (op == std::string::npos || op == 0) {
      error = "invalid selector: '" + s + "'; can't understand '" + t + "'";
      return std::nullopt;
    }
    term.field = t.substr(0, op);
    term.value = t.substr(op + len);
    out.push_back(std::move(term));
  }
  return out;
}

// k8s.io/apimachinery's duration.HumanDuration (what `kubectl get` shows as LAST SEEN).
std::string human_duration(std::chrono::system_clock::duration d) {
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(d).count();
  if (secs < -1) return "<invalid>";
  if (secs < 0) return "0s";
  if (secs < 120) return std::to_string(secs) + "s";
  int64_t minutes = secs / 60;
  if (minutes < 10)
    return std::to_string(minutes) + "m" + (secs % 60 ? std::to_string(secs % 60) + "s" : "");
  if (minutes < 180) return std::to_string(minutes) + "m";
  int64_t hours = minutes / 60;
  if (hours < 8)
    return std::to_string(hours) + "h" + (minutes % 60 ? std::to_string(minutes % 60) + "m" : "");
  if (hours < 48) return std::to_string(hours) + "h";
  if (hours < 24 * 8)
    return std::to_string(hours / 24) + "d" + (hours % 24 ? std::to_string(hours % 24) + "h" : "");
  return std::to_string(hours / 24) + "d";
}

std::string since(simdjson::dom::element e, const char* key) {
  std::string t = str(e, key);
  if (t.empty()) return "<unknown>";
  auto at = model::parse_rfc3339(t);
  if (!at) return "<unknown>";
  return human_duration(std::chrono::system_clock::now() - *at);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// One row of kube-apiserver's Event table (printEvent, always wide: kubectl hides the
// priority-1 columns unless -o wide).
std::string table_row(simdjson::dom::element core, const std::string& core_json,
                      const std::string& include) {
  std::string first = str(core, "firstTimestamp").empty() ? since(core, "eventTime")
                                                          : since(core, "firstTimestamp");
  std::string last = str(core, "lastTimestamp").empty() ? first : since(core, "lastTimestamp");
  int64_t count = 0;
  if (core["count"].get(count) != simdjson::SUCCESS) count = 0;
  simdjson::dom::element series;
  if (core["series"].get(series) == simdjson::SUCCESS && !series.is_null()) {
    last = since(series, "lastObservedTime");
    if (series["count"].get(count) != simdjson::SUCCESS) count = 0;
  } else if (count == 0) {
    count = 1;  // singleton events carry no count in the new API
  }
  simdjson::dom::element involved = core["involvedObject"];
  std::string kind = lower(str(involved, "kind"));
  std::string name = str(involved, "name");
  std::string target = name.empty() ? kind : kind + "/" + name;
  std::string component = str(core["source"], "component");
  if (component.empty()) component = str(core, "reportingComponent");
  std::string host = str(core["source"], "host");
  if (host.empty()) host = str(core, "reportingInstance");
  std::string source = component.empty() ? "" : host.empty() ? component : component + ", " + host;
  std::string message = str(core, "message");
  while (!message.empty() && std::isspace(static_cast<unsigned char>(message.back())))
    message.pop_back();
  std::string row = R"({"cells":[)" + quote(last) + "," + quote(str(core, "type")) + "," +
                    quote(str(core, "reason")) + "," + quote(target) + "," +
                    quote(str(involved, "fieldPath")) + "," + quote(source) + "," + quote(message) +
                    "," + quote(first) + "," + std::to_string(count) + "," +
                    quote(str(core["metadata"], "name")) + "]";
  if (include == "Object") {
    row += R"(,"object":)" + core_json;
  } else if (include != "None") {
    row +=
        R"(,"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":)" +
        std::string(simdjson::minify(core["metadata"])) + "}";
  }
  return row + "}";
}

constexpr const char* kEventColumns =
    R"c([{"name":"Last Seen","type":"string","format":"","description":"The time at which the most recent occurrence of this event was recorded.","priority":0},)c"
    R"c({"name":"Type","type":"string","format":"","description":"Type of this event (Normal, Warning), new types could be added in the future","priority":0},)c"
    R"c({"name":"Reason","type":"string","format":"","description":"This should be a short, machine understandable string that gives the reason for the transition into the object's current status.","priority":0},)c"
    R"c({"name":"Object","type":"string","format":"","description":"The object that this event is about.","priority":0},)c"
    R"c({"name":"Subobject","type":"string","format":"","description":"If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.","priority":1},)c"
    R"c({"name":"Source","type":"string","format":"","description":"The component reporting this event. Should be a short machine understandable string.","priority":1},)c"
    R"c({"name":"Message","type":"string","format":"","description":"A human-readable description of the status of this operation.","priority":0},)c"
    R"c({"name":"First Seen","type":"string","format":"","description":"The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)","priority":1},)c"
    R"c({"name":"Count","type":"string","format":"","description":"The number of times this event has occurred.","priority":1},)c"
    R"c({"name":"Name","type":"string","format":"name","description":"Name must be unique within a namespace.","priority":1}])c";

}  // namespace

bool FakeApiServer::handle_core_events(const httplib::Request& req, httplib::Response& res) {
  // /api/v1/events (every namespace) or /api/v1/namespaces/NS/events.
  constexpr std::string_view kNs = "/api/v1/namespaces/";
  std::string ns;
  if (req.path == "/api/v1/events") {
    ns.clear();
  } else if (req.path.rfind(kNs, 0) == 0 && req.path.size() > kNs.size() + 7 &&
             req.path.compare(req.path.size() - 7, 7, "/events") == 0) {
    ns = req.path.substr(kNs.size(), req.path.size() - 7 - kNs.size());
    if (ns.find('/') != std::string::npos) return false;
  } else {
    return false;
  }
  if (req.method != "GET") {
    res.status = 405;
    res.set_content(status(405, "MethodNotAllowed", "core/v1 Events are only listed here"),
                    "application/json");
    return true;
  }
  if (req.get_param_value("watch") == "true" || req.get_param_value("watch") == "1") {
    res.status = 400;
    res.set_content(status(400, "BadRequest", "the fake API server does not watch Events"),
                    "application/json");
    return true;
  }
  std::string error;
  auto terms = parse_selector(req.get_param_value("fieldSelector"), error);
  if (!terms) {
    res.status = 400;
    res.set_content(status(400, "BadRequest", error), "application/json");
    return true;
  }
  {
    // A field that is not selectable is refused, whatever is stored.
    simdjson::dom::parser ep;
    simdjson::dom::element empty;
    std::string value;
    if (ep.parse(std::string(R"({"metadata":{},"involvedObject":{},"source":{}})")).get(empty) ==
        simdjson::SUCCESS)
      for (const auto& t : *terms)
        if (!selectable(empty, t.field, value)) {
          res.status = 400;
          res.set_content(status(400, "BadRequest", "field label not supported: " + t.field),
                          "application/json");
          return true;
        }
  }
  // Sorted by namespace and name, as etcd's keys list them.
  std::vector<const StoredEvent*> stored;
  for (const auto& e : events_)
    if (ns.empty() || e.ns == ns) stored.push_back(&e);
  std::sort(stored.begin(), stored.end(), [](const StoredEvent* a, const StoredEvent* b) {
    return std::tie(a->ns, a->name) < std::tie(b->ns, b->name);
  });
  std::vector<std::string> items;
  simdjson::dom::parser p, cp;
  for (const StoredEvent* e : stored) {
    std::string json = event_with_series(*e);
    simdjson::dom::element ev;
    if (p.parse(json).get(ev) != simdjson::SUCCESS) continue;
    std::string core = to_core(ev);
    simdjson::dom::element c;
    if (cp.parse(core).get(c) != simdjson::SUCCESS) continue;
    bool keep = true;
    for (const auto& t : *terms) {
      std::string value;
      selectable(c, t.field, value);
      keep = keep && (value == t.value) == t.equal;
    }
    if (!keep) continue;
    if (req.get_header_value("Accept").find("as=Table") != std::string::npos)
      items.push_back(table_row(c, core, req.get_param_value("includeObject")));
    else
      items.push_back(std::move(core));
  }
  std::string body;
  std::string rv = std::to_string(rv_);
  if (req.get_header_value("Accept").find("as=Table") != std::string::npos) {
    body = R"({"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":")" + rv +
           R"("},"columnDefinitions":)" + kEventColumns + R"(,"rows":[)";
  } else {
    body = R"({"kind":"EventList","apiVersion":"v1","metadata":{"resourceVersion":")" + rv +
           R"("},"items":[)";
  }
  for (size_t i = 0; i < items.size(); ++i) body += (i ? "," : "") + items[i];
  res.set_content(body + "]}", "application/json");
  return true;
}

bool FakeApiServer::handle_discovery(const httplib::Request& req, httplib::Response& res) {
  // Legacy discovery (kubectl falls back to it when the answer to /api is not aggregated).
  auto resource = [](const char* name, const char* singular, bool namespaced, const char* kind,
                     const char* verbs, const char* short_names) {
    return std::string(R"({"name":")") + name + R"(","singularName":")" + singular +
           R"(","namespaced":)" + (namespaced ? "true" : "false") + R"(,"kind":")" + kind +
           R"(","verbs":)" + verbs + (short_names[0] ? R"(,"shortNames":)" : "") + short_names +
           "}";
  };
  const char* read = R"(["get","list","watch"])";
  const char* events = R"(["create","get","list","patch"])";
  auto list = [](const std::string& gv, const std::vector<std::string>& rs) {
    std::string out = R"({"kind":"APIResourceList","apiVersion":"v1","groupVersion":")" + gv +
                      R"(","resources":[)";
    for (size_t i = 0; i < rs.size(); ++i) out += (i ? "," : "") + rs[i];
    return out + "]}";
  };
  std::string body;
  if (req.path == "/api") {
    body =
        R"({"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":")" +
        options_.host + ":" + std::to_string(port_) + R"("}]})";
  } else if (req.path == "/apis") {
    body = R"({"kind":"APIGroupList","apiVersion":"v1","groups":[)";
    const char* groups[] = {"discovery.k8s.io", "events.k8s.io", "authorization.k8s.io"};
    for (size_t i = 0; i < 3; ++i) {
      std::string g = groups[i];
      body += std::string(i ? "," : "") + R"({"name":")" + g +
              R"(","versions":[{"groupVersion":")" + g +
              R"(/v1","version":"v1"}],"preferredVersion":{"groupVersion":")" + g +
              R"(/v1","version":"v1"}})";
    }
    body += "]}";
  } else if (req.path == "/api/v1") {
    body = list("v1", {resource("events", "event", true, "Event", events, R"(["ev"])"),
                       resource("nodes", "node", false, "Node", read, R"(["no"])"),
                       resource("pods", "pod", true, "Pod", read, R"(["po"])"),
                       resource("services", "service", true, "Service", read, R"(["svc"])")});
  } else if (req.path == "/apis/events.k8s.io/v1") {
    body =
        list("events.k8s.io/v1", {resource("events", "event", true, "Event", events, R"(["ev"])")});
  } else if (req.path == "/apis/discovery.k8s.io/v1") {
    body = list("discovery.k8s.io/v1",
                {resource("endpointslices", "endpointslice", true, "EndpointSlice", read, "")});
  } else if (req.path == "/apis/authorization.k8s.io/v1") {
    body = list("authorization.k8s.io/v1",
                {resource("selfsubjectaccessreviews", "selfsubjectaccessreview", false,
                          "SelfSubjectAccessReview", R"(["create"])", "")});
  } else {
    return false;
  }
  res.set_content(body, "application/json");
  return true;
}

}  // namespace endpointd::fakeapi
