// The proxy benchmark driver (bench/proxy/run drives it): builds a synthetic cluster of N
// services x M endpoints, and either prints it as nft text (endpointd's render, or kube-proxy's
// nftables layout for the same state) or, inside a network namespace, runs the proxy sink over
// netlink: a full sync, then single-endpoint changes timed from the sink being handed the
// snapshot to the batch committed. Prints one JSON object per measurement.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/ack_board.h"
#include "proxy/netlink.h"
#include "proxy/planner.h"
#include "proxy/render.h"
#include "proxy/sink.h"
#include "tests/proxy/fixtures.h"

namespace endpointd::proxy {
namespace {

struct Options {
  std::string mode;
  int services = 10000;
  int endpoints = 10;
  int nodes = 100;  // endpoints are spread over this many nodes; this node is node-0
  int changes = 1000;
  int plan_threads = 2;  // phases: Planner::reset with its helper (2, as the sink) or without (1)
};

std::string node_name(int n) {
  return "node-" + std::to_string(n);
}

std::string ep_addr(int n) {
  return "10." + std::to_string(100 + n / 65536) + "." + std::to_string((n / 256) % 256) + "." +
         std::to_string(n % 256);
}

std::string vip_addr(int i) {
  return "10.96." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
}

model::MergedEndpoint endpoint_of(const Options& o, int n) {
  return testing::endpoint(ep_addr(n).c_str(), 8080, node_name(n % o.nodes));
}

std::vector<model::ServiceStatePtr> cluster(const Options& o) {
  std::vector<model::ServiceStatePtr> v;
  v.reserve(static_cast<size_t>(o.services));
  for (int i = 0; i < o.services; ++i) {
    std::vector<model::MergedEndpoint> eps;
    for (int j = 0; j < o.endpoints; ++j) eps.push_back(endpoint_of(o, i * o.endpoints + j));
    char name[32];
    std::snprintf(name, sizeof(name), "s%05d", i);  // sorted like the index
    v.push_back(testing::state(testing::service(name, {testing::ip(vip_addr(i).c_str())}, 80),
                               std::move(eps)));
  }
  return v;
}

NodeContext node_context() {
  NodeContext c;
  c.node_name = node_name(0);
  c.zone = "zone-a";
  c.node_ips = {testing::ip("192.168.50.1")};
  c.cluster_cidrs = {testing::prefix("10.64.0.0/10")};
  c.ipv6 = false;
  return c;
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

double ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// kube-proxy's nftables layout (pkg/proxy/nftables) for the same state: the fixed maps and base
// chains, then per service a chain with its masquerade test and an anonymous numgen vmap of
// gotos, and per endpoint a chain with its hairpin test and its dnat.
void print_kube_proxy(const Options& o) {
  std::string out;
  out.reserve(static_cast<size_t>(o.services) * (400 + 250 * o.endpoints));
  out +=
      "table ip kube-proxy {\n"
      "\tcomment \"rules for kube-proxy\"\n"
      "\tset cluster-ips { type ipv4_addr; comment \"Active ClusterIPs\"; }\n"
      "\tset nodeport-ips { type ipv4_addr; comment \"IPs that accept NodePort traffic\"; }\n"
      "\tmap no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict; }\n"
      "\tmap no-endpoint-nodeports { type inet_proto . inet_service : verdict; }\n"
      "\tmap firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n"
      "\tmap service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n"
      "\tmap service-nodeports { type inet_proto . inet_service : verdict; }\n"
      "\tchain filter-prerouting { type filter hook prerouting priority -110; ct state new jump "
      "firewall-check; }\n"
      "\tchain filter-input { type filter hook input priority -110; ct state new jump "
      "nodeport-endpoints-check; "
      "ct state new jump service-endpoints-check; }\n"
      "\tchain filter-forward { type filter hook forward priority -110; ct state new jump "
      "service-endpoints-check; "
      "ct state new jump cluster-ips-check; }\n"
      "\tchain filter-output { type filter hook output priority -110; ct state new jump "
      "service-endpoints-check; "
      "ct state new jump firewall-check; }\n"
      "\tchain filter-output-post-dnat { type filter hook output priority -90; ct state new jump "
      "cluster-ips-check; }\n"
      "\tchain nat-prerouting { type nat hook prerouting priority -100; jump services; }\n"
      "\tchain nat-output { type nat hook output priority -100; jump services; }\n"
      "\tchain nat-postrouting { type nat hook postrouting priority 100; jump masquerading; }\n"
      "\tchain cluster-ips-check { ip daddr @cluster-ips reject; ip daddr 10.96.0.0/12 drop; }\n"
      "\tchain mark-for-masquerade { meta mark set meta mark | 0x4000; }\n"
      "\tchain masquerading { meta mark & 0x4000 == 0 return; meta mark set meta mark ^ 0x4000; "
      "masquerade fully-random; }\n"
      "\tchain services { ip daddr . meta l4proto . th dport vmap @service-ips; "
      "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap "
      "@service-nodeports; }\n"
      "\tchain service-endpoints-check { ip daddr . meta l4proto . th dport vmap "
      "@no-endpoint-services; "
      "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap "
      "@no-endpoint-nodeports; }\n"
      "\tchain nodeport-endpoints-check { ip daddr @nodeport-ips meta l4proto . th dport vmap "
      "@no-endpoint-nodeports; }\n"
      "\tchain firewall-check { ip daddr . meta l4proto . th dport vmap @firewall-ips; }\n"
      "\tchain reject-chain { reject; }\n";
  std::string elements_ips, elements_svc;
  for (int i = 0; i < o.services; ++i) {
    char svc[64];
    std::snprintf(svc, sizeof(svc), "service-%08X-default/s%05d/tcp/http",
                  static_cast<unsigned>(i * 2654435761u), i);
    std::string vip = vip_addr(i);
    out += "\tchain " + std::string(svc) + " {\n\t\tip daddr " + vip +
           " tcp dport 80 ip saddr != 10.64.0.0/10 jump mark-for-masquerade\n";
    std::string vmap = "\t\tnumgen random mod " + std::to_string(o.endpoints) + " vmap { ";
    std::string eps;
    for (int j = 0; j < o.endpoints; ++j) {
      std::string a = ep_addr(i * o.endpoints + j);
      char ep[96];
      std::snprintf(ep, sizeof(ep), "endpoint-%08X-default/s%05d/tcp/http__%s/8080",
                    static_cast<unsigned>((i * o.endpoints + j) * 2246822519u), i, a.c_str());
      vmap += (j ? ", " : "") + std::to_string(j) + " : goto " + ep;
      eps += "\tchain " + std::string(ep) + " {\n\t\tip saddr " + a +
             " jump mark-for-masquerade\n\t\tmeta l4proto tcp dnat to " + a + ":8080\n\t}\n";
    }
    out += vmap + " }\n\t}\n" + eps;
    elements_ips += (i ? ", " : "") + vip;
    elements_svc += (i ? ", " : "") + vip + " . tcp . 80 : goto " + svc;
  }
  out += "}\n";
  if (o.services > 0) {
    out += "add element ip kube-proxy cluster-ips { " + elements_ips + " }\n";
    out += "add element ip kube-proxy service-ips { " + elements_svc + " }\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// The full-sync batch as bytes (into an empty kernel), to check that an encoder change sends
// the kernel exactly what it sent before: `proxy_bench batch > a; ...; cmp a b`.
void print_batch(const Options& o) {
  Planner p(node_context());
  p.reset(*testing::snapshot(1, cluster(o)));
  Batch b = build_full_sync_batch({&p.table(IpFamily::kV4)}, {}, {}, 1);
  std::fwrite(b.bytes.data(), 1, b.bytes.size(), stdout);
}

// The full sync's parts, into the fresh namespace the caller made: planning (Planner::reset),
// encoding (build_full_sync_batch) and the backend's full sync (listing the kernel's chains and
// sets, encoding again, sending and waiting for every acknowledgement); kernel = that - encoding.
int run_phases(const Options& o) {
  auto snap = testing::snapshot(1, cluster(o));
  auto be = NetlinkBackend::open();
  if (!be) {
    std::fprintf(stderr, "netlink: %s\n", be.error().c_str());
    return 1;
  }
  long rss_snapshot = rss_kib();
  Planner p(node_context());
  const bool helper = o.plan_threads > 1;
  auto t0 = std::chrono::steady_clock::now();
  p.reset(*snap, helper);
  auto t1 = std::chrono::steady_clock::now();
  long rss_planned = rss_kib();
  size_t bytes = build_full_sync_batch({&p.table(IpFamily::kV4)}, {}, {}, 1).bytes.size();
  auto t2 = std::chrono::steady_clock::now();
  auto r = (*be)->full_sync({&p.table(IpFamily::kV4)});
  auto t3 = std::chrono::steady_clock::now();
  if (!r) {
    std::fprintf(stderr, "full sync: %s\n", r.error().c_str());
    return 1;
  }
  // A restarted agent over these rules: a new backend and planner, planning then the full sync
  // that lists the kernel's elements and sends only what differs. Two seconds after the first
  // sync, as no agent restarts faster: the kernel grows a big hash set in a deferred rehash
  // after the insert, and a set dumped while that runs is listed again (unsettled_dumps).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  // Three restarts, each a new backend and planner: (1) the same state: every set's content
  // digest agrees with the kernel's, nothing is listed but the interval sets; (2) the same
  // state after the monitor reported someone else's change: every set listed; (3) one
  // service's endpoints changed while no agent ran: only the sets whose digest differs listed.
  struct Restart {
    double plan_ms = 0, sync_ms = 0;
    BatchStats stats;
    unsigned long long unsettled = 0;
  };
  auto restart = [&](const model::Snapshot& state, bool distrust) -> std::optional<Restart> {
    auto b2 = NetlinkBackend::open();
    if (!b2) {
      std::fprintf(stderr, "netlink: %s\n", b2.error().c_str());
      return std::nullopt;
    }
    if (distrust) (*b2)->distrust_digests();
    auto a = std::chrono::steady_clock::now();
    Planner p2(node_context());
    p2.reset(state, helper);
    auto b = std::chrono::steady_clock::now();
    auto r2 = (*b2)->full_sync({&p2.table(IpFamily::kV4)});
    auto c = std::chrono::steady_clock::now();
    if (!r2) {
      std::fprintf(stderr, "restart's full sync: %s\n", r2.error().c_str());
      return std::nullopt;
    }
    return Restart{ms(b - a), ms(c - b), *r2, (*b2)->unsettled_dumps()};
  };
  auto same = restart(*snap, false);
  auto listed = restart(*snap, true);
  // The first service loses its last endpoint.
  std::vector<model::ServiceStatePtr> changed(snap->services.begin(), snap->services.end());
  if (!changed.empty() && !changed[0]->endpoints.empty()) {
    auto eps = changed[0]->endpoints;
    eps.pop_back();
    changed[0] = testing::state(changed[0]->service, eps);
  }
  auto moved = restart(*testing::snapshot(2, changed), false);
  if (!same || !listed || !moved) return 1;
  auto restart_json = [](const char* name, const Restart& x) {
    std::printf(
        ",\"%s\":{\"plan_ms\":%.1f,\"sync_ms\":%.1f,\"elements_changed\":%zu,"
        "\"messages\":%zu,\"bytes\":%zu,\"sets_listed\":%zu,\"sets_unchanged\":%zu,"
        "\"unsettled_dumps\":%llu}",
        name, x.plan_ms, x.sync_ms, x.stats.elements, x.stats.messages, x.stats.bytes,
        x.stats.sets_listed, x.stats.sets_unchanged, x.unsettled);
  };
  std::printf(
      "{\"what\":\"full_sync_phases\",\"plan_ms\":%.1f,\"encode_ms\":%.1f,\"backend_ms\":%.1f,"
      "\"kernel_ms\":%.1f,\"bytes\":%zu,\"elements\":%zu,\"rss_snapshot_kib\":%ld,"
      "\"rss_planner_kib\":%ld",
      ms(t1 - t0), ms(t2 - t1), ms(t3 - t2), ms(t3 - t2) - ms(t2 - t1), bytes, r->elements,
      rss_snapshot, rss_planned - rss_snapshot);
  restart_json("restart", *same);
  restart_json("restart_listing", *listed);
  restart_json("restart_changed", *moved);
  std::printf("}\n");
  return 0;
}

void print_render(const Options& o) {
  Planner p(node_context());
  p.reset(*testing::snapshot(1, cluster(o)));
  std::string out = render(p.table(IpFamily::kV4));
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// Inside the namespace the caller made: full sync through the sink, then one-endpoint changes.
int run_sync(const Options& o) {
  auto services = cluster(o);
  auto be = NetlinkBackend::open();
  if (!be) {
    std::fprintf(stderr, "netlink: %s\n", be.error().c_str());
    return 1;
  }
  pipeline::AckBoard board;
  ProxySink::Options so;
  so.node = node_context();
  ProxySink sink(be->get(), &board, so);

  model::SnapshotPtr snap = testing::snapshot(1, services);
  model::Delta all = model::diff(nullptr, *snap);
  auto t0 = std::chrono::steady_clock::now();
  sink.apply(snap, all);
  auto t1 = std::chrono::steady_clock::now();
  if (!sink.synced()) {
    std::fprintf(stderr, "full sync failed\n");
    return 1;
  }
  size_t elements = sink.planner()->table(IpFamily::kV4).element_count();
  std::printf(
      "{\"what\":\"full_sync\",\"services\":%d,\"endpoints\":%d,\"nodes\":%d,\"elements\":%zu,"
      "\"ms\":%.1f}\n",
      o.services, o.endpoints, o.nodes, elements, ms(t1 - t0));
  std::fflush(stdout);

  if (std::getenv("PROBE")) {
    // Which kind of element makes a batch expensive in the kernel.
    const Table& t = sink.planner()->table(IpFamily::kV4);
    for (const char* set : {"backends-10", "service-lb", "service-ips", "hairpin"}) {
      // service-lb holds only externalTrafficPolicy Local keys since the affinity choice moved
      // into service-ips: a set with nothing in it has no element to probe.
      auto it = t.sets.find(set);
      if (it == t.sets.end() || it->second.elements.empty()) {
        std::printf("{\"probe\":\"%s\",\"skipped\":\"empty\"}\n", set);
        continue;
      }
      Element el = (*it->second.elements.begin()).element();
      TableChanges ch;
      ch.del_elements.emplace_back(set, el);
      ch.add_elements.emplace_back(set, el);
      double best = 1e9;
      for (int k = 0; k < 20; ++k) {
        auto s = std::chrono::steady_clock::now();
        auto r = (*be)->apply({ch});
        best = std::min(best, ms(std::chrono::steady_clock::now() - s));
        if (!r) std::fprintf(stderr, "%s\n", r.error().c_str());
      }
      std::printf("{\"probe\":\"%s\",\"best_ms\":%.3f}\n", set, best);
    }
  }
  // Endpoint changes: a service loses its last endpoint, or gets it back.
  std::vector<double> lat;
  lat.reserve(static_cast<size_t>(o.changes));
  std::vector<bool> shrunk(static_cast<size_t>(o.services), false);
  uint64_t g = 1;
  for (int c = 0; c < o.changes; ++c) {
    auto i =
        static_cast<size_t>((static_cast<uint64_t>(c) * 7919u) % static_cast<uint64_t>(o.services));
    const auto& old = services[i];
    auto eps = old->endpoints;
    if (shrunk[i]) {
      eps.push_back(endpoint_of(o, static_cast<int>(i) * o.endpoints + o.endpoints - 1));
    } else {
      eps.pop_back();
    }
    shrunk[i] = !shrunk[i];
    services[i] = testing::state(old->service, std::move(eps));
    auto next = std::make_shared<model::Snapshot>(*snap);
    next->generation = ++g;
    next->services = snap->services.with({{services[i]->key(), services[i]}});
    snap = next;
    model::Delta d;
    d.from_generation = g - 1;
    d.to_generation = g;
    d.changed.push_back(services[i]->key());
    auto s = std::chrono::steady_clock::now();
    sink.apply(next, d);
    auto e = std::chrono::steady_clock::now();
    lat.push_back(ms(e - s));
  }
  if (sink.failures() != 0) {
    std::fprintf(stderr, "%llu batches failed\n", static_cast<unsigned long long>(sink.failures()));
    return 1;
  }
  std::vector<double> sorted = lat;
  std::sort(sorted.begin(), sorted.end());
  auto pct = [&](double q) {
    return sorted.empty() ? 0.0
                          : sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))];
  };
  std::printf(
      "{\"what\":\"endpoint_change\",\"changes\":%d,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%."
      "3f}\n",
      o.changes, pct(0.5), pct(0.99), sorted.empty() ? 0.0 : sorted.back());
  std::printf("{\"what\":\"rss\",\"kib\":%ld}\n", rss_kib());
  return 0;
}

}  // namespace
}  // namespace endpointd::proxy

int main(int argc, char** argv) {
  using endpointd::proxy::Options;
  Options o;
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: proxy_bench sync|phases|render|batch|kube-proxy [--services N] [--endpoints M] "
        "[--nodes K] [--changes C] [--plan-threads 1|2]\n");
    return 2;
  }
  o.mode = argv[1];
  // stdout carries the JSON lines; the sink's log goes to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("proxy_bench"));
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (k == "--services")
      o.services = v;
    else if (k == "--endpoints")
      o.endpoints = v;
    else if (k == "--nodes")
      o.nodes = std::max(1, v);
    else if (k == "--changes")
      o.changes = v;
    else if (k == "--plan-threads")
      o.plan_threads = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (o.mode == "render") {
    endpointd::proxy::print_render(o);
    return 0;
  }
  if (o.mode == "kube-proxy") {
    endpointd::proxy::print_kube_proxy(o);
    return 0;
  }
  if (o.mode == "batch") {
    endpointd::proxy::print_batch(o);
    return 0;
  }
  if (o.mode == "sync") return endpointd::proxy::run_sync(o);
  if (o.mode == "phases") return endpointd::proxy::run_phases(o);
  std::fprintf(stderr, "unknown mode %s\n", o.mode.c_str());
  return 2;
}
