// `endpointd check`: each check is a function of the configuration and the environment; the
// nftables probe is the only one that changes anything, a table of its own it deletes at once.
#include "daemon/check.h"

#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/table.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "daemon/kube_request.h"
#include "proxy/new_flows.h"

namespace endpointd::daemon {

namespace {

struct MnlDeleter {
  void operator()(mnl_socket* s) const { mnl_socket_close(s); }
};
struct TableDeleter {
  void operator()(nftnl_table* t) const { nftnl_table_free(t); }
};
struct ChainDeleter {
  void operator()(nftnl_chain* c) const { nftnl_chain_free(c); }
};

// Sends one batch (BEGIN, the messages `build` adds, END) with an acknowledgement asked for
// the last message, and waits for it or the first error.
Status send_batch(mnl_socket* nl, const std::function<int(mnl_nlmsg_batch*, uint32_t&)>& build,
                  const std::string& what) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE * 2);
  mnl_nlmsg_batch* b = mnl_nlmsg_batch_start(buf.data(), buf.size());
  uint32_t seq = static_cast<uint32_t>(time(nullptr));
  nftnl_batch_begin(static_cast<char*>(mnl_nlmsg_batch_current(b)), seq++);
  mnl_nlmsg_batch_next(b);
  if (build(b, seq) < 0) {
    mnl_nlmsg_batch_stop(b);
    return Error{what + ": cannot encode"};
  }
  nftnl_batch_end(static_cast<char*>(mnl_nlmsg_batch_current(b)), seq++);
  mnl_nlmsg_batch_next(b);
  ssize_t sent = mnl_socket_sendto(nl, mnl_nlmsg_batch_head(b), mnl_nlmsg_batch_size(b));
  mnl_nlmsg_batch_stop(b);
  if (sent < 0) return Error{what + ": " + std::strerror(errno)};
  uint32_t portid = mnl_socket_get_portid(nl);
  std::vector<char> rx(MNL_SOCKET_BUFFER_SIZE);
  while (true) {
    ssize_t n = mnl_socket_recvfrom(nl, rx.data(), rx.size());
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return Error{what + ": no answer from the kernel"};
      return Error{what + ": " + std::strerror(errno)};
    }
    int rc = mnl_cb_run(rx.data(), static_cast<size_t>(n), 0, portid, nullptr, nullptr);
    if (rc < 0) return Error{what + ": " + std::strerror(errno)};
    if (rc == MNL_CB_STOP) return {};
  }
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

CheckLine ok(std::string name, std::string detail) {
  return {CheckLine::State::kOk, std::move(name), std::move(detail), {}};
}
CheckLine fail(std::string name, std::string detail, std::string fix) {
  return {CheckLine::State::kFail, std::move(name), std::move(detail), std::move(fix)};
}
CheckLine skip(std::string name, std::string detail) {
  return {CheckLine::State::kSkip, std::move(name), std::move(detail), {}};
}

CheckLine check_nftables(const Config& cfg, const CheckEnv& env) {
  if (cfg.dataplane != Dataplane::kNftables)
    return skip("nftables", "--dataplane none: the agent programs no rules");
  std::string table = "endpointd-check-" + std::to_string(getpid());
  auto st = env.nft_scratch ? env.nft_scratch(table) : Status(Error{"no probe"});
  if (st)
    return ok("nftables", "made and deleted table ip " + table +
                              " with a nat prerouting chain in this network namespace");
  const std::string& e = st.error();
  if (e.find("not permitted") != std::string::npos)
    return fail("nftables", e,
                "run as root or with CAP_NET_ADMIN (the chart's securityContext adds it)");
  return fail("nftables", e,
              "the kernel needs nf_tables and nft_chain_nat (modprobe nf_tables nft_chain_nat; "
              "CONFIG_NF_TABLES, CONFIG_NFT_NAT)");
}

CheckLine check_conntrack(const CheckEnv& env) {
  std::string max = read_first_line(env.proc_sys + "/net/netfilter/nf_conntrack_max");
  if (max.empty())
    return fail("conntrack", "no " + env.proc_sys + "/net/netfilter/nf_conntrack_max",
                "load nf_conntrack (modprobe nf_conntrack): NAT, UDP cleanup and the drain's "
                "connection counts need it");
  std::string count = read_first_line(env.proc_sys + "/net/netfilter/nf_conntrack_count");
  return ok("conntrack",
            "nf_conntrack loaded: " + (count.empty() ? "?" : count) + " of " + max + " entries");
}

std::vector<CheckLine> check_sysctls(const Config& cfg, const CheckEnv& env) {
  std::vector<CheckLine> out;
  if (cfg.dataplane != Dataplane::kNftables) {
    out.push_back(skip("sysctl", "--dataplane none: the node's forwarding is not the agent's"));
    return out;
  }
  std::string fwd = read_first_line(env.proc_sys + "/net/ipv4/ip_forward");
  if (fwd == "1")
    out.push_back(ok("sysctl net.ipv4.ip_forward", "1"));
  else
    out.push_back(fail("sysctl net.ipv4.ip_forward", fwd.empty() ? "unreadable" : fwd,
                       "sysctl -w net.ipv4.ip_forward=1: service traffic to pods on other nodes "
                       "is forwarded"));
  // Only bridge CNIs need bridged pod traffic to pass the netfilter hooks; without
  // br_netfilter loaded the file is not there and nothing is asked.
  std::string br = read_first_line(env.proc_sys + "/net/bridge/bridge-nf-call-iptables");
  if (br == "0")
    out.push_back(fail("sysctl net.bridge.bridge-nf-call-iptables", "0",
                       "sysctl -w net.bridge.bridge-nf-call-iptables=1: with a bridge CNI, "
                       "traffic from a pod to a service with an endpoint on the same bridge "
                       "must pass the nftables hooks"));
  else if (!br.empty())
    out.push_back(ok("sysctl net.bridge.bridge-nf-call-iptables", br));
  return out;
}

// Not a failure: without the events the agent drains as before, and says late senders go
// unnamed (README, "Who still sends after the removal").
CheckLine check_conntrack_events(const CheckEnv& env) {
  if (auto st = env.conntrack_events(); !st)
    return skip("conntrack events",
                "unavailable (" + st.error() +
                    "): late senders after a removal go unnamed, and release-after silent is "
                    "the removal plus the quiet time");
  return ok("conntrack events", "ctnetlink NEW events readable: late senders are named");
}

CheckLine check_drain_socket(const Config& cfg) {
  if (cfg.drain_socket.empty()) return skip("drain socket", "no --drain-socket: drains off");
  std::filesystem::path dir = std::filesystem::path(cfg.drain_socket).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return fail("drain socket", dir.string() + " does not exist",
                "mkdir -p " + dir.string() +
                    " (the chart mounts it as a hostPath; pods mount the same directory "
                    "read-only for endpointd prestop)");
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    return fail("drain socket", dir.string() + ": " + std::strerror(errno),
                "the agent makes its socket there: run it as the directory's owner or root");
  return ok("drain socket", dir.string() + " is a directory the agent can write");
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::vector<CheckLine> check_api(const Config& cfg, const CheckEnv& env) {
  std::vector<CheckLine> out;
  if (!cfg.source_dir.empty()) {
    out.push_back(skip("api", "--source-dir: a manifest directory, no API server"));
    out.push_back(skip("rbac", "--source-dir: nothing to ask for"));
    out.push_back(skip("clock skew", "--source-dir: no API server to compare with"));
    return out;
  }
  auto cluster = cluster_config(cfg.kubeconfig);
  if (!cluster) {
    out.push_back(fail("api", cluster.error(),
                       "give --kubeconfig (or run in a pod with its service account)"));
    return out;
  }
  KubeRequester api(*cluster);
  auto version = api.request("GET", "/version");
  if (!version) {
    out.push_back(
        fail("api", version.error(), "check the server address and that this node reaches it"));
    return out;
  }
  if (version->status == 401 || version->status == 403) {
    out.push_back(fail("api",
                       cluster->server + " answered /version " + std::to_string(version->status),
                       "the credentials in " + cluster->origin + " are refused"));
    return out;
  }
  std::string git;
  {
    simdjson::dom::parser p;
    simdjson::dom::element root;
    std::string_view v;
    if (p.parse(version->body).get(root) == simdjson::SUCCESS &&
        root["gitVersion"].get(v) == simdjson::SUCCESS)
      git = std::string(v);
  }
  out.push_back(ok("api", cluster->server + " answers" + (git.empty() ? "" : " (" + git + ")")));
  // Clock skew: drain budgets are counted from the API's deletionTimestamp.
  auto date = parse_http_date(version->date);
  if (!date) {
    out.push_back(fail("clock skew", "the API's answer has no Date header to compare with",
                       "an API server always sends Date; is something between rewriting it?"));
  } else {
    auto now = env.now ? env.now() : std::chrono::system_clock::now();
    int64_t local =
        std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
    int64_t skew = local - *date;
    std::string said = std::to_string(skew < 0 ? -skew : skew) + " s " +
                       (skew < 0 ? "behind" : "ahead of") + " the API server";
    if ((skew < 0 ? -skew : skew) > env.max_clock_skew.count())
      out.push_back(fail("clock skew", "this node is " + said,
                         "synchronise the node's clock (chrony, systemd-timesyncd): drain "
                         "budgets count from the API's deletionTimestamp"));
    else
      out.push_back(ok("clock skew", "within " + std::to_string(env.max_clock_skew.count()) +
                                         " s (" + said + ", to the second)"));
  }
  // The verbs the agent uses, each asked of the server for the credentials above.
  std::vector<std::tuple<std::string, std::string, std::string>> asks;  // verb, group, resource
  for (const auto& [group, resource] : watched_resources(cfg))
    for (const char* verb : {"list", "watch"}) asks.emplace_back(verb, group, resource);
  // Events on the pods this node drains (daemon/events.h).
  if (cfg.events)
    for (const char* verb : {"create", "patch"}) asks.emplace_back(verb, "events.k8s.io", "events");
  for (const auto& [verb_s, group, resource] : asks) {
    {
      const char* verb = verb_s.c_str();
      std::string name = std::string("rbac ") + verb + " " + resource;
      std::string body =
          R"({"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview",)"
          R"("spec":{"resourceAttributes":{"verb":)" +
          json_quote(verb) + R"(,"group":)" + json_quote(group) + R"(,"resource":)" +
          json_quote(resource) + "}}}";
      auto r = api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body);
      if (!r || r->status != 201) {
        out.push_back(fail(
            name, r ? "SelfSubjectAccessReview answered " + std::to_string(r->status) : r.error(),
            "the API server must allow creating selfsubjectaccessreviews "
            "(every authenticated user may, by default)"));
        continue;
      }
      simdjson::dom::parser p;
      simdjson::dom::element root;
      bool allowed = false;
      std::string_view reason;
      if (p.parse(r->body).get(root) == simdjson::SUCCESS) {
        if (root["status"]["allowed"].get(allowed) != simdjson::SUCCESS) allowed = false;
        if (root["status"]["reason"].get(reason) != simdjson::SUCCESS) reason = {};
      }
      std::string what = (group.empty() ? "" : group + "/") + resource;
      if (allowed)
        out.push_back(ok(name, "granted"));
      else
        out.push_back(fail(name, "not granted" + (reason.empty() ? "" : ": " + std::string(reason)),
                           "grant " + std::string(verb) + " on " + what +
                               " to the agent's account (the chart's ClusterRole, "
                               "helm/endpointd/templates/rbac.yaml)" +
                               (resource == "events" ? "; or run with --events false" : "")));
    }
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> watched_resources(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> r = {
      {"", "services"}, {"discovery.k8s.io", "endpointslices"}, {"", "nodes"}};
  if (cfg.watch_pods) r.emplace_back("", "pods");
  return r;
}

Status nft_scratch_table(const std::string& name) {
  std::unique_ptr<mnl_socket, MnlDeleter> nl(mnl_socket_open(NETLINK_NETFILTER));
  if (!nl) return Error{std::string("netlink socket: ") + std::strerror(errno)};
  if (mnl_socket_bind(nl.get(), 0, MNL_SOCKET_AUTOPID) < 0)
    return Error{std::string("netlink bind: ") + std::strerror(errno)};
  timeval tv{2, 0};
  setsockopt(mnl_socket_get_fd(nl.get()), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto st = send_batch(
      nl.get(),
      [&](mnl_nlmsg_batch* b, uint32_t& seq) {
        std::unique_ptr<nftnl_table, TableDeleter> t(nftnl_table_alloc());
        nftnl_table_set_str(t.get(), NFTNL_TABLE_NAME, name.c_str());
        nlmsghdr* nlh =
            nftnl_nlmsg_build_hdr(static_cast<char*>(mnl_nlmsg_batch_current(b)), NFT_MSG_NEWTABLE,
                                  NFPROTO_IPV4, NLM_F_CREATE | NLM_F_EXCL, seq++);
        nftnl_table_nlmsg_build_payload(nlh, t.get());
        if (!mnl_nlmsg_batch_next(b)) return -1;
        std::unique_ptr<nftnl_chain, ChainDeleter> c(nftnl_chain_alloc());
        nftnl_chain_set_str(c.get(), NFTNL_CHAIN_TABLE, name.c_str());
        nftnl_chain_set_str(c.get(), NFTNL_CHAIN_NAME, "probe");
        nftnl_chain_set_u32(c.get(), NFTNL_CHAIN_HOOKNUM, NF_INET_PRE_ROUTING);
        nftnl_chain_set_s32(c.get(), NFTNL_CHAIN_PRIO, -100);
        nftnl_chain_set_str(c.get(), NFTNL_CHAIN_TYPE, "nat");
        nlh =
            nftnl_nlmsg_build_hdr(static_cast<char*>(mnl_nlmsg_batch_current(b)), NFT_MSG_NEWCHAIN,
                                  NFPROTO_IPV4, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, seq++);
        nftnl_chain_nlmsg_build_payload(nlh, c.get());
        return mnl_nlmsg_batch_next(b) ? 0 : -1;
      },
      "cannot create table ip " + name);
  if (!st) return st;
  return send_batch(
      nl.get(),
      [&](mnl_nlmsg_batch* b, uint32_t& seq) {
        std::unique_ptr<nftnl_table, TableDeleter> t(nftnl_table_alloc());
        nftnl_table_set_str(t.get(), NFTNL_TABLE_NAME, name.c_str());
        nlmsghdr* nlh = nftnl_nlmsg_build_hdr(static_cast<char*>(mnl_nlmsg_batch_current(b)),
                                              NFT_MSG_DELTABLE, NFPROTO_IPV4, NLM_F_ACK, seq++);
        nftnl_table_nlmsg_build_payload(nlh, t.get());
        return mnl_nlmsg_batch_next(b) ? 0 : -1;
      },
      "cannot delete table ip " + name);
}

CheckEnv default_check_env() {
  CheckEnv env;
  env.nft_scratch = nft_scratch_table;
  env.conntrack_events = []() -> Status {
    auto w = proxy::NewFlowWatch::open(16);
    if (!w) return Error{w.error()};
    return {};
  };
  return env;
}

std::vector<CheckLine> run_checks(const Config& cfg, const CheckEnv& env) {
  std::vector<CheckLine> out;
  out.push_back(check_nftables(cfg, env));
  out.push_back(check_conntrack(env));
  if (env.conntrack_events) out.push_back(check_conntrack_events(env));
  for (auto& l : check_sysctls(cfg, env)) out.push_back(std::move(l));
  for (auto& l : check_api(cfg, env)) out.push_back(std::move(l));
  out.push_back(check_drain_socket(cfg));
  return out;
}

std::string render_checks(const std::vector<CheckLine>& lines, bool colour) {
  auto paint = [&](std::string_view s, const char* code) {
    return colour ? std::string("\033[") + code + "m" + std::string(s) + "\033[0m" : std::string(s);
  };
  size_t width = 0;
  for (const auto& l : lines) width = std::max(width, l.name.size());
  std::ostringstream out;
  size_t failed = 0, skipped = 0;
  for (const auto& l : lines) {
    std::string word = l.state == CheckLine::State::kOk     ? paint("ok  ", "32")
                       : l.state == CheckLine::State::kFail ? paint("FAIL", "31")
                                                            : paint("skip", "2");
    failed += l.state == CheckLine::State::kFail;
    skipped += l.state == CheckLine::State::kSkip;
    std::string name = l.name;
    name.resize(width, ' ');
    out << word << "  " << name << "  " << l.detail << "\n";
    if (!l.fix.empty()) out << "      " << std::string(width, ' ') << "  → " << l.fix << "\n";
  }
  out << lines.size() << " checks: " << lines.size() - failed - skipped << " ok, " << failed
      << " failed, " << skipped << " skipped\n";
  return out.str();
}

int check_main(CLI::App& cmd, std::chrono::seconds max_skew, std::ostream& out, std::ostream& err) {
  auto flags = raw_flags(cmd);
  flags.erase("max-clock-skew");  // check's own
  auto cfg = load_config(flags);
  if (!cfg) {
    err << "endpointd check: " << cfg.error() << "\n";
    return 2;
  }
  resolve_defaults(*cfg);
  CheckEnv env = default_check_env();
  env.max_clock_skew = max_skew;
  auto lines = run_checks(*cfg, env);
  const char* term = std::getenv("TERM");
  bool colour = isatty(STDOUT_FILENO) == 1 && std::getenv("NO_COLOR") == nullptr &&
                !(term && std::string_view(term) == "dumb");
  out << render_checks(lines, colour);
  for (const auto& l : lines)
    if (l.state == CheckLine::State::kFail) return 1;
  return 0;
}

}  // namespace endpointd::daemon
