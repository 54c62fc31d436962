// Kubernetes JSON → model types, with validation. An object either decodes completely or is
// refused with a reason that names it; nothing half-decoded ever reaches the Store.
#include "watcher/decode.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <concepts>
#include <initializer_list>

#include "watcher/decode_rules.h"

namespace endpointd::watcher {

using model::ObjectKind;
namespace dom = simdjson::dom;

namespace {

// Failures are thrown (rules::DecodeFailure) and caught at decode_object's boundary:
// decoding is not a hot path for a single packet, and unwinding out of nested field readers
// keeps them readable.
using rules::DecodeFailure;
using rules::fail;
using rules::in_item;

class Reader {
 public:
  explicit Reader(std::vector<std::string>& warnings) : warnings_(warnings) {}

  static std::optional<dom::element> field(const dom::element& obj, std::string_view name) {
    dom::object o;
    if (obj.get_object().get(o) != simdjson::SUCCESS) return std::nullopt;
    dom::element v;
    if (o.at_key(name).get(v) != simdjson::SUCCESS) return std::nullopt;
    if (v.is_null()) return std::nullopt;
    return v;
  }

  static std::string str(const dom::element& obj, std::string_view name, std::string_view path) {
    return str(field(obj, name), name, path);
  }
  // A field's value found beforehand (see fields()).
  static std::string str(const std::optional<dom::element>& v, std::string_view name,
                         std::string_view path) {
    if (!v) return {};
    std::string_view s;
    if (v->get_string().get(s) != simdjson::SUCCESS)
      fail(std::string(path) + "." + std::string(name) + ": expected a string");
    return std::string(s);
  }

  static std::optional<int64_t> integer(const dom::element& obj, std::string_view name,
                                        std::string_view path) {
    auto v = field(obj, name);
    if (!v) return std::nullopt;
    int64_t i;
    if (v->get_int64().get(i) == simdjson::SUCCESS) return i;
    uint64_t u;
    if (v->get_uint64().get(u) == simdjson::SUCCESS)
      fail(std::string(path) + "." + std::string(name) + ": number too large");
    fail(std::string(path) + "." + std::string(name) + ": expected an integer");
  }

  static std::optional<bool> boolean(const dom::element& obj, std::string_view name,
                                     std::string_view path) {
    return boolean(field(obj, name), name, path);
  }
  static std::optional<bool> boolean(const std::optional<dom::element>& v, std::string_view name,
                                     std::string_view path) {
    if (!v) return std::nullopt;
    bool b;
    if (v->get_bool().get(b) != simdjson::SUCCESS)
      fail(std::string(path) + "." + std::string(name) + ": expected true or false");
    return b;
  }

  // The elements of a list field, read in place (none when the field is absent).
  class List {
   public:
    List() = default;
    explicit List(dom::array a) : a_(a), present_(true) {}
    dom::array::iterator begin() const { return present_ ? a_.begin() : dom::array::iterator(); }
    dom::array::iterator end() const { return present_ ? a_.end() : dom::array::iterator(); }
    size_t size() const { return present_ ? a_.size() : 0; }

   private:
    dom::array a_;
    bool present_ = false;
  };

  static List array(const dom::element& obj, std::string_view name, std::string_view path) {
    return array(field(obj, name), name, path);
  }
  static List array(const std::optional<dom::element>& v, std::string_view name,
                    std::string_view path) {
    if (!v) return {};
    dom::array a;
    if (v->get_array().get(a) != simdjson::SUCCESS)
      fail(std::string(path) + "." + std::string(name) + ": expected a list");
    return List(a);
  }

  // A map of strings: every value must be a string. With `only`, just those keys are kept
  // (the others are still checked): the kinds that read one or two labels do not copy all.
  static std::map<std::string, std::string> string_map(
      const std::optional<dom::element>& v, std::string_view name, std::string_view path,
      std::initializer_list<std::string_view> only = {}) {
    std::map<std::string, std::string> out;
    if (!v) return out;
    dom::object o;
    if (v->get_object().get(o) != simdjson::SUCCESS)
      fail(std::string(path) + "." + std::string(name) + ": expected a map");
    for (auto [k, val] : o) {
      std::string_view s;
      if (val.get_string().get(s) != simdjson::SUCCESS)
        fail(std::string(path) + "." + std::string(name) + "." + std::string(k) +
             ": expected a string");
      if (only.size() == 0 || std::find(only.begin(), only.end(), k) != only.end())
        out.emplace(std::string(k), std::string(s));
    }
    return out;
  }

  static model::IpAddr ip(std::string_view text, std::string_view path) {
    return rules::ip(text, path);
  }

  static uint16_t port(int64_t v, std::string_view path, bool allow_zero) {
    return rules::port(v, path, allow_zero);
  }

  static model::Protocol protocol(const dom::element& obj, std::string_view path) {
    return rules::protocol(str(obj, "protocol", path), path);
  }

  // Fields we do not read are ignored, as API clients must; they are reported as warnings
  // when they are not among the fields the API defines, which catches typos in manifests.
  void check_known(const dom::element& obj, std::string_view path,
                   std::initializer_list<std::string_view> known) {
    check_known(
        obj, [&] { return std::string(path); }, known);
  }
  // The values of the fields `names` of an object (absent or null: none), found in one pass
  // over its keys rather than one per name (field() for each scans the keys once per name).
  // With a key repeated, its first value counts, as for field(). `other(key)` is called for
  // each key not in `names`.
  template <size_t N, typename Other>
  static std::array<std::optional<dom::element>, N> scan(
      const dom::element& obj, const std::array<std::string_view, N>& names, const Other& other) {
    std::array<std::optional<dom::element>, N> out;
    std::array<bool, N> seen{};
    dom::object o;
    if (obj.get_object().get(o) != simdjson::SUCCESS) return out;
    for (auto [k, v] : o) {
      size_t i = 0;
      while (i < N && names[i] != k) ++i;
      if (i == N) {
        other(k);
      } else if (!seen[i]) {
        seen[i] = true;
        if (!v.is_null()) out[i] = v;
      }
    }
    return out;
  }
  template <size_t N>
  static std::array<std::optional<dom::element>, N> pick(
      const dom::element& obj, const std::array<std::string_view, N>& names) {
    return scan(obj, names, [](std::string_view) {});
  }

  // pick(), and the warnings of check_known for the keys that are neither in `names` nor in
  // `ignored`.
  template <size_t N, std::invocable PathFn>
  std::array<std::optional<dom::element>, N> fields(const dom::element& obj,
                                                    const std::array<std::string_view, N>& names,
                                                    std::initializer_list<std::string_view> ignored,
                                                    const PathFn& path) {
    return scan(obj, names, [&](std::string_view k) {
      if (std::find(ignored.begin(), ignored.end(), k) == ignored.end())
        warnings_.push_back(path() + ": unknown field \"" + std::string(k) + "\"");
    });
  }

  // `path()` makes the path's text, only when there is something to warn about.
  template <std::invocable PathFn>
  void check_known(const dom::element& obj, const PathFn& path,
                   std::initializer_list<std::string_view> known) {
    dom::object o;
    if (obj.get_object().get(o) != simdjson::SUCCESS) return;
    for (auto [k, v] : o) {
      (void)v;
      if (std::find(known.begin(), known.end(), k) == known.end())
        warnings_.push_back(path() + ": unknown field \"" + std::string(k) + "\"");
    }
  }

 private:
  std::vector<std::string>& warnings_;
};

struct Meta {
  std::string ns, name, uid, resource_version, deletion_timestamp;
  std::map<std::string, std::string> labels, annotations;
};

// `labels` / `annotations`: the keys the caller reads (empty: all of them).
Meta read_meta(const dom::element& obj, bool namespaced,
               std::initializer_list<std::string_view> labels = {},
               std::initializer_list<std::string_view> annotations = {}) {
  auto m = Reader::field(obj, "metadata");
  if (!m) fail("metadata missing");
  Meta meta;
  const auto [name, ns, uid, rv, deletion, label_map, annotation_map] =
      Reader::pick<7>(*m, {"name", "namespace", "uid", "resourceVersion", "deletionTimestamp",
                           "labels", "annotations"});
  meta.name = Reader::str(name, "name", "metadata");
  rules::check_name(meta.name);
  if (namespaced) {
    meta.ns = Reader::str(ns, "namespace", "metadata");
    if (meta.ns.empty()) meta.ns = "default";  // manifests may omit it, as kubectl allows
  }
  meta.uid = Reader::str(uid, "uid", "metadata");
  meta.resource_version = Reader::str(rv, "resourceVersion", "metadata");
  meta.deletion_timestamp = Reader::str(deletion, "deletionTimestamp", "metadata");
  meta.labels = Reader::string_map(label_map, "labels", "metadata", labels);
  meta.annotations = Reader::string_map(annotation_map, "annotations", "metadata", annotations);
  return meta;
}

std::string label(const Meta& m, const std::string& key) {
  auto it = m.labels.find(key);
  return it == m.labels.end() ? std::string() : it->second;
}

using rules::kProxyNameLabel;

std::string item_path(std::string_view list, size_t index) {
  return std::string(list) + "[" + std::to_string(index) + "]";
}

model::Service decode_service(const dom::element& obj, Reader& r) {
  Meta meta = read_meta(
      obj, true, {kProxyNameLabel},
      {"service.kubernetes.io/topology-mode", "service.kubernetes.io/topology-aware-hints"});
  model::Service s;
  s.key = {meta.ns, meta.name};
  s.uid = meta.uid;
  s.resource_version = meta.resource_version;
  s.service_proxy_name = label(meta, std::string(kProxyNameLabel));
  if (auto it = meta.annotations.find("service.kubernetes.io/topology-mode");
      it != meta.annotations.end())
    s.topology_mode = it->second;
  else if (auto it2 = meta.annotations.find("service.kubernetes.io/topology-aware-hints");
           it2 != meta.annotations.end())
    s.topology_mode = it2->second;

  auto spec = Reader::field(obj, "spec");
  if (!spec) fail("spec missing");
  r.check_known(*spec, "spec",
                {"type",
                 "clusterIP",
                 "clusterIPs",
                 "ports",
                 "selector",
                 "externalIPs",
                 "loadBalancerIP",
                 "loadBalancerSourceRanges",
                 "loadBalancerClass",
                 "sessionAffinity",
                 "sessionAffinityConfig",
                 "internalTrafficPolicy",
                 "externalTrafficPolicy",
                 "healthCheckNodePort",
                 "publishNotReadyAddresses",
                 "externalName",
                 "trafficDistribution",
                 "ipFamilies",
                 "ipFamilyPolicy",
                 "allocateLoadBalancerNodePorts"});

  std::string type = Reader::str(*spec, "type", "spec");
  if (type.empty() || type == "ClusterIP")
    s.type = model::ServiceType::kClusterIP;
  else if (type == "NodePort")
    s.type = model::ServiceType::kNodePort;
  else if (type == "LoadBalancer")
    s.type = model::ServiceType::kLoadBalancer;
  else if (type == "ExternalName")
    s.type = model::ServiceType::kExternalName;
  else
    fail("spec.type: unknown service type \"" + type + "\"");

  std::vector<std::string> ips;
  for (const auto& e : Reader::array(*spec, "clusterIPs", "spec")) {
    std::string_view v;
    if (e.get_string().get(v) != simdjson::SUCCESS) fail("spec.clusterIPs: expected strings");
    ips.emplace_back(v);
  }
  if (ips.empty()) {
    std::string one = Reader::str(*spec, "clusterIP", "spec");
    if (!one.empty()) ips.push_back(one);
  }
  for (const auto& ip : ips) {
    if (ip == "None") {
      s.headless = true;
      continue;
    }
    if (ip.empty()) continue;
    s.cluster_ips.push_back(Reader::ip(ip, "spec.clusterIPs"));
  }
  if (s.cluster_ips.size() == 2 && s.cluster_ips[0].family() == s.cluster_ips[1].family())
    fail("spec.clusterIPs: two addresses of the same family");
  if (s.cluster_ips.size() > 2) fail("spec.clusterIPs: more than two addresses");

  size_t i = 0;
  for (const auto& pe : Reader::array(*spec, "ports", "spec")) {
    s.ports.push_back(in_item("spec.ports", i++, [&] {
      model::ServicePort p;
      p.name = Reader::str(pe, "name", "");
      p.protocol = Reader::protocol(pe, "");
      auto port = Reader::integer(pe, "port", "");
      if (!port) fail(".port missing");
      p.port = Reader::port(*port, ".port", false);
      if (auto tp = Reader::field(pe, "targetPort")) {
        int64_t n;
        std::string_view name;
        if (tp->get_int64().get(n) == simdjson::SUCCESS) {
          p.target_port_number = Reader::port(n, ".targetPort", false);
        } else if (tp->get_string().get(name) == simdjson::SUCCESS) {
          // A numeric string is a number; anything else names a container port.
          int64_t v = 0;
          auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
          if (ec == std::errc() && ptr == name.data() + name.size())
            p.target_port_number = Reader::port(v, ".targetPort", false);
          else if (name.empty() || name.size() > 15)
            fail(".targetPort: invalid port name \"" + std::string(name) + "\"");
          else
            p.target_port_name = std::string(name);
        } else {
          fail(".targetPort: expected a number or a name");
        }
      } else {
        p.target_port_number = p.port;
      }
      if (auto np = Reader::integer(pe, "nodePort", ""))
        p.node_port = Reader::port(*np, ".nodePort", true);
      p.app_protocol = Reader::str(pe, "appProtocol", "");
      return p;
    }));
  }
  for (size_t a = 0; a < s.ports.size(); ++a)
    for (size_t b = a + 1; b < s.ports.size(); ++b)
      if (s.ports[a].name == s.ports[b].name)
        fail("spec.ports: duplicate port name \"" + s.ports[a].name + "\"");

  for (const auto& e : Reader::array(*spec, "externalIPs", "spec")) {
    std::string_view v;
    if (e.get_string().get(v) != simdjson::SUCCESS) fail("spec.externalIPs: expected strings");
    s.external_ips.push_back(Reader::ip(v, "spec.externalIPs"));
  }
  for (const auto& e : Reader::array(*spec, "loadBalancerSourceRanges", "spec")) {
    std::string_view v;
    if (e.get_string().get(v) != simdjson::SUCCESS)
      fail("spec.loadBalancerSourceRanges: expected strings");
    // The API allows surrounding spaces here; kube-proxy trims them too.
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    auto p = model::IpPrefix::parse(v);
    if (!p) fail("spec.loadBalancerSourceRanges: invalid CIDR \"" + std::string(v) + "\"");
    s.load_balancer_source_ranges.push_back(*p);
  }
  std::string affinity = Reader::str(*spec, "sessionAffinity", "spec");
  if (affinity == "ClientIP")
    s.session_affinity_client_ip = true;
  else if (!affinity.empty() && affinity != "None")
    fail("spec.sessionAffinity: unknown value \"" + affinity + "\"");
  if (auto cfg = Reader::field(*spec, "sessionAffinityConfig"))
    if (auto cip = Reader::field(*cfg, "clientIP"))
      if (auto t = Reader::integer(*cip, "timeoutSeconds", "spec.sessionAffinityConfig.clientIP")) {
        if (*t < 1 || *t > 86400)
          fail("spec.sessionAffinityConfig.clientIP.timeoutSeconds: out of range (1..86400)");
        s.session_affinity_timeout_seconds = static_cast<uint32_t>(*t);
      }
  auto policy = [&](std::string_view field) {
    std::string v = Reader::str(*spec, field, "spec");
    if (v.empty() || v == "Cluster") return model::TrafficPolicy::kCluster;
    if (v == "Local") return model::TrafficPolicy::kLocal;
    fail("spec." + std::string(field) + ": unknown value \"" + v + "\"");
  };
  s.internal_traffic_policy = policy("internalTrafficPolicy");
  s.external_traffic_policy = policy("externalTrafficPolicy");
  if (auto h = Reader::integer(*spec, "healthCheckNodePort", "spec"))
    s.health_check_node_port = Reader::port(*h, "spec.healthCheckNodePort", true);
  s.publish_not_ready_addresses =
      Reader::boolean(*spec, "publishNotReadyAddresses", "spec").value_or(false);
  s.external_name = Reader::str(*spec, "externalName", "spec");
  if (s.type == model::ServiceType::kExternalName && s.external_name.empty())
    fail("spec.externalName missing for an ExternalName service");
  s.traffic_distribution = Reader::str(*spec, "trafficDistribution", "spec");
  s.allocate_load_balancer_node_ports =
      Reader::boolean(*spec, "allocateLoadBalancerNodePorts", "spec").value_or(true);

  if (auto status = Reader::field(obj, "status"))
    if (auto lb = Reader::field(*status, "loadBalancer"))
      for (const auto& ing : Reader::array(*lb, "ingress", "status.loadBalancer")) {
        std::string ip = Reader::str(ing, "ip", "status.loadBalancer.ingress");
        // ipMode Proxy means the load balancer does not deliver to the VIP itself.
        std::string mode = Reader::str(ing, "ipMode", "status.loadBalancer.ingress");
        if (!ip.empty() && mode != "Proxy")
          s.load_balancer_ips.push_back(Reader::ip(ip, "status.loadBalancer.ingress.ip"));
      }
  return s;
}

model::EndpointSlice decode_slice(const dom::element& obj, Reader& r) {
  Meta meta = read_meta(obj, true, {rules::kServiceNameLabel, kProxyNameLabel},
                        {rules::kTriggerTimeAnnotation});
  model::EndpointSlice s;
  s.key = {meta.ns, meta.name};
  s.resource_version = meta.resource_version;
  s.service_name = label(meta, std::string(rules::kServiceNameLabel));
  s.service_proxy_name = label(meta, std::string(kProxyNameLabel));
  if (auto it = meta.annotations.find(std::string(rules::kTriggerTimeAnnotation));
      it != meta.annotations.end())
    rules::set_trigger_time(s, it->second);
  s.address_type = rules::address_type(Reader::str(obj, "addressType", ""));

  size_t i = 0;
  for (const auto& pe : Reader::array(obj, "ports", "")) {
    auto p = in_item("ports", i++, [&]() -> std::optional<model::EndpointPort> {
      model::EndpointPort p;
      p.name = Reader::str(pe, "name", "");
      p.protocol = Reader::protocol(pe, "");
      auto port = Reader::integer(pe, "port", "");
      if (!port) return std::nullopt;  // a nil port means "all ports": nothing to program
      p.port = Reader::port(*port, ".port", false);
      p.app_protocol = Reader::str(pe, "appProtocol", "");
      return p;
    });
    if (p) s.ports.push_back(std::move(*p));
  }
  i = 0;
  auto endpoints = Reader::array(obj, "endpoints", "");
  if (endpoints.size() > rules::kMaxSliceEndpoints)
    fail("endpoints: more than 1000 endpoints in one slice");
  s.endpoints.reserve(endpoints.size());
  for (const auto& ee : endpoints) {
    const size_t index = i++;
    // One pass over the endpoint's keys (100k endpoints at start: a lookup per field was the
    // largest part of decoding).
    // Named references, not a structured binding: the lambda below uses them (clang before
    // 16 cannot capture a structured binding).
    const auto fields = r.fields<7>(
        ee, {"addresses", "conditions", "hostname", "nodeName", "zone", "hints", "targetRef"},
        {"deprecatedTopology"}, [&] { return item_path("endpoints", index); });
    const auto& addresses = fields[0];
    const auto& conditions = fields[1];
    const auto& hostname = fields[2];
    const auto& node_name = fields[3];
    const auto& zone = fields[4];
    const auto& hints = fields[5];
    const auto& target_ref = fields[6];
    s.endpoints.push_back(in_item("endpoints", index, [&] {
      model::Endpoint e;
      for (const auto& ae : Reader::array(addresses, "addresses", "")) {
        std::string_view v;
        if (ae.get_string().get(v) != simdjson::SUCCESS) fail(".addresses: expected strings");
        rules::add_address(e, s.address_type, v);
      }
      rules::check_addresses(e, s.address_type);
      if (conditions) {
        const auto [ready, serving, terminating] =
            Reader::pick<3>(*conditions, {"ready", "serving", "terminating"});
        e.conditions.ready = Reader::boolean(ready, "ready", ".conditions").value_or(true);
        e.conditions.serving = Reader::boolean(serving, "serving", ".conditions").value_or(true);
        e.conditions.terminating =
            Reader::boolean(terminating, "terminating", ".conditions").value_or(false);
      }
      e.hostname = Reader::str(hostname, "hostname", "");
      e.node_name = Reader::str(node_name, "nodeName", "");
      e.zone = Reader::str(zone, "zone", "");
      if (const auto& h = hints) {
        std::vector<std::string> zones, nodes;
        for (const auto& z : Reader::array(*h, "forZones", ".hints"))
          zones.push_back(Reader::str(z, "name", ".hints.forZones"));
        for (const auto& n : Reader::array(*h, "forNodes", ".hints"))
          nodes.push_back(Reader::str(n, "name", ".hints.forNodes"));
        e.hint_zones = std::move(zones);
        e.hint_nodes = std::move(nodes);
      }
      if (target_ref) {
        const auto [kind, ns, name, uid] =
            Reader::pick<4>(*target_ref, {"kind", "namespace", "name", "uid"});
        model::ObjectRef ref;
        ref.kind = Reader::str(kind, "kind", ".targetRef");
        ref.ns = Reader::str(ns, "namespace", ".targetRef");
        ref.name = Reader::str(name, "name", ".targetRef");
        ref.uid = Reader::str(uid, "uid", ".targetRef");
        e.target_ref = std::move(ref);
      }
      return e;
    }));
  }
  return s;
}

model::Node decode_node(const dom::element& obj, Reader&) {
  Meta meta = read_meta(obj, false);
  model::Node n;
  n.name = meta.name;
  n.resource_version = meta.resource_version;
  n.labels = meta.labels;
  n.zone = label(meta, "topology.kubernetes.io/zone");
  n.deleting = !meta.deletion_timestamp.empty();
  if (auto spec = Reader::field(obj, "spec")) {
    for (const auto& t : Reader::array(*spec, "taints", "spec")) {
      std::string key = Reader::str(t, "key", "spec.taints");
      if (!key.empty()) n.taint_keys.push_back(std::move(key));
    }
    std::vector<std::string> cidrs;
    for (const auto& c : Reader::array(*spec, "podCIDRs", "spec")) {
      std::string_view v;
      if (c.get_string().get(v) != simdjson::SUCCESS) fail("spec.podCIDRs: expected strings");
      cidrs.emplace_back(v);
    }
    if (cidrs.empty()) {
      std::string one = Reader::str(*spec, "podCIDR", "spec");
      if (!one.empty()) cidrs.push_back(one);
    }
    for (const auto& c : cidrs) {
      auto p = model::IpPrefix::parse(c);
      if (!p) fail("spec.podCIDRs: invalid CIDR \"" + c + "\"");
      n.pod_cidrs.push_back(*p);
    }
  }
  if (auto status = Reader::field(obj, "status"))
    for (const auto& a : Reader::array(*status, "addresses", "status")) {
      model::NodeAddress na;
      na.type = Reader::str(a, "type", "status.addresses");
      na.address = Reader::str(a, "address", "status.addresses");
      if ((na.type == "InternalIP" || na.type == "ExternalIP"))
        Reader::ip(na.address, "status.addresses");
      n.addresses.push_back(std::move(na));
    }
  return n;
}

model::Pod decode_pod(const dom::element& obj, Reader&) {
  Meta meta = read_meta(obj, true);
  model::Pod p;
  p.key = {meta.ns, meta.name};
  p.uid = meta.uid;
  p.resource_version = meta.resource_version;
  p.annotations = meta.annotations;
  p.labels = meta.labels;
  p.deletion_timestamp = meta.deletion_timestamp;
  p.terminating = !meta.deletion_timestamp.empty();
  if (auto spec = Reader::field(obj, "spec")) {
    p.node_name = Reader::str(*spec, "nodeName", "spec");
    p.host_network = Reader::boolean(*spec, "hostNetwork", "spec").value_or(false);
    if (auto g = Reader::integer(*spec, "terminationGracePeriodSeconds", "spec")) {
      if (*g < 0) fail("spec.terminationGracePeriodSeconds: negative");
      p.termination_grace_period_seconds = *g;
    }
  }
  if (auto status = Reader::field(obj, "status")) {
    p.phase = Reader::str(*status, "phase", "status");
    for (const auto& ip : Reader::array(*status, "podIPs", "status"))
      p.pod_ips.push_back(Reader::ip(Reader::str(ip, "ip", "status.podIPs"), "status.podIPs"));
    if (p.pod_ips.empty()) {
      std::string one = Reader::str(*status, "podIP", "status");
      if (!one.empty()) p.pod_ips.push_back(Reader::ip(one, "status.podIP"));
    }
  }
  return p;
}

// "Service default/web" for error messages, from whatever could be read.
std::string describe(const dom::element& obj, std::optional<ObjectKind> kind) {
  std::string_view ns, name;
  if (auto m = Reader::field(obj, "metadata")) {
    std::string_view v;
    if (auto n = Reader::field(*m, "namespace"); n && n->get_string().get(v) == simdjson::SUCCESS)
      ns = v;
    if (auto n = Reader::field(*m, "name"); n && n->get_string().get(v) == simdjson::SUCCESS)
      name = v;
  }
  return rules::describe(kind, ns, name);
}

}  // namespace

std::optional<ObjectKind> kind_from_name(std::string_view kind) {
  if (kind == "Service" || kind == "services") return ObjectKind::kService;
  if (kind == "EndpointSlice" || kind == "endpointslices") return ObjectKind::kEndpointSlice;
  if (kind == "Node" || kind == "nodes") return ObjectKind::kNode;
  if (kind == "Pod" || kind == "pods") return ObjectKind::kPod;
  return std::nullopt;
}

Result<Decoded> decode_object(const dom::element& obj, std::optional<ObjectKind> hint) {
  std::optional<ObjectKind> kind = hint;
  std::string_view kind_text;
  if (auto k = Reader::field(obj, "kind");
      k && k->get_string().get(kind_text) == simdjson::SUCCESS) {
    auto parsed = kind_from_name(kind_text);
    if (!parsed)
      return Error{describe(obj, std::nullopt) + ": unsupported kind \"" + std::string(kind_text) +
                   "\""};
    if (hint && *parsed != *hint)
      return Error{describe(obj, parsed) + ": expected kind " +
                   std::string(model::to_string(*hint))};
    kind = parsed;
  }
  if (!kind) return Error{describe(obj, std::nullopt) + ": kind missing"};
  if (obj.type() != dom::element_type::OBJECT)
    return Error{"object expected, got another JSON value"};
  Decoded d;
  Reader r(d.warnings);
  try {
    switch (*kind) {
      case ObjectKind::kService:
        d.object = decode_service(obj, r);
        break;
      case ObjectKind::kEndpointSlice:
        d.object = decode_slice(obj, r);
        break;
      case ObjectKind::kNode:
        d.object = decode_node(obj, r);
        break;
      case ObjectKind::kPod:
        d.object = decode_pod(obj, r);
        break;
    }
  } catch (const DecodeFailure& f) {
    return Error{describe(obj, kind) + ": " + f.reason};
  }
  for (auto& w : d.warnings) w = describe(obj, kind) + ": " + w;
  return d;
}

Result<Decoded> decode_json(std::string_view json, std::optional<ObjectKind> hint) {
  if (json.size() > kMaxObjectBytes)
    return Error{"object of " + std::to_string(json.size()) + " bytes exceeds the limit of " +
                 std::to_string(kMaxObjectBytes)};
  // A parser per thread: its buffers are reused across calls.
  thread_local dom::parser parser;
  dom::element root;
  if (auto err = parser.parse(json.data(), json.size()).get(root); err != simdjson::SUCCESS)
    return Error{std::string("malformed JSON: ") + simdjson::error_message(err)};
  return decode_object(root, hint);
}

static_assert(kJsonPadding >= simdjson::SIMDJSON_PADDING);

Result<DecodedList> decode_list(std::string_view json, ObjectKind kind, bool padded) {
  thread_local dom::parser parser;
  dom::element root;
  if (auto err = parser.parse(json.data(), json.size(), !padded).get(root);
      err != simdjson::SUCCESS)
    return Error{std::string("malformed list JSON: ") + simdjson::error_message(err)};
  DecodedList out;
  if (auto m = Reader::field(root, "metadata")) {
    std::string_view v;
    if (auto rv = Reader::field(*m, "resourceVersion");
        rv && rv->get_string().get(v) == simdjson::SUCCESS)
      out.resource_version = v;
    if (auto c = Reader::field(*m, "continue"); c && c->get_string().get(v) == simdjson::SUCCESS)
      out.continue_token = v;
  }
  auto items = Reader::field(root, "items");
  dom::array arr;
  if (items && items->get_array().get(arr) != simdjson::SUCCESS)
    return Error{"list: items is not a list"};
  if (!items) return out;
  out.objects.reserve(arr.size());
  for (dom::element item : arr) {
    auto d = decode_object(item, kind);
    if (!d) {
      out.errors.push_back(d.error());
      std::string_view ns, name;
      if (auto m = Reader::field(item, "metadata")) {
        if (auto n = Reader::field(*m, "name"); n && n->get_string().get(name)) name = {};
        if (auto n = Reader::field(*m, "namespace"); n && n->get_string().get(ns)) ns = {};
      }
      if (!name.empty()) {
        if (kind == ObjectKind::kNode)
          out.failed.push_back({"", std::string(name)});
        else
          out.failed.push_back({ns.empty() ? "default" : std::string(ns), std::string(name)});
      }
      continue;
    }
    for (auto& w : d->warnings) out.warnings.push_back(std::move(w));
    out.objects.push_back(std::move(d->object));
  }
  return out;
}

Result<ListMeta> peek_list_meta(std::string_view json) {
  static_assert(kJsonPadding >= simdjson::SIMDJSON_PADDING);
  namespace od = simdjson::ondemand;
  thread_local od::parser parser;
  od::document doc;
  od::object root;
  if (auto err = parser.iterate(json.data(), json.size(), json.size() + kJsonPadding).get(doc);
      err != simdjson::SUCCESS)
    return Error{std::string("malformed list JSON: ") + simdjson::error_message(err)};
  if (auto err = doc.get_object().get(root); err != simdjson::SUCCESS)
    return Error{std::string("list is not an object: ") + simdjson::error_message(err)};
  ListMeta out;
  // The API server writes metadata before items; found later, the items are skipped over.
  for (auto field : root) {
    std::string_view key;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS)
      return Error{"malformed list JSON: a key"};
    if (key != "metadata") continue;
    od::object meta;
    if (field.value().get_object().get(meta) != simdjson::SUCCESS)
      return Error{"list: metadata is not an object"};
    for (auto m : meta) {
      std::string_view name, v;
      if (m.unescaped_key().get(name) != simdjson::SUCCESS)
        return Error{"malformed list JSON: a metadata key"};
      // As decode_list reads them: a value that is no string is no value.
      if ((name == "resourceVersion" || name == "continue") &&
          m.value().get_string().get(v) == simdjson::SUCCESS)
        (name == "continue" ? out.continue_token : out.resource_version) = v;
    }
    return out;
  }
  return out;
}

}  // namespace endpointd::watcher
