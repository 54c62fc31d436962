// Snapshots for drain tests: one ClusterIP service "demo/web" whose endpoints and pods the
// test chooses, nodes node-a (this one) and node-b.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/snapshot.h"

namespace endpointd::drain::testing {

struct Ep {
  std::string ip;
  std::string node = "node-a";
  bool ready = true, serving = true, terminating = false;
  std::string pod = {};  // target pod name in "demo"
};

struct PodDef {
  std::string name;
  std::string ip;
  std::string node = "node-a";
  bool terminating = false;
  int64_t grace = 30;
  std::string release_after = {};       // annotation value, empty: none
  std::string deletion_timestamp = {};  // metadata.deletionTimestamp, empty: none
  std::string drain_action = {};        // endpointd.io/drain-action, empty: none
};

inline model::IpAddr ip(const std::string& s) {
  return *model::IpAddr::parse(s);
}

// Nodes node-a (this one, 192.168.77.2) and node-b (192.168.77.3).
inline void add_nodes(model::Snapshot& s) {
  for (const char* n : {"node-a", "node-b"}) {
    auto node = std::make_shared<model::Node>();
    node->name = n;
    node->addresses = {
        {"InternalIP", std::string(n) == "node-a" ? "192.168.77.2" : "192.168.77.3"}};
    s.nodes.push_back(node);
  }
}

inline model::SnapshotPtr make_snapshot(uint64_t g, const std::vector<Ep>& eps,
                                        const std::vector<PodDef>& pods = {},
                                        bool headless = false) {
  auto s = std::make_shared<model::Snapshot>();
  s->generation = g;
  s->synced = true;
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = {"demo", "web"};
  st->service.headless = headless;
  if (!headless) st->service.cluster_ips = {ip("10.96.0.10")};
  model::ServicePort sp;
  sp.name = "http";
  sp.port = 80;
  sp.target_port_name = "http";
  st->service.ports = {sp};
  for (const auto& e : eps) {
    model::MergedEndpoint m;
    m.address = ip(e.ip);
    m.conditions = {e.ready, e.serving, e.terminating};
    m.ports = {model::EndpointPort{"http", model::Protocol::kTCP, 8080, ""}};
    m.node_name = e.node;
    if (!e.pod.empty()) m.target_ref = model::ObjectRef{"Pod", "demo", e.pod, "uid-" + e.pod};
    st->endpoints.push_back(m);
  }
  std::sort(st->endpoints.begin(), st->endpoints.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  s->services = model::ServiceList({st});
  add_nodes(*s);
  for (const auto& p : pods) {
    auto pod = std::make_shared<model::Pod>();
    pod->key = {"demo", p.name};
    pod->uid = "uid-" + p.name;
    pod->node_name = p.node;
    pod->pod_ips = {ip(p.ip)};
    pod->terminating = p.terminating;
    pod->termination_grace_period_seconds = p.grace;
    pod->deletion_timestamp = p.deletion_timestamp;
    if (!p.release_after.empty()) pod->annotations["endpointd.io/release-after"] = p.release_after;
    if (!p.drain_action.empty()) pod->annotations["endpointd.io/drain-action"] = p.drain_action;
    s->pods.push_back(pod);
  }
  std::sort(s->pods.begin(), s->pods.end(),
            [](const auto& a, const auto& b) { return a->key < b->key; });
  return s;
}

}  // namespace endpointd::drain::testing
