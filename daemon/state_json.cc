// Hand-written JSON: the shape is small and fixed, and this keeps field order stable.
#include "daemon/state_json.h"

#include "daemon/version.h"
#include "watcher/yaml_json.h"

namespace endpointd::daemon {

namespace {

using watcher::append_json_string;

class Json {
 public:
  std::string out;
  void key(std::string_view k) {
    comma();
    append_json_string(out, k);
    out.push_back(':');
    first_ = true;  // the value follows without a comma
  }
  void str(std::string_view v) {
    comma();
    append_json_string(out, v);
  }
  void num(uint64_t v) {
    comma();
    out += std::to_string(v);
  }
  void num_d(double v) {
    comma();
    char b[32];
    std::snprintf(b, sizeof b, "%.3f", v);
    out += b;
  }
  void boolean(bool v) {
    comma();
    out += v ? "true" : "false";
  }
  void raw(std::string_view v) {
    comma();
    out += v;
  }
  void open(char c) {
    comma();
    out.push_back(c);
    first_ = true;
  }
  void close(char c) {
    out.push_back(c);
    first_ = false;
  }
  void kv(std::string_view k, std::string_view v) {
    key(k);
    str(v);
  }

 private:
  void comma() {
    if (!first_) out.push_back(',');
    first_ = false;
  }
  bool first_ = true;
};

void ips(Json& j, std::string_view k, const std::vector<model::IpAddr>& v) {
  j.key(k);
  j.open('[');
  for (const auto& a : v) j.str(a.str());
  j.close(']');
}

void service(Json& j, const model::ServiceState& st) {
  const auto& s = st.service;
  j.open('{');
  j.kv("namespace", s.key.ns);
  j.kv("name", s.key.name);
  j.kv("type", model::to_string(s.type));
  j.key("headless");
  j.boolean(s.headless);
  ips(j, "clusterIPs", s.cluster_ips);
  if (!s.external_ips.empty()) ips(j, "externalIPs", s.external_ips);
  if (!s.load_balancer_ips.empty()) ips(j, "loadBalancerIPs", s.load_balancer_ips);
  if (!s.external_name.empty()) j.kv("externalName", s.external_name);
  j.kv("sessionAffinity", s.session_affinity_client_ip ? "ClientIP" : "None");
  j.kv("internalTrafficPolicy", model::to_string(s.internal_traffic_policy));
  j.kv("externalTrafficPolicy", model::to_string(s.external_traffic_policy));
  j.key("ports");
  j.open('[');
  for (const auto& p : s.ports) {
    j.open('{');
    j.kv("name", p.name);
    j.kv("protocol", model::to_string(p.protocol));
    j.key("port");
    j.num(p.port);
    j.key("targetPort");
    if (p.target_port_name.empty())
      j.num(p.target_port_number);
    else
      j.str(p.target_port_name);
    if (p.node_port) {
      j.key("nodePort");
      j.num(p.node_port);
    }
    j.close('}');
  }
  j.close(']');
  j.key("endpoints");
  j.open('[');
  for (const auto& e : st.endpoints) {
    j.open('{');
    j.kv("address", e.address.str());
    j.key("ready");
    j.boolean(e.conditions.ready);
    j.key("serving");
    j.boolean(e.conditions.serving);
    j.key("terminating");
    j.boolean(e.conditions.terminating);
    if (!e.node_name.empty()) j.kv("node", e.node_name);
    if (!e.zone.empty()) j.kv("zone", e.zone);
    if (!e.hostname.empty()) j.kv("hostname", e.hostname);
    if (e.target_ref) j.kv("pod", e.target_ref->ns + "/" + e.target_ref->name);
    j.key("ports");
    j.open('[');
    for (const auto& p : e.ports) {
      j.open('{');
      j.kv("name", p.name);
      j.kv("protocol", model::to_string(p.protocol));
      j.key("port");
      j.num(p.port);
      j.close('}');
    }
    j.close(']');
    j.close('}');
  }
  j.close(']');
  j.close('}');
}

}  // namespace

StateQuery summary_query() {
  return StateQuery{{"sinks", "feed", "drains", "drainCluster", "sourceErrors"}, ""};
}

Result<StateQuery> parse_state_query(std::string_view section, std::string_view service) {
  if (section.empty() && service.empty()) return summary_query();
  StateQuery q;
  size_t start = 0;
  while (start <= section.size() && !section.empty()) {
    size_t comma = section.find(',', start);
    std::string_view s =
        section.substr(start, comma == std::string_view::npos ? section.npos : comma - start);
    if (s == "all") {
      for (const char* k : kSections) q.sections.insert(k);
    } else if (!s.empty()) {
      bool known = false;
      for (const char* k : kSections) known = known || s == k;
      if (!known) {
        std::string names = "all";
        for (const char* k : kSections) names += std::string(", ") + k;
        return Error{"unknown section \"" + std::string(s) + "\" (one of " + names + ")"};
      }
      q.sections.insert(std::string(s));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (!service.empty()) {
    auto slash = service.find('/');
    if (slash == 0 || slash == service.npos || slash + 1 == service.size() ||
        service.find('/', slash + 1) != service.npos)
      return Error{"service \"" + std::string(service) + "\" is not namespace/name"};
    q.service = std::string(service);
    q.sections.insert("services");
  }
  return q;
}

void write_json(const DebugState& st, const StateQuery& q,
                const std::function<bool(std::string_view)>& out) {
  constexpr size_t kPiece = 64 * 1024;
  Json j;
  bool open = true;
  // Hands a piece to the reader once it is big enough (or at the end).
  auto flush = [&](bool last) {
    if (!open || (!last && j.out.size() < kPiece)) return;
    open = out(j.out);
    j.out.clear();
  };
  auto want = [&](const char* s) { return q.sections.count(s) > 0; };
  j.open('{');
  const auto& snap = *st.snapshot;
  // Who answers, for `endpointd status` to check before it reads anything else.
  j.kv("agent", "endpointd");
  j.kv("version", kVersion);
  j.key("stateSchema");
  j.num(kStateSchema);
  j.kv("source", st.source);
  j.key("generation");
  j.num(snap.generation);
  j.key("synced");
  j.boolean(snap.synced);
  j.kv("node", st.node_name);
  size_t endpoints = 0;
  for (const auto& s : snap.services) endpoints += s->endpoints.size();
  j.key("counts");
  j.open('{');
  j.key("services");
  j.num(snap.services.size());
  j.key("endpoints");
  j.num(endpoints);
  j.key("nodes");
  j.num(snap.nodes.size());
  j.close('}');
  if (want("services")) {
    j.key("services");
    j.open('[');
    for (const auto& s : snap.services) {
      if (!open) return;
      if (!q.service.empty() && s->service.key.ns + "/" + s->service.key.name != q.service)
        continue;
      service(j, *s);
      flush(false);
    }
    j.close(']');
  }
  if (want("nodes")) {
    j.key("nodes");
    j.open('[');
    for (const auto& n : snap.nodes) {
      j.str(n->name);
      flush(false);
    }
    j.close(']');
  }
  if (want("sinks")) {
    j.key("sinks");
    j.open('[');
    auto now = pipeline::AckBoard::Clock::now();
    for (const auto& e : st.sinks) {
      j.open('{');
      j.kv("name", e.consumer);
      j.key("appliedGeneration");
      j.num(e.generation());
      if (e.snapshot) {
        j.key("appliedSecondsAgo");
        j.num_d(std::chrono::duration<double>(now - e.applied_at).count());
      }
      j.close('}');
    }
    j.close(']');
  }
  if (want("feed")) {
    j.key("feed");
    if (!st.feed_subscribers) {
      j.raw("null");
    } else {
      j.open('[');
      for (const auto& f : *st.feed_subscribers) {
        j.open('{');
        j.kv("client", f.client);
        j.kv("api", f.api);
        j.kv("peer", f.peer);
        j.kv("subscription", f.subscription);
        j.key("sentVersion");
        j.num(f.sent_version);
        j.key("ackedVersion");
        j.num(f.acked_version);
        j.key("ackedGeneration");
        j.num(f.acked_generation);
        j.key("nacks");
        j.num(f.nacks);
        j.kv("lastNack", f.last_nack);
        j.key("connected");
        j.boolean(f.connected);
        j.key("holding");
        j.boolean(f.holding);
        j.kv("lapsed", f.lapsed);
        j.close('}');
      }
      j.close(']');
    }
  }
  if (want("drains")) {
    j.key("drains");
    j.raw(st.drains_json);
  }
  if (want("drainCluster")) {
    j.key("drainCluster");
    j.raw(st.drain_cluster_json);
  }
  if (want("sourceErrors")) {
    j.key("sourceErrors");
    j.open('[');
    for (const auto& e : st.source_errors) {
      j.open('{');
      j.kv("where", e.where);
      j.kv("reason", e.reason);
      j.close('}');
    }
    j.close(']');
  }
  j.close('}');
  flush(true);
}

std::string to_json(const DebugState& st) {
  StateQuery all;
  for (const char* k : kSections) all.sections.insert(k);
  std::string s;
  write_json(st, all, [&](std::string_view piece) {
    s += piece;
    return true;
  });
  return s;
}

}  // namespace endpointd::daemon
