// Helpers for the dns tests: snapshots from a few lines, queries as bytes.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "dns/message.h"
#include "model/snapshot.h"

namespace endpointd::dns::testing {

inline model::IpAddr ip(const std::string& s) {
  return *model::IpAddr::parse(s);
}

inline model::MergedEndpoint endpoint(const std::string& addr, bool ready = true,
                                      bool terminating = false, const std::string& hostname = "") {
  model::MergedEndpoint e;
  e.address = ip(addr);
  e.conditions.ready = ready;
  e.conditions.serving = ready;
  e.conditions.terminating = terminating;
  e.hostname = hostname;
  e.ports.push_back({"http", model::Protocol::kTCP, 8080, ""});
  return e;
}

inline model::ServiceStatePtr service(const std::string& ns, const std::string& name,
                                      std::vector<std::string> cluster_ips,
                                      std::vector<model::MergedEndpoint> eps = {}) {
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = {ns, name};
  if (cluster_ips.size() == 1 && cluster_ips[0] == "None") {
    st->service.headless = true;
  } else {
    for (const auto& c : cluster_ips) st->service.cluster_ips.push_back(ip(c));
  }
  model::ServicePort p;
  p.name = "http";
  p.port = 80;
  p.target_port_name = "http";
  st->service.ports.push_back(p);
  st->endpoints = std::move(eps);
  return st;
}

// An ExternalName service `ns/name` naming `target`.
inline model::ServiceStatePtr external_name(const std::string& ns, const std::string& name,
                                            const std::string& target) {
  auto st = std::const_pointer_cast<model::ServiceState>(service(ns, name, {}));
  st->service.type = model::ServiceType::kExternalName;
  st->service.external_name = target;
  return st;
}

inline model::SnapshotPtr snapshot(std::vector<model::ServiceStatePtr> services, uint64_t gen = 1,
                                   bool synced = true) {
  auto s = std::make_shared<model::Snapshot>();
  s->generation = gen;
  s->synced = synced;
  // Accepts a sorted-here vector whether services is a vector or a ServiceList.
  std::sort(services.begin(), services.end(),
            [](const auto& a, const auto& b) { return a->key() < b->key(); });
  s->services = std::move(services);
  return s;
}

inline std::vector<uint8_t> query(const std::string& name, uint16_t qtype, uint16_t edns = 0,
                                  uint16_t id = 0x1234) {
  std::vector<uint8_t> buf(512);
  auto n = name_from_text(name);
  size_t len = write_query(id, n->span(), qtype, true, edns, buf.data(), buf.size());
  buf.resize(len);
  return buf;
}

}  // namespace endpointd::dns::testing
