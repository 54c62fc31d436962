// The multi-node namespace cluster and the test programs' launchers and log readers.
#include "tests/netns/cluster.h"

#include <signal.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace endpointd::netns {
namespace {

std::atomic<int> g_files{0};

std::string unique_file(const std::string& what) {
  return scratch_dir() + "/" + what + "-" + std::to_string(g_files++);
}

}  // namespace

ClusterSpec ClusterSpec::demo() {
  ClusterSpec s;
  s.nodes.push_back(
      {"node-a",
       "192.168.77.2",
       "10.244.1.0/24",
       "10.244.1.1",
       {{"web-1", "10.244.1.10"}, {"web-2", "10.244.1.11"}, {"db-1", "10.244.1.20"}}});
  s.nodes.push_back({"node-b",
                     "192.168.77.3",
                     "10.244.2.0/24",
                     "10.244.2.1",
                     {{"web-3", "10.244.2.10"}, {"db-0", "10.244.2.20"}}});
  return s;
}

ClusterSpec ClusterSpec::make(int nodes, int pods_per_node) {
  ClusterSpec s;
  for (int i = 0; i < nodes; ++i) {
    NodeSpec n;
    n.name = "node-" + std::to_string(i + 1);
    n.ip = s.bridge_prefix + "." + std::to_string(i + 2);
    std::string net = "10.244." + std::to_string(i + 1);
    n.pod_cidr = net + ".0/24";
    n.gateway = net + ".1";
    for (int j = 0; j < pods_per_node; ++j) {
      n.pods.push_back(
          {n.name + "-pod-" + std::to_string(j + 1), net + "." + std::to_string(10 + j)});
    }
    s.nodes.push_back(std::move(n));
  }
  return s;
}

Cluster::Cluster(ClusterSpec spec) : spec_(std::move(spec)), prefix_(unique_prefix()) {
  // Members made so far are destroyed (namespaces deleted) if anything below throws.
  bridge_ = std::make_unique<Netns>(prefix_ + "br");
  bridge_->ip({"link", "add", "br0", "type", "bridge"});
  bridge_->ip({"link", "set", "br0", "up"});
  const std::string mask = "/24";

  auto attach = [&](Netns& ns, const std::string& bridge_port, const std::string& ip) {
    ns.ip({"link", "add", "eth0", "type", "veth", "peer", "name", bridge_port, "netns",
           bridge_->name()});
    bridge_->ip({"link", "set", bridge_port, "master", "br0"});
    bridge_->ip({"link", "set", bridge_port, "up"});
    ns.ip({"addr", "add", ip + mask, "dev", "eth0"});
    ns.ip({"link", "set", "eth0", "up"});
  };

  client_ = std::make_unique<Netns>(prefix_ + "client");
  attach(*client_, "c0", spec_.client_ip);
  // The client closes its connections first (the test server waits for it), so the
  // TIME-WAITs are the client's; like any busy client host it reuses their ports after a
  // second (timestamps make that safe), so thousands of requests a second never run out.
  client_->set_sysctl("net.ipv4.tcp_tw_reuse", "1");

  for (size_t i = 0; i < spec_.nodes.size(); ++i) {
    const NodeSpec& n = spec_.nodes[i];
    auto ns = std::make_unique<Netns>(prefix_ + n.name);
    Netns& node = *ns;
    nodes_[n.name] = std::move(ns);
    attach(node, "n" + std::to_string(i), n.ip);
    node.set_sysctl("net.ipv4.ip_forward", "1");
    node.set_sysctl("net.ipv4.conf.all.rp_filter", "0");
    node.set_sysctl("net.ipv4.conf.default.rp_filter", "0");
    node.ip({"route", "add", spec_.service_cidr, "dev", "eth0"});
    for (const NodeSpec& other : spec_.nodes) {
      if (other.name != n.name) node.ip({"route", "add", other.pod_cidr, "via", other.ip});
    }
    for (size_t j = 0; j < n.pods.size(); ++j) {
      const PodSpec& p = n.pods[j];
      auto pns = std::make_unique<Netns>(prefix_ + p.name);
      Netns& pod = *pns;
      pods_[p.name] = std::move(pns);
      std::string host_side = "p" + std::to_string(j);
      node.ip(
          {"link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", pod.name()});
      node.ip({"addr", "add", n.gateway + "/32", "dev", host_side});
      node.ip({"link", "set", host_side, "up"});
      node.ip({"route", "add", p.ip + "/32", "dev", host_side});
      pod.ip({"addr", "add", p.ip + "/32", "dev", "eth0"});
      pod.ip({"link", "set", "eth0", "up"});
      pod.ip({"route", "add", n.gateway, "dev", "eth0", "scope", "link"});
      pod.ip({"route", "add", "default", "via", n.gateway, "dev", "eth0"});
    }
    client_->ip({"route", "add", n.pod_cidr, "via", n.ip});
  }
  if (!spec_.nodes.empty()) {
    const NodeSpec& via = spec_.nodes.at(spec_.client_via_node);
    client_->ip({"route", "add", spec_.service_cidr, "via", via.ip});
  }
}

Cluster::~Cluster() {
  pods_.clear();
  nodes_.clear();
  client_.reset();
  bridge_.reset();
}

Netns& Cluster::node(const std::string& name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) throw std::out_of_range("no node " + name);
  return *it->second;
}

Netns& Cluster::pod(const std::string& name) {
  auto it = pods_.find(name);
  if (it == pods_.end()) throw std::out_of_range("no pod " + name);
  return *it->second;
}

const PodSpec& Cluster::pod_spec(const std::string& name) const {
  for (const auto& n : spec_.nodes) {
    for (const auto& p : n.pods) {
      if (p.name == name) return p;
    }
  }
  throw std::out_of_range("no pod " + name);
}

std::vector<std::string> Cluster::pod_names() const {
  std::vector<std::string> out;
  for (const auto& n : spec_.nodes) {
    for (const auto& p : n.pods) out.push_back(p.name);
  }
  return out;
}

std::vector<std::string> Cluster::namespace_names() const {
  std::vector<std::string> out;
  if (bridge_) out.push_back(bridge_->name());
  if (client_) out.push_back(client_->name());
  for (const auto& [_, ns] : nodes_) out.push_back(ns->name());
  for (const auto& [_, ns] : pods_) out.push_back(ns->name());
  return out;
}

std::string testserver_path() {
  return ENDPOINTD_TESTSERVER_PATH;
}
std::string loadclient_path() {
  return ENDPOINTD_LOADCLIENT_PATH;
}

Server start_server(Netns& ns, const ServerOptions& opts) {
  Server s;
  std::string name = opts.name.empty() ? ns.name() : opts.name;
  s.events_path = unique_file(name + "-events");
  std::vector<std::string> argv = {testserver_path(),
                                   "--name",
                                   name,
                                   "--events",
                                   s.events_path,
                                   "--bind",
                                   opts.bind,
                                   "--grace-ms",
                                   std::to_string(opts.grace_ms),
                                   "--ready-fd",
                                   "3"};
  if (opts.tcp_port >= 0) argv.insert(argv.end(), {"--tcp", std::to_string(opts.tcp_port)});
  if (opts.udp_port >= 0) argv.insert(argv.end(), {"--udp", std::to_string(opts.udp_port)});
  s.process = &ns.spawn(argv, name + "-server.log", /*ready_pipe=*/true);
  if (!s.process->wait_ready(std::chrono::seconds(10))) {
    throw std::runtime_error("test server " + name + " did not start: " + s.process->log());
  }
  return s;
}

std::vector<ServerEvent> read_server_events(const std::string& path) {
  std::vector<ServerEvent> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    ServerEvent e;
    if (!(ls >> e.time_ns >> e.kind)) continue;
    if (e.kind == "accept" || e.kind == "close") {
      ls >> e.peer >> e.conn_id;
    } else if (e.kind == "udp") {
      ls >> e.peer;
    }
    out.push_back(std::move(e));
  }
  return out;
}

LoadResult read_load_results(const std::string& path) {
  LoadResult r;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    LoadRecord rec;
    std::string status;
    if (!(ls >> rec.time_ns >> status >> rec.what >> rec.latency_us >> rec.worker >> rec.conn))
      continue;
    rec.ok = status == "ok";
    if (rec.ok) {
      ++r.ok;
      ++r.by_backend[rec.what];
    } else {
      ++r.failed;
      ++r.errors[rec.what];
    }
    r.records.push_back(std::move(rec));
  }
  return r;
}

LoadClient::LoadClient(Netns& ns, const LoadOptions& opts) : duration_ms_(opts.duration_ms) {
  out_path_ = unique_file("load");
  std::vector<std::string> argv = {loadclient_path(),
                                   "--target",
                                   opts.target,
                                   "--mode",
                                   opts.keepalive ? "keepalive" : "new",
                                   "--concurrency",
                                   std::to_string(opts.concurrency),
                                   "--interval-ms",
                                   std::to_string(opts.interval_ms),
                                   "--timeout-ms",
                                   std::to_string(opts.timeout_ms),
                                   "--out",
                                   out_path_,
                                   "--ready-fd",
                                   "3"};
  if (opts.udp) argv.push_back("--udp");
  if (opts.count > 0) argv.insert(argv.end(), {"--count", std::to_string(opts.count)});
  if (opts.duration_ms > 0)
    argv.insert(argv.end(), {"--duration-ms", std::to_string(opts.duration_ms)});
  process_ = &ns.spawn(argv, "loadclient-" + std::to_string(g_files++) + ".log", true);
  if (!process_->wait_ready(std::chrono::seconds(10))) {
    throw std::runtime_error("load client did not start: " + process_->log());
  }
}

LoadResult LoadClient::wait(std::chrono::milliseconds slack) {
  if (!process_->wait_exit(std::chrono::milliseconds(duration_ms_) + slack)) {
    process_->stop();
    throw std::runtime_error("load client did not finish in time");
  }
  return read_load_results(out_path_);
}

LoadResult LoadClient::stop() {
  process_->stop(std::chrono::milliseconds(5000));
  return read_load_results(out_path_);
}

LoadResult LoadClient::results_so_far() const {
  return read_load_results(out_path_);
}

}  // namespace endpointd::netns
