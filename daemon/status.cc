// `endpointd status`: /debug/state read over the admin port and drawn as one screen.
#include "daemon/status.h"

#include <httplib.h>
#include <signal.h>
#include <simdjson.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "daemon/admin.h"
#include "daemon/version.h"
#include "model/hostport.h"

namespace endpointd::daemon {

namespace {

using simdjson::dom::element;

std::string str(element e, const char* key) {
  std::string_view v;
  if (e[key].get(v) != simdjson::SUCCESS) return {};
  return std::string(v);
}

uint64_t u64(element e, const char* key) {
  uint64_t v = 0;
  if (e[key].get(v) == simdjson::SUCCESS) return v;
  int64_t s = 0;
  if (e[key].get(s) == simdjson::SUCCESS && s > 0) return static_cast<uint64_t>(s);
  return 0;
}

int64_t i64(element e, const char* key) {
  int64_t v = 0;
  if (e[key].get(v) == simdjson::SUCCESS) return v;
  return 0;
}

bool boolean(element e, const char* key, bool dflt = false) {
  bool v = dflt;
  if (e[key].get(v) != simdjson::SUCCESS) return dflt;
  return v;
}

std::vector<std::string> strings(element e, const char* key) {
  std::vector<std::string> out;
  simdjson::dom::array a;
  if (e[key].get(a) != simdjson::SUCCESS) return out;
  for (element x : a) {
    std::string_view v;
    if (x.get(v) == simdjson::SUCCESS) out.emplace_back(v);
  }
  return out;
}

std::map<std::string, int64_t> numbers(element e, const char* key) {
  std::map<std::string, int64_t> out;
  simdjson::dom::object o;
  if (e[key].get(o) != simdjson::SUCCESS) return out;
  for (auto field : o) {
    int64_t v = 0;
    if (field.value.get(v) == simdjson::SUCCESS) out[std::string(field.key)] = v;
  }
  return out;
}

// ---- drawing ----

struct Paint {
  bool on = false;
  std::string operator()(std::string_view s, const char* code) const {
    if (!on) return std::string(s);
    return std::string("\033[") + code + "m" + std::string(s) + "\033[0m";
  }
  std::string ok(std::string_view s) const { return (*this)(s, "32"); }
  std::string warn(std::string_view s) const { return (*this)(s, "33"); }
  std::string bad(std::string_view s) const { return (*this)(s, "31"); }
  std::string dim(std::string_view s) const { return (*this)(s, "2"); }
  std::string bold(std::string_view s) const { return (*this)(s, "1"); }
};

// A state word padded to its column before it is coloured, so colour does not shift columns.
std::string state(const Paint& p, std::string_view word, char level, size_t width = 10) {
  std::string padded(word);
  if (padded.size() < width) padded.resize(width, ' ');
  switch (level) {
    case 'g':
      return p.ok(padded);
    case 'y':
      return p.warn(padded);
    case 'r':
      return p.bad(padded);
    default:
      return p.dim(padded);
  }
}

std::string pad(std::string_view s, size_t width) {
  std::string out(s);
  if (out.size() < width) out.resize(width, ' ');
  return out;
}

std::string duration(double seconds) {
  char b[32];
  if (seconds < 0) seconds = 0;
  if (seconds < 1)
    std::snprintf(b, sizeof b, "%.0f ms", seconds * 1000);
  else if (seconds < 120)
    std::snprintf(b, sizeof b, "%.1f s", seconds);
  else if (seconds < 7200)
    std::snprintf(b, sizeof b, "%.0f min", seconds / 60);
  else
    std::snprintf(b, sizeof b, "%.0f h", seconds / 3600);
  return b;
}

std::string clock_time(int64_t unix_ms) {
  time_t t = static_cast<time_t>(unix_ms / 1000);
  tm parts{};
  gmtime_r(&t, &parts);
  char b[32];
  std::strftime(b, sizeof b, "%H:%M:%SZ", &parts);
  return b;
}

std::string join(const std::vector<std::string>& v, std::string_view sep = ", ") {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

const char* kIndent = "               ";

std::string heading(std::string_view name) {
  return pad(std::string(name) + ":", 13);
}

// A feed subscriber's word, as istioctl proxy-status says it: SYNCED when it acknowledged
// the newest version sent, NACKED when it rejected one and has not acknowledged since, STALE
// when it is behind, gone or no longer waited for.
std::pair<const char*, char> subscriber_state(const StatusView::Subscriber& s) {
  if (s.lapsed == "nacking" || (!s.last_nack.empty() && s.acked < s.sent)) return {"NACKED", 'r'};
  if (!s.connected || !s.holding || s.acked < s.sent) return {"STALE", 'y'};
  return {"SYNCED", 'g'};
}

}  // namespace

Result<StatusView> parse_status(std::string_view json) {
  simdjson::dom::parser parser;
  element root;
  if (parser.parse(json.data(), json.size()).get(root) != simdjson::SUCCESS || !root.is_object())
    return Error{"the answer to /debug/state is not JSON: not an endpointd admin port"};
  if (str(root, "agent") != "endpointd") {
    if (root["generation"].error() == simdjson::SUCCESS &&
        root["sinks"].error() == simdjson::SUCCESS)
      return Error{
          "the agent is an endpointd older than this client (" + std::string(kVersion) +
          "): its /debug/state has no stateSchema; run the status command of the agent's own "
          "version (kubectl exec into its pod: endpointd status)"};
    return Error{
        "the answer to /debug/state is JSON but not endpointd's: not an endpointd "
        "admin port"};
  }
  StatusView v;
  v.version = str(root, "version");
  v.schema = static_cast<int>(i64(root, "stateSchema"));
  if (v.schema < kStatusMinSchema || v.schema > kStatusMaxSchema)
    return Error{"the agent (endpointd " + v.version + ") writes state schema " +
                 std::to_string(v.schema) + "; this client (" + std::string(kVersion) + ") reads " +
                 std::to_string(kStatusMinSchema) + ".." + std::to_string(kStatusMaxSchema) +
                 ": run the status command of the agent's own version (kubectl exec into its "
                 "pod: endpointd status)"};
  v.node = str(root, "node");
  v.source = str(root, "source");
  v.generation = u64(root, "generation");
  v.synced = boolean(root, "synced");
  element counts;
  if (root["counts"].get(counts) == simdjson::SUCCESS) {
    v.services = u64(counts, "services");
    v.endpoints = u64(counts, "endpoints");
    v.nodes = u64(counts, "nodes");
  }
  simdjson::dom::array arr;
  if (root["sinks"].get(arr) == simdjson::SUCCESS) {
    for (element s : arr) {
      StatusView::Sink k;
      k.name = str(s, "name");
      k.applied = u64(s, "appliedGeneration");
      double ago = 0;
      if (s["appliedSecondsAgo"].get(ago) == simdjson::SUCCESS) k.seconds_ago = ago;
      v.sinks.push_back(std::move(k));
    }
  }
  if (root["feed"].get(arr) == simdjson::SUCCESS) {
    v.feed.emplace();
    for (element s : arr) {
      StatusView::Subscriber f;
      f.client = str(s, "client");
      f.api = str(s, "api");
      f.peer = str(s, "peer");
      f.sent = u64(s, "sentVersion");
      f.acked = u64(s, "ackedVersion");
      f.acked_generation = u64(s, "ackedGeneration");
      f.nacks = u64(s, "nacks");
      f.last_nack = str(s, "lastNack");
      f.connected = boolean(s, "connected", true);
      f.holding = boolean(s, "holding", true);
      f.lapsed = str(s, "lapsed");
      v.feed->push_back(std::move(f));
    }
  }
  element c;
  if (root["drainCluster"].get(c) == simdjson::SUCCESS && c.is_object()) {
    StatusView::Cluster k;
    k.local = u64(c, "local_watermark");
    k.cluster = u64(c, "cluster_watermark");
    k.dns = u64(c, "cluster_dns_watermark");
    k.coverage_current = boolean(c, "coverage_current");
    k.members = u64(c, "members");
    k.holdouts = u64(c, "holdouts");
    k.member = boolean(c, "member");
    k.root = str(c, "root");
    std::string_view parent;
    if (c["parent"].get(parent) == simdjson::SUCCESS) k.parent = std::string(parent);
    k.children = strings(c, "children");
    k.excluded = strings(c, "excluded");
    k.suspects = strings(c, "suspects");
    k.departed = strings(c, "departed");
    element streams;
    if (c["streams"].get(streams) == simdjson::SUCCESS) {
      k.incoming = strings(streams, "incoming");
      k.outgoing = strings(streams, "outgoing");
    }
    v.cluster = std::move(k);
  }
  if (root["drains"].get(arr) == simdjson::SUCCESS) {
    for (element d : arr) {
      StatusView::Drain k;
      k.pod = str(d, "pod");
      k.address = str(d, "address");
      k.stage = str(d, "stage");
      k.release_after = str(d, "release_after");
      k.start_unix_ms = i64(d, "start_unix_ms");
      k.timeline_ms = numbers(d, "timeline_ms");
      k.timeline_unix_ms = numbers(d, "timeline_unix_ms");
      k.revision = u64(d, "revision");
      uint64_t flows = 0;
      if (d["live_flows"].get(flows) == simdjson::SUCCESS) k.live_flows = flows;
      k.outcome = str(d, "outcome");
      simdjson::dom::array peers;
      if (d["peers"].get(peers) == simdjson::SUCCESS)
        for (element p : peers)
          k.peers.push_back({str(p, "node"), str(p, "state"), str(p, "error")});
      simdjson::dom::array un;
      if (d["unconfirmed"].get(un) == simdjson::SUCCESS)
        for (element u : un)
          k.unconfirmed.push_back({str(u, "node"), str(u, "consumer"), str(u, "reason")});
      element after;
      if (d["late"]["after_release"].get(after) == simdjson::SUCCESS) {
        k.late_after_release = u64(after, "total");
        simdjson::dom::array senders;
        if (after["senders"].get(senders) == simdjson::SUCCESS)
          for (element s : senders) {
            std::string kind = str(s, "source"), name = str(s, "name"), node = str(s, "node");
            std::string who = kind == "external" ? "outside the cluster"
                              : name.empty()     ? "a " + kind + " of node " + node
                              : kind == "pod"    ? "pod " + name + " on " + node
                                                 : kind + " " + name;
            k.late_after_release_from += (k.late_after_release_from.empty() ? "" : ", ") + who +
                                         " (" + str(s, "address") +
                                         "): " + std::to_string(u64(s, "count"));
          }
        if (uint64_t others = u64(after, "others"))
          k.late_after_release_from += ", " + std::to_string(others) + " from others";
      }
      v.drains.push_back(std::move(k));
    }
  }
  if (root["sourceErrors"].get(arr) == simdjson::SUCCESS)
    for (element e : arr) v.source_errors.push_back({str(e, "where"), str(e, "reason")});
  return v;
}

std::string render_status(const StatusView& v, const RenderOptions& o) {
  Paint p{o.colour};
  std::ostringstream out;
  out << p.bold("endpointd " + v.version + " on " + v.node);
  if (!o.admin.empty()) out << p.dim(" · admin " + o.admin);
  if (o.now_unix_ms) out << p.dim(" · " + clock_time(o.now_unix_ms));
  out << "\n";

  // Source.
  std::string counts = std::to_string(v.services) + " services, " + std::to_string(v.endpoints) +
                       " endpoints, " + std::to_string(v.nodes) + " nodes";
  out << heading("Source");
  if (!v.synced)
    out << state(p, "Syncing", 'y') << v.source << ": first full list not in yet\n";
  else if (!v.source_errors.empty())
    out << state(p, "Warning", 'y') << v.source << ": synced, " << v.source_errors.size()
        << " error(s)\n";
  else
    out << state(p, "Ok", 'g') << v.source << ": synced\n";
  out << kIndent << "generation " << v.generation << ": " << counts << "\n";
  for (const auto& e : v.source_errors)
    out << kIndent << p.warn(e.where) << ": " << e.reason << "\n";

  // Sinks.
  out << heading("Sinks");
  if (v.sinks.empty()) {
    out << state(p, "None", '-') << "no consumer on this agent (no dataplane, DNS or feed)\n";
  } else {
    size_t current = 0;
    for (const auto& s : v.sinks) current += s.applied >= v.generation;
    out << state(p, current == v.sinks.size() ? "Ok" : "Behind",
                 current == v.sinks.size() ? 'g' : 'y')
        << current << "/" << v.sinks.size() << " at generation " << v.generation << "\n";
    for (const auto& s : v.sinks) {
      uint64_t lag = v.generation > s.applied ? v.generation - s.applied : 0;
      out << kIndent << pad(s.name, 10) << "applied " << pad(std::to_string(s.applied), 8)
          << (lag ? p.warn(pad("lag " + std::to_string(lag), 8)) : pad("lag 0", 8));
      if (s.seconds_ago) out << " " << duration(*s.seconds_ago) << " ago";
      out << "\n";
    }
  }

  // Feed subscribers.
  out << heading("Feed");
  if (!v.feed) {
    out << state(p, "Off", '-') << "no --feed-listen\n";
  } else {
    std::map<std::string, size_t> by;
    for (const auto& s : *v.feed) ++by[subscriber_state(s).first];
    bool all_synced = by["SYNCED"] == v.feed->size();
    std::string summary = std::to_string(v.feed->size()) + " subscriber(s)";
    for (const char* k : {"SYNCED", "STALE", "NACKED"})
      if (by[k]) summary += ", " + std::to_string(by[k]) + " " + k;
    out << state(p,
                 all_synced     ? "Ok"
                 : by["NACKED"] ? "Failed"
                                : "Warning",
                 all_synced     ? 'g'
                 : by["NACKED"] ? 'r'
                                : 'y')
        << summary << "\n";
    if (!v.feed->empty())
      out << kIndent
          << p.dim(pad("CLIENT", 22) + pad("API", 10) + pad("STATE", 8) + pad("SENT", 7) +
                   pad("ACKED", 7) + "NOTE")
          << "\n";
    for (const auto& s : *v.feed) {
      auto [word, level] = subscriber_state(s);
      std::string note;
      if (!s.connected) note = "gone";
      if (!s.holding) note += (note.empty() ? "" : ", ") + std::string("lapsed: ") + s.lapsed;
      if (!s.last_nack.empty() && s.acked < s.sent)
        note += (note.empty() ? "" : ", ") + std::string("nack: ") + s.last_nack;
      out << kIndent << pad(s.client.empty() ? s.peer : s.client, 22) << pad(s.api, 10)
          << state(p, word, level, 8) << pad(std::to_string(s.sent), 7)
          << pad(std::to_string(s.acked), 7) << note << "\n";
    }
  }

  // Peers and the cluster watermark.
  out << heading("Peers");
  if (!v.cluster) {
    out << state(p, "Off", '-')
        << "no cluster watermark: no peer port, or --drain-peer-protocol per-endpoint\n";
  } else {
    const auto& c = *v.cluster;
    std::vector<std::pair<std::string, std::string>> neighbours;  // node, role
    if (c.parent) neighbours.emplace_back(*c.parent, "parent");
    for (const auto& ch : c.children) neighbours.emplace_back(ch, "child");
    auto in = [](const std::vector<std::string>& v, const std::string& n) {
      return std::find(v.begin(), v.end(), n) != v.end();
    };
    size_t up = 0;
    for (const auto& [n, role] : neighbours) up += in(c.outgoing, n) || in(c.incoming, n) ? 1 : 0;
    bool fine = up == neighbours.size() && c.excluded.empty() && c.suspects.empty();
    std::string line;
    if (c.members <= 1)
      line = std::to_string(c.members) + " member: no peers to confirm with";
    else
      line = std::to_string(up) + "/" + std::to_string(neighbours.size()) +
             " neighbours reachable, " + std::to_string(c.members) + " members, root " + c.root;
    if (!c.excluded.empty()) line += ", " + std::to_string(c.excluded.size()) + " excluded";
    out << state(p,
                 fine                 ? "Ok"
                 : c.excluded.empty() ? "Warning"
                                      : "Degraded",
                 fine                 ? 'g'
                 : c.excluded.empty() ? 'y'
                                      : 'r')
        << line << (c.member ? "" : " (this node is not a member)") << "\n";
    out << kIndent << "watermark: local " << c.local << ", cluster " << c.cluster << ", DNS "
        << c.dns << (c.coverage_current ? "" : p.warn(" (coverage not current)"));
    if (c.holdouts) out << ", " << c.holdouts << " holdout(s)";
    out << "\n";
    for (const auto& [n, role] : neighbours) {
      bool reach = in(c.outgoing, n) || in(c.incoming, n);
      std::string word = in(c.excluded, n)   ? "EXCLUDED"
                         : in(c.suspects, n) ? "SILENT"
                         : reach             ? "UP"
                                             : "DOWN";
      char level = word == "UP" ? 'g' : word == "SILENT" || word == "DOWN" ? 'y' : 'r';
      out << kIndent << pad(n, 22) << pad(role, 10) << state(p, word, level, 8) << "\n";
    }
    std::vector<std::string> others;
    for (const auto& n : c.excluded)
      if (std::none_of(neighbours.begin(), neighbours.end(),
                       [&](const auto& x) { return x.first == n; }))
        others.push_back(n);
    if (!others.empty()) out << kIndent << p.bad("excluded: " + join(others)) << "\n";
    std::vector<std::string> quiet;
    for (const auto& n : c.suspects)
      if (std::none_of(neighbours.begin(), neighbours.end(),
                       [&](const auto& x) { return x.first == n; }))
        quiet.push_back(n);
    if (!quiet.empty()) out << kIndent << p.warn("silent: " + join(quiet)) << "\n";
    if (!c.departed.empty()) out << kIndent << "departed: " << join(c.departed) << "\n";
  }

  // Drains in flight.
  std::vector<const StatusView::Drain*> flight, done;
  for (const auto& d : v.drains) (d.stage == "released" ? done : flight).push_back(&d);
  out << heading("Drains");
  out << state(p, flight.empty() ? "Ok" : "Active", flight.empty() ? 'g' : 'y') << flight.size()
      << " in flight\n";
  for (const auto* d : flight) {
    out << kIndent << p.bold(pad(d->pod, 24)) << pad(d->address, 16) << d->stage;
    if (o.now_unix_ms && d->start_unix_ms)
      out << " for " << duration(static_cast<double>(o.now_unix_ms - d->start_unix_ms) / 1000);
    auto end = d->timeline_unix_ms.find("budget_end");
    if (o.now_unix_ms && end != d->timeline_unix_ms.end())
      out << ", " << duration(static_cast<double>(end->second - o.now_unix_ms) / 1000) << " left";
    if (d->live_flows) out << ", " << *d->live_flows << " live flow(s)";
    out << ", release after " << d->release_after << "\n";
    for (const auto& peer : d->peers) {
      char level = peer.state == "confirmed" ? 'g' : peer.state == "failed" ? 'r' : 'y';
      out << kIndent << "  " << pad(peer.node, 20) << state(p, peer.state, level, 10) << peer.error
          << "\n";
    }
    if (d->peers.empty() && v.cluster && d->stage == "stop-accepting") {
      const auto& c = *v.cluster;
      out << kIndent << "  cluster watermark " << c.cluster << ", needs " << d->revision;
      std::vector<std::string> waiting = c.suspects;
      for (const auto& n : c.excluded) waiting.push_back(n + " (excluded)");
      if (!waiting.empty()) out << "; not heard from: " << join(waiting);
      out << "\n";
    }
  }

  // The last releases, newest first.
  auto released_at = [](const StatusView::Drain* d) {
    auto it = d->timeline_unix_ms.find("released");
    return it == d->timeline_unix_ms.end() ? d->start_unix_ms : it->second;
  };
  std::stable_sort(done.begin(), done.end(),
                   [&](const auto* a, const auto* b) { return released_at(a) > released_at(b); });
  size_t shown = std::min(done.size(), o.releases);
  size_t unconfirmed = 0;
  for (size_t i = 0; i < shown; ++i) unconfirmed += done[i]->outcome != "confirmed";
  out << heading("Releases");
  if (done.empty())
    out << state(p, "None", '-') << "no pod released since the agent started\n";
  else
    out << state(p, unconfirmed ? "Warning" : "Ok", unconfirmed ? 'y' : 'g') << "last " << shown
        << " of " << done.size() << ": " << shown - unconfirmed << " confirmed, " << unconfirmed
        << " unconfirmed\n";
  for (size_t i = 0; i < shown; ++i) {
    const auto* d = done[i];
    auto ms = [&](const char* k) {
      auto it = d->timeline_ms.find(k);
      return it == d->timeline_ms.end() ? std::string("-") : std::to_string(it->second) + " ms";
    };
    bool ok = d->outcome == "confirmed";
    out << kIndent << pad(d->pod, 24) << pad(d->address, 16)
        << state(p, d->outcome.empty() ? "released" : d->outcome, ok ? 'g' : 'y', 12) << "removed "
        << ms("removed") << ", released " << ms("released");
    if (o.now_unix_ms) out << p.dim(" (" + clock_time(released_at(d)) + ")");
    out << "\n";
    for (const auto& u : d->unconfirmed)
      out << kIndent << "  " << p.warn("may still route: " + u.node + "/" + u.consumer) << " ("
          << u.reason << ")\n";
    if (d->late_after_release)
      out << kIndent << "  "
          << p.warn("then " + std::to_string(d->late_after_release) +
                    " new connection(s) after the release")
          << " from " << d->late_after_release_from << "\n";
  }
  if (o.colour) return out.str();
  // Without colour, no padding left at the ends of lines.
  std::string text = out.str(), trimmed;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    size_t end = nl;
    while (end > start && text[end - 1] == ' ') --end;
    trimmed.append(text, start, end - start);
    if (nl < text.size()) trimmed.push_back('\n');
    start = nl + 1;
  }
  return trimmed;
}

void add_status_flags(CLI::App& cmd, StatusFlags& f) {
  cmd.add_option("--admin", f.admin, "The agent's admin address (its --admin-listen)")
      ->capture_default_str();
  cmd.add_option("--token-file", f.token_file,
                 "A file holding the bearer token the agent's --admin-token-file requires");
  cmd.add_option("-o,--output", f.output, "text (one screen) or json (the state as read)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd.add_flag("-w,--watch", f.watch, "Draw the screen again every --interval until interrupted");
  cmd.add_option("--interval", f.interval, "Seconds between screens with --watch")
      ->check(CLI::Range(0.2, 3600.0))
      ->capture_default_str();
  cmd.add_option("--timeout", f.timeout, "Seconds to wait for the agent's answer")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
}

namespace {

// GET /debug/state; an error says what answered (or did not) and what to do.
Result<std::string> fetch_state(const model::HostPort& at, const std::string& token,
                                double timeout) {
  httplib::Client cli(at.host.empty() ? "127.0.0.1" : at.host, at.port);
  auto secs = static_cast<time_t>(timeout);
  auto usecs = static_cast<time_t>((timeout - static_cast<double>(secs)) * 1e6);
  cli.set_connection_timeout(secs, usecs);
  cli.set_read_timeout(secs, usecs);
  httplib::Headers h;
  if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
  auto res = cli.Get("/debug/state", h);
  std::string where = at.str();
  if (!res) {
    std::string why;
    switch (res.error()) {
      case httplib::Error::Connection:
        why = "cannot connect";
        break;
      case httplib::Error::ConnectionTimeout:
      case httplib::Error::Read:
        why = "no answer within " + duration(timeout);
        break;
      default:
        why = "HTTP: " + httplib::to_string(res.error());
    }
    return Error{"nothing answered at " + where + " (" + why +
                 "): is endpointd running there? its admin address is its --admin-listen "
                 "(default 127.0.0.1:10249)"};
  }
  if (res->status == 401)
    return Error{where +
                 " wants a bearer token: give --token-file (the agent's "
                 "--admin-token-file)"};
  if (res->status == 404)
    return Error{where +
                 " has no /debug/state: not an endpointd admin port (the health port "
                 "--health-listen has only the probes)"};
  if (res->status != 200)
    return Error{where + " answered /debug/state with HTTP " + std::to_string(res->status) + ": " +
                 res->body.substr(0, 200)};
  return res->body;
}

volatile sig_atomic_t interrupted = 0;

}  // namespace

int run_status(const StatusFlags& f, std::ostream& out, std::ostream& err) {
  auto at = model::parse_host_port(f.admin);
  if (!at) {
    err << "endpointd status: --admin: " << at.error() << "\n";
    return 2;
  }
  std::string token;
  if (!f.token_file.empty()) {
    auto t = read_token_file(f.token_file);
    if (!t) {
      err << "endpointd status: " << t.error() << "\n";
      return 2;
    }
    token = *t;
  }
  bool tty = isatty(STDOUT_FILENO) == 1;
  const char* term = std::getenv("TERM");
  bool colour =
      tty && std::getenv("NO_COLOR") == nullptr && !(term && std::string_view(term) == "dumb");
  if (f.watch) {
    interrupted = 0;
    signal(SIGINT, [](int) { interrupted = 1; });
    signal(SIGTERM, [](int) { interrupted = 1; });
  }
  bool first = true;
  do {
    auto body = fetch_state(*at, token, f.timeout);
    Result<StatusView> view = body ? parse_status(*body) : Result<StatusView>(Error{body.error()});
    if (!view) {
      // A watch keeps looking once it has shown the agent (a restart, a moment unreachable);
      // a first answer that is not endpointd's ends it.
      if (first || !f.watch) {
        err << "endpointd status: " << view.error() << "\n";
        return 2;
      }
      if (tty) out << "\033[H\033[2J";
      out << "endpointd status: " << view.error() << "\n" << std::flush;
    } else if (f.output == "json") {
      out << *body << "\n" << std::flush;
    } else {
      RenderOptions ro;
      ro.colour = colour;
      ro.admin = at->str();
      ro.now_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
      if (f.watch && tty) out << "\033[H\033[2J";
      if (f.watch && !tty && !first) out << "\n";
      out << render_status(*view, ro) << std::flush;
    }
    first = false;
    if (!f.watch) break;
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(f.interval * 1000));
    while (!interrupted && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (!interrupted);
  return 0;
}

}  // namespace endpointd::daemon
