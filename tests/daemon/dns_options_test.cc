// CoreDNS's kubernetes-plugin behaviours, end to end: the daemon on a manifest directory
// serving DNS, dig as the client. Each option as a cluster operator replacing CoreDNS sets it:
// another proxy's services, ExternalName into the zone, noendpoints, ignore empty_service,
// namespaces, pod records, the negative TTL, health lameduck, and a reload that changes them
// without a restart.
#include <gtest/gtest.h>
#include <httplib.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "daemon/config.h"
#include "daemon/daemon.h"

namespace endpointd::daemon {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string run(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

std::string web_service(const std::string& cluster_ip) {
  return "kind: Service\nmetadata: {name: web, namespace: demo}\n"
         "spec: {clusterIP: " +
         cluster_ip + ", ports: [{name: http, port: 80}]}\n";
}

// demo/web (two ready endpoints), demo/empty (its one endpoint not ready), demo/db (headless),
// demo/ext (ExternalName to web), demo/meshed (another proxy's), elsewhere/other.
constexpr const char* kCluster = R"(kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.0.1]
- addresses: [10.244.0.2]
---
kind: Service
metadata: {name: empty, namespace: demo}
spec: {clusterIP: 10.96.0.20, ports: [{name: http, port: 80}]}
---
kind: EndpointSlice
metadata: {name: empty-1, namespace: demo, labels: {kubernetes.io/service-name: empty}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.0.9]
  conditions: {ready: false}
---
kind: Service
metadata: {name: db, namespace: demo}
spec: {clusterIP: None, ports: [{name: pg, port: 5432}]}
---
kind: EndpointSlice
metadata: {name: db-1, namespace: demo, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: pg, port: 5432}]
endpoints:
- addresses: [10.244.1.1]
  hostname: db-0
---
kind: Service
metadata: {name: ext, namespace: demo}
spec: {type: ExternalName, externalName: web.demo.svc.cluster.local}
---
kind: Service
metadata:
  name: meshed
  namespace: demo
  labels: {service.kubernetes.io/service-proxy-name: some-mesh}
spec: {clusterIP: 10.96.0.30, ports: [{name: http, port: 80}]}
---
kind: Service
metadata: {name: other, namespace: elsewhere}
spec: {clusterIP: 10.96.0.40, ports: [{name: http, port: 80}]}
)";

class DnsOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endpointd-dnsopts-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ / "web.yaml") << web_service("10.96.0.10");
    std::ofstream(dir_ / "cluster.yaml") << kCluster;
    std::ofstream(dir_ / "nodes.yaml") << "kind: Node\nmetadata: {name: node-a}\n";
  }
  void TearDown() override {
    d_.reset();
    fs::remove_all(dir_);
  }

  Config config(const std::function<void(Config&)>& edit = {}) {
    Config cfg;
    cfg.source_dir = dir_;
    cfg.health_listen = std::nullopt;
    cfg.admin_listen = std::nullopt;
    cfg.node_name = "node-a";
    cfg.dataplane = Dataplane::kNone;
    cfg.drain_socket = (dir_ / "drain.sock").string();
    cfg.drain_peer_listen = std::nullopt;
    cfg.dns_listen = model::HostPort{"127.0.0.1", 0};
    cfg.dns_upstream = {model::HostPort{"127.0.0.1", 9}};  // never asked here
    cfg.dns_pod_records = dns::PodMode::kInsecure;
    if (edit) edit(cfg);
    return cfg;
  }
  void start(const std::function<void(Config&)>& edit = {}) {
    d_ = std::make_unique<Daemon>(config(edit));
    auto st = d_->start();
    ASSERT_TRUE(st) << st.error();
    // Synced once web answers.
    auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline && dig("+short web.demo.svc.cluster.local A") != "10.96.0.10\n")
      std::this_thread::sleep_for(10ms);  // polling a server for a state: nothing to await
  }
  std::string dig(const std::string& args) {
    return run("dig -p " + std::to_string(d_->dns_port()) + " @127.0.0.1 +time=2 +tries=1 " + args +
               " 2>&1");
  }
  bool nxdomain(const std::string& name) {
    return dig(name + " A").find("status: NXDOMAIN") != std::string::npos;
  }
  // Waits until `args` answers `want` (an edit or reload reaching the zone).
  std::string wait_for(const std::string& args, const std::string& want) {
    auto deadline = Clock::now() + 5s;
    std::string out;
    while (Clock::now() < deadline) {
      out = dig(args);
      if (out == want) break;
      std::this_thread::sleep_for(10ms);  // polling a server for a state: nothing to await
    }
    return out;
  }

  fs::path dir_;
  std::unique_ptr<Daemon> d_;
};

// CoreDNS serves services labelled service.kubernetes.io/service-proxy-name (only the
// dataplane leaves them to their proxy); so does endpointd.
TEST_F(DnsOptionsTest, AnotherProxysServiceIsAnswered) {
  start();
  EXPECT_EQ(dig("+short meshed.demo.svc.cluster.local A"), "10.96.0.30\n");
  EXPECT_EQ(dig("+short -x 10.96.0.30"), "meshed.demo.svc.cluster.local.\n");
}

// An ExternalName naming a service of the zone answers with the CNAME and the target's records
// in one reply, for A; AAAA (the target has none) gets the CNAME alone. When the target's
// address changes, the ExternalName's answer follows.
TEST_F(DnsOptionsTest, ExternalNameInTheZoneCarriesTheTargetsRecords) {
  start();
  std::string a = dig("+noall +answer ext.demo.svc.cluster.local A");
  EXPECT_NE(a.find("CNAME\tweb.demo.svc.cluster.local."), std::string::npos) << a;
  EXPECT_NE(a.find("web.demo.svc.cluster.local. 5\tIN\tA\t10.96.0.10"), std::string::npos) << a;
  EXPECT_LT(a.find("CNAME"), a.find("\tA\t")) << "the CNAME comes first: " << a;
  std::string aaaa = dig("+noall +answer ext.demo.svc.cluster.local AAAA");
  EXPECT_NE(aaaa.find("CNAME"), std::string::npos) << aaaa;
  EXPECT_EQ(aaaa.find("AAAA\t"), std::string::npos) << aaaa;

  std::ofstream(dir_ / "web.yaml", std::ios::trunc) << web_service("10.96.0.11");
  EXPECT_EQ(wait_for("+short web.demo.svc.cluster.local A", "10.96.0.11\n"), "10.96.0.11\n");
  a = dig("+noall +answer ext.demo.svc.cluster.local A");
  EXPECT_NE(a.find("10.96.0.11"), std::string::npos) << a;
  EXPECT_EQ(a.find("10.96.0.10"), std::string::npos) << a;

  fs::remove(dir_ / "web.yaml");  // the target gone: the CNAME alone
  auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline && !nxdomain("web.demo.svc.cluster.local"))
    std::this_thread::sleep_for(10ms);  // polling a server for a state: nothing to await
  ASSERT_TRUE(nxdomain("web.demo.svc.cluster.local"));
  a = dig("+noall +answer ext.demo.svc.cluster.local A");
  EXPECT_NE(a.find("CNAME"), std::string::npos) << a;
  EXPECT_EQ(a.find("\tA\t"), std::string::npos) << a;
}

TEST_F(DnsOptionsTest, NoendpointsMakesHeadlessServicesNxdomain) {
  start([](Config& c) { c.dns_noendpoints = true; });
  EXPECT_TRUE(nxdomain("db.demo.svc.cluster.local"));
  EXPECT_TRUE(nxdomain("db-0.db.demo.svc.cluster.local"));
  EXPECT_EQ(dig("+short web.demo.svc.cluster.local A"), "10.96.0.10\n");
}

TEST_F(DnsOptionsTest, WithoutNoendpointsHeadlessServicesAnswer) {
  start();
  EXPECT_EQ(dig("+short db.demo.svc.cluster.local A"), "10.244.1.1\n");
  EXPECT_EQ(dig("+short db-0.db.demo.svc.cluster.local A"), "10.244.1.1\n");
  EXPECT_EQ(dig("+short empty.demo.svc.cluster.local A"), "10.96.0.20\n");
}

TEST_F(DnsOptionsTest, IgnoreEmptyServiceMakesAServiceWithoutReadyEndpointsNxdomain) {
  start([](Config& c) { c.dns_ignore_empty_service = true; });
  EXPECT_TRUE(nxdomain("empty.demo.svc.cluster.local"));
  EXPECT_EQ(dig("+short web.demo.svc.cluster.local A"), "10.96.0.10\n");
  // Its endpoint turns ready: the service answers again.
  std::string text = kCluster;
  text.replace(text.find("  conditions: {ready: false}\n"),
               std::string("  conditions: {ready: false}\n").size(), "");
  std::ofstream(dir_ / "cluster.yaml", std::ios::trunc) << text;
  EXPECT_EQ(wait_for("+short empty.demo.svc.cluster.local A", "10.96.0.20\n"), "10.96.0.20\n");
}

TEST_F(DnsOptionsTest, NamespacesFilterHidesTheOthers) {
  start([](Config& c) { c.dns_namespaces = {"demo"}; });
  EXPECT_EQ(dig("+short web.demo.svc.cluster.local A"), "10.96.0.10\n");
  EXPECT_TRUE(nxdomain("other.elsewhere.svc.cluster.local"));
  EXPECT_TRUE(nxdomain("elsewhere.svc.cluster.local"));
  EXPECT_TRUE(nxdomain("10-244-0-7.elsewhere.pod.cluster.local"));
  EXPECT_EQ(dig("+short 10-244-0-7.demo.pod.cluster.local A"), "10.244.0.7\n");
}

// `pods verified` answers a pod name only for a pod that exists, whichever node runs it;
// `pods insecure` (kubeadm's default) answers any well-formed one.
TEST_F(DnsOptionsTest, VerifiedPodRecordsAnswerPodsOfEveryNodeAndNothingElse) {
  std::ofstream(dir_ / "pods.yaml") << R"(kind: Pod
metadata: {name: here, namespace: demo, uid: u1}
spec: {nodeName: node-a}
status: {phase: Running, podIPs: [{ip: 10.244.2.5}]}
---
kind: Pod
metadata: {name: there, namespace: demo, uid: u2}
spec: {nodeName: node-b}
status: {phase: Running, podIPs: [{ip: 10.244.3.5}]}
)";
  start([](Config& c) { c.dns_pod_records = dns::PodMode::kVerified; });
  EXPECT_EQ(wait_for("+short 10-244-3-5.demo.pod.cluster.local A", "10.244.3.5\n"), "10.244.3.5\n");
  EXPECT_EQ(dig("+short 10-244-2-5.demo.pod.cluster.local A"), "10.244.2.5\n");
  EXPECT_TRUE(nxdomain("10-244-3-99.demo.pod.cluster.local"));
  EXPECT_TRUE(nxdomain("10-244-3-5.elsewhere.pod.cluster.local")) << "a pod of another namespace";
}

TEST_F(DnsOptionsTest, InsecurePodRecordsAnswerAnyWellFormedName) {
  start();
  EXPECT_EQ(dig("+short 10-244-3-99.demo.pod.cluster.local A"), "10.244.3.99\n");
  EXPECT_TRUE(nxdomain("10-244-3.demo.pod.cluster.local"));
}

TEST_F(DnsOptionsTest, NegativeTtlIsTheSoaMinimum) {
  start([](Config& c) { c.dns_negative_ttl = 17s; });
  std::string out = dig("+noall +authority nope.demo.svc.cluster.local A");
  // The SOA's own TTL and its minimum field: both the negative TTL.
  EXPECT_NE(out.find("cluster.local.\t\t17\tIN\tSOA"), std::string::npos) << out;
  EXPECT_NE(out.find(" 17\n"), std::string::npos) << out;
}

// /metrics counts every query answered before the scrape: the DNS threads count into blocks
// of their own, and the scrape folds them into the registry.
TEST_F(DnsOptionsTest, MetricsScrapeCountsEveryQueryAnswered) {
  start([](Config& c) { c.admin_listen = model::HostPort{"127.0.0.1", 0}; });
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(nxdomain("nope" + std::to_string(i) + ".demo.svc.cluster.local"));
  ASSERT_EQ(dig("+short +tcp db.demo.svc.cluster.local A"), "10.244.1.1\n");
  httplib::Client admin("127.0.0.1", d_->admin_port());
  auto m = admin.Get("/metrics");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("endpointd_dns_queries_total{rcode=\"NXDOMAIN\",type=\"A\"} 3\n"),
            std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("coredns_dns_responses_total{rcode=\"NXDOMAIN\""), std::string::npos);
  // Asked again with nothing new: the same count, folded once.
  m = admin.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("endpointd_dns_queries_total{rcode=\"NXDOMAIN\",type=\"A\"} 3\n"),
            std::string::npos);
}

// A reload changes the zone's options at once, without a restart; a reload that cannot be
// applied (the zone renamed) changes nothing.
TEST_F(DnsOptionsTest, ReloadAppliesTheZoneOptionsWithoutARestart) {
  start();
  int port = d_->dns_port();
  EXPECT_NE(dig("+noall +answer web.demo.svc.cluster.local A").find(" 5\tIN\tA"),
            std::string::npos);
  ASSERT_TRUE(d_->reload(config([](Config& c) {
    c.dns_ttl = 30s;
    c.dns_noendpoints = true;
  })));
  EXPECT_EQ(d_->dns_port(), port);
  std::string out = dig("+noall +answer web.demo.svc.cluster.local A");
  EXPECT_NE(out.find(" 30\tIN\tA\t10.96.0.10"), std::string::npos) << out;
  EXPECT_TRUE(nxdomain("db.demo.svc.cluster.local"));

  auto st = d_->reload(config([](Config& c) { c.dns_zone = "other.local"; }));
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().find("zone"), std::string::npos) << st.error();
  EXPECT_NE(st.error().find("restart"), std::string::npos) << st.error();
  EXPECT_EQ(dig("+short web.demo.svc.cluster.local A"), "10.96.0.10\n");
  EXPECT_TRUE(nxdomain("db.demo.svc.cluster.local")) << "the last reload's options stay";

  // Edits after a reload still reach the zone (the builder kept following snapshots).
  std::ofstream(dir_ / "web.yaml", std::ios::trunc) << web_service("10.96.0.12");
  EXPECT_EQ(wait_for("+short web.demo.svc.cluster.local A", "10.96.0.12\n"), "10.96.0.12\n");
}

// CoreDNS's health lameduck: once shutdown begins (SIGTERM) readiness fails at once while DNS
// goes on answering for --dns-lameduck, so resolvers move on before the socket closes.
TEST_F(DnsOptionsTest, LameduckAnswersWhileReadinessFails) {
  start([](Config& c) {
    c.health_listen = model::HostPort{"127.0.0.1", 0};
    c.dns_lameduck = 3s;
  });
  httplib::Client health("127.0.0.1", d_->health_port());
  auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    auto r = health.Get("/readyz");
    if (r && r->status == 200) break;
    std::this_thread::sleep_for(5ms);  // polling a probe: nothing to await
  }
  auto ready = health.Get("/readyz");
  ASSERT_TRUE(ready && ready->status == 200);
  EXPECT_EQ(dig("+short web.demo.svc.cluster.local A"), "10.96.0.10\n");
  EXPECT_EQ(d_->begin_lameduck(), 3s);
  auto r = health.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("lameduck"), std::string::npos) << r->body;
  EXPECT_EQ(dig("+short web.demo.svc.cluster.local A"), "10.96.0.10\n")
      << "DNS still answers in lameduck";
}

// A mounted ConfigMap changes by a symlink swap: the content is what is compared.
TEST(ConfigFileWatch, SeesContentChangesOnceAndSymlinkSwaps) {
  char tmpl[] = "/tmp/endpointd-watch-XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::ofstream(dir / "a.yaml") << "dns-ttl: 5\n";
  std::ofstream(dir / "b.yaml") << "dns-ttl: 30\n";
  fs::create_symlink(dir / "a.yaml", dir / "config.yaml");
  ConfigFileWatch w((dir / "config.yaml").string());
  EXPECT_FALSE(w.changed());
  fs::create_symlink(dir / "b.yaml", dir / "next");
  fs::rename(dir / "next", dir / "config.yaml");  // atomic, as the kubelet swaps ..data
  EXPECT_TRUE(w.changed());
  EXPECT_FALSE(w.changed()) << "once per change";
  std::ofstream(dir / "b.yaml", std::ios::trunc) << "dns-ttl: 30\n";  // rewritten, same content
  EXPECT_FALSE(w.changed());
  fs::remove(dir / "config.yaml");
  EXPECT_TRUE(w.changed()) << "gone counts as a change";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace endpointd::daemon
