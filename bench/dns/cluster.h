// The DNS benchmark's cluster as a Snapshot: the same records gen_zone.py writes for NSD and
// Knot (keep the two in step).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "model/snapshot.h"

namespace endpointd::bench {

inline std::string endpoint_ip(int i, int j, int e) {
  int k = i * e + j;
  return "10." + std::to_string(128 + k / 65536) + "." + std::to_string((k / 256) % 256) + "." +
         std::to_string(k % 256);
}

// Service i: svc<i> in ns<i % 100>, ClusterIP 10.96.<i/256>.<i%256> (every tenth headless),
// port http 80, `e` endpoints ep-<j> on 8080.
inline model::ServiceStatePtr bench_service(int i, int e, int ready_from = 0) {
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = {"ns" + std::to_string(i % 100), "svc" + std::to_string(i)};
  st->service.headless = i % 10 == 0;
  if (!st->service.headless)
    st->service.cluster_ips.push_back(
        model::IpAddr::v4((10u << 24) | (96u << 16) | static_cast<uint32_t>(i)));
  model::ServicePort p;
  p.name = "http";
  p.port = 80;
  st->service.ports.push_back(p);
  for (int j = 0; j < e; ++j) {
    model::MergedEndpoint m;
    m.address = *model::IpAddr::parse(endpoint_ip(i, j, e));
    m.hostname = "ep-" + std::to_string(j);
    m.conditions.ready = j >= ready_from;
    m.conditions.serving = m.conditions.ready;
    m.conditions.terminating = !m.conditions.ready;
    m.ports.push_back({"http", model::Protocol::kTCP, 8080, ""});
    st->endpoints.push_back(std::move(m));
  }
  std::sort(st->endpoints.begin(), st->endpoints.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  return st;
}

inline model::SnapshotPtr bench_snapshot(int n, int e, uint64_t generation = 1) {
  auto snap = std::make_shared<model::Snapshot>();
  snap->generation = generation;
  snap->synced = true;
  std::vector<model::ServiceStatePtr> services;
  for (int i = 0; i < n; ++i) services.push_back(bench_service(i, e));
  snap->services = std::move(services);
  snap->endpoints = static_cast<size_t>(n) * static_cast<size_t>(e);
  return snap;
}

}  // namespace endpointd::bench
