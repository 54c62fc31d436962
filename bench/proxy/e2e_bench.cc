// End to end through `endpointd run`: one EndpointSlice change, made where a user makes it (the
// API server, or a file in a manifest directory), to the kernel's commit of the batch that
// carries it; and process start to /readyz (the first full sync applied). Runs inside the
// network namespace bench/proxy/e2e made for it; endpointd is a child process in the same one.
//
// The change is timed as kube-proxy's network programming duration: from the trigger time the
// slice carries (set to the moment the change is written) to the commit, seen as the
// NFT_MSG_NEWGEN notification on an nftables monitor socket opened after the first full sync
// (a listener makes the kernel build a notification per element, which would slow the full
// sync itself).
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <poll.h>
#include <unistd.h>

#include <httplib.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakeapi/fake_api.h"
#include "tests/netns/process.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// RFC 3339 with nanoseconds, as the EndpointSlice controller writes the trigger time.
std::string rfc3339_nano(std::chrono::system_clock::time_point t) {
  auto secs = std::chrono::floor<std::chrono::seconds>(t);
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t - secs).count();
  time_t tt = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof(buf) - n, ".%09lldZ", static_cast<long long>(ns));
  return buf;
}

// The slice object of a watch-event line, with its trigger time replaced.
std::string with_trigger_time(const std::string& line, const std::string& when) {
  static const std::string prefix = "{\"type\":\"MODIFIED\",\"object\":";
  std::string obj = line.substr(prefix.size(), line.size() - prefix.size() - 1);
  static const std::string key = "\"endpoints.kubernetes.io/last-change-trigger-time\":\"";
  auto at = obj.find(key);
  if (at != std::string::npos) {
    auto v = at + key.size();
    auto end = obj.find('"', v);
    obj.replace(v, end - v, when);
  }
  return obj;
}

std::string field(const std::string& obj, const std::string& name) {
  std::string key = "\"" + name + "\":\"";
  auto at = obj.find(key);
  if (at == std::string::npos) return "";
  auto v = at + key.size();
  return obj.substr(v, obj.find('"', v) - v);
}

// An nftables monitor: NEWGEN marks each committed batch.
class Monitor {
 public:
  Monitor() {
    nl_ = mnl_socket_open(NETLINK_NETFILTER);
    if (!nl_ || mnl_socket_bind(nl_, 1u << (NFNLGRP_NFTABLES - 1), MNL_SOCKET_AUTOPID) < 0)
      throw std::runtime_error("cannot open an nftables monitor socket");
    int big = 8 << 20;
    setsockopt(mnl_socket_get_fd(nl_), SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
  }
  ~Monitor() { mnl_socket_close(nl_); }
  // Drops whatever is queued.
  void drain() {
    while (next_gen(0ms)) {
    }
  }
  // The time the next NEWGEN arrived, or nullopt after `timeout`.
  std::optional<Clock::time_point> next_gen(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      pollfd p{mnl_socket_get_fd(nl_), POLLIN, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) <= 0)
        return std::nullopt;
      auto now = Clock::now();
      ssize_t n = mnl_socket_recvfrom(nl_, buf_.data(), buf_.size());
      if (n <= 0) continue;  // ENOBUFS: notifications lost while a big batch went by
      bool gen = false;
      auto* h = static_cast<const nlmsghdr*>(static_cast<const void*>(buf_.data()));
      int len = static_cast<int>(n);
      for (; mnl_nlmsg_ok(h, len); h = mnl_nlmsg_next(h, &len)) {
        if ((h->nlmsg_type & 0xff) == NFT_MSG_NEWGEN &&
            (h->nlmsg_type >> 8) == NFNL_SUBSYS_NFTABLES)
          gen = true;
      }
      if (gen) return now;
    }
  }

 private:
  mnl_socket* nl_ = nullptr;
  std::vector<char> buf_ = std::vector<char>(1 << 20);
};

double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"e2e_bench: one change to kernel commit, through endpointd run"};
  std::string endpointd, data, source = "api", dir, out;
  int changes = 200, gap_ms = 20, admin_port = 10349;
  bool prepared = false, uncompressed = false, json_lists = false;
  app.add_option("--endpointd", endpointd, "the endpointd binary")->required();
  app.add_option("--data", data, "bench/gen_cluster.py output")->required();
  app.add_option("--source", source, "api or dir")->check(CLI::IsMember({"api", "dir"}));
  app.add_option("--dir", dir, "dir: the manifest directory endpointd reads (a copy; written)");
  app.add_option("--changes", changes, "changes timed");
  app.add_option("--gap-ms", gap_ms, "idle time before each change");
  app.add_option("--admin-port", admin_port, "endpointd's admin port on 127.0.0.1");
  app.add_option("--out", out, "write the figures here (one JSON line)");
  app.add_flag("--api-prepared", prepared,
               "api: the fake API server encodes and compresses every list page before the agent "
               "starts (and again before the restart), so that the agent's start does not share "
               "its cores with the API server's encoding, as in a cluster it does not");
  app.add_flag("--uncompressed", uncompressed,
               "api: the agent's kubeconfig sets disable-compression (lists and watches ask for "
               "no gzip)");
  app.add_flag("--json-lists", json_lists,
               "api: the agent asks for EndpointSlice lists in JSON (--kube-api-content-type "
               "application/json), not protobuf");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> events;
  {
    std::ifstream in(data + "/events.jsonl");
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) events.push_back(l);
  }
  // A headless service (clusterIP None) has no proxy rules: a change to its slices commits
  // nothing, so there is nothing to time. Its events are left out rather than counted lost.
  std::vector<std::string> errors;
  const std::vector<std::string> objects =
      endpointd::fakeapi::load_manifest_dir(data + "/manifests", &errors);
  for (const auto& e : errors) std::cerr << e << "\n";
  {
    std::set<std::string> headless;
    for (const auto& o : objects)
      if (field(o, "kind") == "Service" && field(o, "clusterIP") == "None")
        headless.insert(field(o, "namespace") + "/" + field(o, "name"));
    const size_t all = events.size();
    std::erase_if(events, [&](const std::string& line) {
      return headless.count(field(line, "namespace") + "/" +
                            field(line, "kubernetes.io/service-name")) > 0;
    });
    std::cerr << "e2e_bench: " << all - events.size() << " of " << all
              << " events are for headless services (no proxy rules): left out\n";
  }
  if (events.empty()) {
    std::cerr << "no events in " << data << "/events.jsonl\n";
    return 2;
  }

  std::unique_ptr<endpointd::fakeapi::FakeApiServer> api;
  std::string tmp = fs::temp_directory_path() / ("endpointd-e2e-" + std::to_string(getpid()));
  fs::create_directories(tmp);
  std::string kubeconfig;  // api: written by the fake API server, removed at the end
  std::vector<std::string> args = {endpointd,
                                   "run",
                                   "--node-name",
                                   "node-0000",
                                   "--dataplane",
                                   "nftables",
                                   "--admin-listen",
                                   "127.0.0.1:" + std::to_string(admin_port),
                                   "--health-listen",
                                   "",
                                   "--drain-peer-insecure",
                                   "--drain-socket",
                                   tmp + "/drain.sock",
                                   "--log-level",
                                   "info"};
  if (source == "api") {
    endpointd::fakeapi::Options o;
    o.host = "127.0.0.1";
    o.port = 0;
    api = std::make_unique<endpointd::fakeapi::FakeApiServer>(o);
    api->replace_all(objects);
    if (prepared) api->prepare_lists(500);  // the agent's --list-page-size default
    kubeconfig = api->write_kubeconfig(uncompressed);
    if (kubeconfig.empty()) {
      std::cerr << "cannot write a kubeconfig under /tmp\n";
      return 2;
    }
    args.insert(args.end(), {"--kubeconfig", kubeconfig, "--watch-pods=false"});
    if (json_lists) args.insert(args.end(), {"--kube-api-content-type", "application/json"});
  } else {
    if (dir.empty()) {
      std::cerr << "--source dir needs --dir\n";
      return 2;
    }
    args.insert(args.end(), {"--source-dir", dir});
  }

  // More flags for the agent, to see what one costs (e.g. E2E_AGENT_ARGS="--events=false").
  if (const char* more = std::getenv("E2E_AGENT_ARGS")) {
    std::istringstream words(more);
    for (std::string w; words >> w;) args.push_back(w);
  }
  endpointd::netns::SpawnOptions so;
  so.argv = args;
  so.log_path = tmp + "/endpointd.log";
  httplib::Client http("127.0.0.1", admin_port);
  http.set_connection_timeout(1);
  // Process start to /readyz 200, in ms (negative: never ready).
  auto until_ready = [&](Clock::time_point start, endpointd::netns::Process& p) {
    while (Clock::now() - start < 120s) {
      auto r = http.Get("/readyz");
      if (r && r->status == 200) return ms(Clock::now() - start);
      if (!p.running()) break;
      std::this_thread::sleep_for(2ms);  // polling a probe: nothing to await
    }
    return -1.0;
  };
  auto start = Clock::now();
  endpointd::netns::Process proc(so);
  double start_to_ready = until_ready(start, proc);
  if (start_to_ready < 0) {
    std::cerr << "endpointd never became ready:\n" << proc.log();
    return 1;
  }

  Monitor mon;
  std::this_thread::sleep_for(500ms);  // let the agent settle after its first sync
  mon.drain();
  std::vector<double> lat;
  int lost = 0;
  for (int i = 0; i < changes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    mon.drain();
    const std::string& line = events[static_cast<size_t>(i) % events.size()];
    auto now = std::chrono::system_clock::now();
    std::string obj = with_trigger_time(line, rfc3339_nano(now));
    auto t0 = Clock::now();
    if (api) {
      api->apply(obj);
    } else {
      // One object per file, as a manifest directory holds it: written whole, then renamed
      // into place, as editors and kubectl-style tools do.
      std::string name = dir + "/slice-" + field(obj, "name") + ".json";
      std::string part = dir + "/.slice.tmp";
      std::ofstream(part) << obj;
      fs::rename(part, name);
    }
    auto t1 = mon.next_gen(2000ms);
    if (!t1) {
      ++lost;
      continue;
    }
    lat.push_back(ms(*t1 - t0));
  }
  proc.stop();
  // The agent's log stays for a look afterwards.
  fs::copy_file(so.log_path, fs::temp_directory_path() / ("endpointd-e2e-" + source + ".log"),
                fs::copy_options::overwrite_existing);
  // A restart over the rules the agent left (the same cluster state): start to ready, and the
  // elements its first full sync changed (0 when it found every rule right).
  so.log_path = tmp + "/endpointd-restart.log";
  if (api && prepared) api->prepare_lists(500);
  auto restart = Clock::now();
  endpointd::netns::Process again(so);
  double restart_to_ready = until_ready(restart, again);
  again.stop();
  long restart_changed = -1;
  {
    std::string log = again.log();
    auto at = log.find(" elements changed");
    if (at != std::string::npos) {
      auto from = log.rfind(' ', at - 1);
      restart_changed = std::strtol(log.c_str() + from + 1, nullptr, 10);
    }
  }
  fs::copy_file(so.log_path,
                fs::temp_directory_path() / ("endpointd-e2e-" + source + "-restart.log"),
                fs::copy_options::overwrite_existing);
  fs::remove_all(tmp);
  if (!kubeconfig.empty()) fs::remove(kubeconfig);

  char line[512];
  std::snprintf(line, sizeof(line),
                "{\"source\":\"%s%s%s%s\",\"start_to_ready_ms\":%.1f,\"changes\":%zu,\"lost\":%d,"
                "\"p50_ms\":%.2f,\"p90_ms\":%.2f,\"p99_ms\":%.2f,\"max_ms\":%.2f,"
                "\"restart_to_ready_ms\":%.1f,\"restart_elements_changed\":%ld}",
                source.c_str(), api && prepared ? "-prepared" : "",
                api && uncompressed ? "-uncompressed" : "", api && json_lists ? "-json" : "",
                start_to_ready, lat.size(), lost, pct(lat, 0.5), pct(lat, 0.9), pct(lat, 0.99),
                lat.empty() ? 0.0 : *std::max_element(lat.begin(), lat.end()), restart_to_ready,
                restart_changed);
  std::cout << line << "\n";
  if (!out.empty()) std::ofstream(out, std::ios::app) << line << "\n";
  return lost > changes / 10 ? 1 : 0;
}
