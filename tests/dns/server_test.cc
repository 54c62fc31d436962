// The server on loopback: asked by dig/kdig (subprocesses) and by endpointd's own codec, with
// a fake upstream on loopback for forwarding.
#include "dns/sink.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "tests/dns/test_util.h"

namespace endpointd::dns {
namespace {

using namespace testing;

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

const sockaddr* as_sa(const sockaddr_in* a) {
  return reinterpret_cast<const sockaddr*>(a);
}

// One UDP exchange; empty when nothing came back within the timeout.
std::vector<uint8_t> udp_ask(uint16_t port, const std::vector<uint8_t>& pkt,
                             int timeout_ms = 2000) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a = loopback(port);
  sendto(fd, pkt.data(), pkt.size(), 0, as_sa(&a), sizeof a);
  pollfd p{fd, POLLIN, 0};
  std::vector<uint8_t> out;
  if (poll(&p, 1, timeout_ms) == 1) {
    out.resize(65535);
    ssize_t n = recv(fd, out.data(), out.size(), 0);
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  close(fd);
  return out;
}

bool read_full(int fd, uint8_t* p, size_t n) {
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, 3000) != 1) return false;
    ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Several queries on one TCP connection, answers read in order.
std::vector<std::vector<uint8_t>> tcp_ask(uint16_t port,
                                          const std::vector<std::vector<uint8_t>>& pkts) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port);
  std::vector<std::vector<uint8_t>> out;
  if (connect(fd, as_sa(&a), sizeof a) != 0) {
    close(fd);
    return out;
  }
  std::vector<uint8_t> all;
  for (const auto& p : pkts) {
    all.push_back(static_cast<uint8_t>(p.size() >> 8));
    all.push_back(static_cast<uint8_t>(p.size()));
    all.insert(all.end(), p.begin(), p.end());
  }
  send(fd, all.data(), all.size(), MSG_NOSIGNAL);
  for (size_t i = 0; i < pkts.size(); ++i) {
    uint8_t len[2];
    if (!read_full(fd, len, 2)) break;
    std::vector<uint8_t> m(load_u16(len));
    if (!read_full(fd, m.data(), m.size())) break;
    out.push_back(std::move(m));
  }
  close(fd);
  return out;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  pclose(f);
  return out;
}

// A tiny upstream: example.org A 192.0.2.1 (TTL 2), missing.example NXDOMAIN (SOA minimum 1),
// refused.example REFUSED, and silence for everything else.
class FakeUpstream {
 public:
  FakeUpstream() {
    fd_ = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a = loopback(0);
    bind(fd_, as_sa(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeUpstream() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  uint16_t port() const { return port_; }
  int queries() const { return queries_.load(); }

 private:
  void serve() {
    uint8_t in[1500], out[1500];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) != 1) continue;
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      ssize_t n = recvfrom(fd_, in, sizeof in, 0, reinterpret_cast<sockaddr*>(&from), &fl);
      if (n <= 0) continue;
      queries_++;
      Query q = parse_query({in, static_cast<size_t>(n)});
      if (q.status != ParseStatus::kOk) continue;
      std::string name = name_to_text(q.qname_lower.span());
      Writer w(out, sizeof out);
      uint16_t flags = flag::kQR | flag::kRA | (q.flags & flag::kRD);
      if (name == "example.org." && q.qtype == type::kA) {
        w.header(q.id, flags, 1, 1, 0, 0);
        w.name(q.qname.span());
        w.u16(q.qtype);
        w.u16(kClassIN);
        size_t at = w.begin_rr(q.qname.span(), type::kA, kClassIN, 2);
        w.bytes(std::vector<uint8_t>{192, 0, 2, 1});
        w.end_rr(at);
      } else if (name == "missing.example.") {
        w.header(q.id, flags | 3, 1, 0, 1, 0);
        w.name(q.qname.span());
        w.u16(q.qtype);
        w.u16(kClassIN);
        auto apex = name_from_text("example");
        size_t at = w.begin_rr(apex->span(), type::kSOA, kClassIN, 60);
        w.name(name_from_text("ns.example")->span());
        w.name(name_from_text("h.example")->span());
        for (uint32_t v : {1u, 2u, 3u, 4u, 1u}) w.u32(v);
        w.end_rr(at);
      } else if (name == "refused.example.") {
        w.header(q.id, flags | 5, 1, 0, 0, 0);
        w.name(q.qname.span());
        w.u16(q.qtype);
        w.u16(kClassIN);
      } else {
        continue;  // silence: the forwarder must time out
      }
      sendto(fd_, out, w.size(), 0, reinterpret_cast<sockaddr*>(&from), fl);
    }
  }
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> queries_{0};
  std::thread thread_;
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DnsOptions o;
    o.listen = "127.0.0.1:0";
    o.upstreams = {"127.0.0.1:" + std::to_string(upstream_.port())};
    o.forward_timeout = std::chrono::milliseconds(300);
    o.forward_tries = 1;
    o.workers = 2;
    o.tcp_idle_timeout = std::chrono::milliseconds(500);
    board_.add("other");
    sink_ = std::make_unique<DnsSink>(o, &board_, &registry_);
    auto st = sink_->start();
    ASSERT_TRUE(st) << st.error();
    port_ = sink_->port();
    ASSERT_NE(port_, 0);
  }
  void TearDown() override { sink_->stop(); }

  void sync() {
    std::vector<model::MergedEndpoint> many;
    for (int i = 1; i <= 60; ++i) many.push_back(endpoint("10.2.0." + std::to_string(i)));
    auto snap =
        snapshot({service("default", "web", {"10.96.0.10"}),
                  service("default", "db", {"None"}, {endpoint("10.1.0.1", true, false, "db-0")}),
                  service("default", "big", {"None"}, many)},
                 7);
    sink_->apply(snap, model::Delta{});
  }
  std::optional<Message> ask(const std::string& name, uint16_t t, uint16_t edns = 0) {
    auto r = udp_ask(port_, query(name, t, edns));
    return parse_message(r);
  }
  std::string dig(const std::string& args) {
    return run("dig -p " + std::to_string(port_) + " @127.0.0.1 +time=2 +tries=1 " + args +
               " 2>&1");
  }

  FakeUpstream upstream_;
  pipeline::AckBoard board_;
  prometheus::Registry registry_;
  std::unique_ptr<DnsSink> sink_;
  uint16_t port_ = 0;
};

TEST_F(ServerTest, ServFailBeforeSyncThenAnswersAndAcks) {
  auto m = ask("web.default.svc.cluster.local", type::kA);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode, 2);
  for (const auto& e : board_.entries()) EXPECT_EQ(e.generation(), 0u);
  sync();
  m = ask("web.default.svc.cluster.local", type::kA);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode, 0);
  ASSERT_EQ(m->answer.size(), 1u);
  EXPECT_EQ(m->answer[0].text, "10.96.0.10");
  for (const auto& e : board_.entries())
    if (e.consumer == "dns") {
      EXPECT_EQ(e.generation(), 7u);
    }
}

TEST_F(ServerTest, DigSeesRecordsNoDataAndNxDomain) {
  sync();
  EXPECT_EQ(dig("+short web.default.svc.cluster.local A"), "10.96.0.10\n");
  EXPECT_EQ(dig("+short db-0.db.default.svc.cluster.local A"), "10.1.0.1\n");
  EXPECT_EQ(dig("+short _http._tcp.web.default.svc.cluster.local SRV"),
            "0 100 80 web.default.svc.cluster.local.\n");
  EXPECT_EQ(dig("+short -x 10.96.0.10"), "web.default.svc.cluster.local.\n");
  EXPECT_EQ(dig("+short dns-version.cluster.local TXT"), "\"1.1.0\"\n");
  std::string nodata = dig("web.default.svc.cluster.local AAAA");
  EXPECT_NE(nodata.find("status: NOERROR"), std::string::npos) << nodata;
  EXPECT_NE(nodata.find("ANSWER: 0, AUTHORITY: 1"), std::string::npos) << nodata;
  std::string nx = dig("nope.default.svc.cluster.local A");
  EXPECT_NE(nx.find("status: NXDOMAIN"), std::string::npos) << nx;
  EXPECT_NE(nx.find("IN\tSOA"), std::string::npos) << nx;
}

// CoreDNS's loadbalance (on by default): the 60 A records of a headless service come rotated,
// a record further each reply, always the same 60; a service with one address is unchanged.
TEST_F(ServerTest, LoadbalanceRotatesARecordsPerReply) {
  sync();
  std::set<std::string> firsts;
  std::string sorted_once;
  for (int i = 0; i < 4; ++i) {
    std::string out = dig("+short +bufsize=1232 big.default.svc.cluster.local A");
    std::vector<std::string> lines;
    std::istringstream in(out);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    ASSERT_EQ(lines.size(), 60u) << out;
    firsts.insert(lines.front());
    std::sort(lines.begin(), lines.end());
    std::string sorted;
    for (const auto& l : lines) sorted += l + ",";
    if (i == 0) sorted_once = sorted;
    EXPECT_EQ(sorted, sorted_once) << "the same records each time";
  }
  // Two workers each rotate in turn: four replies start with at least two different records.
  EXPECT_GE(firsts.size(), 2u);
  EXPECT_EQ(dig("+short web.default.svc.cluster.local A"), "10.96.0.10\n");
}

// With --dns-loadbalance=false every reply lists the records in the same order.
// A DNS sink on a free loopback port with its own board and registry.
struct LoneSink {
  static DnsOptions on_loopback(DnsOptions o) {
    o.listen = "127.0.0.1:0";
    return o;
  }
  explicit LoneSink(DnsOptions o) : sink(on_loopback(std::move(o)), &board, &registry) {}
  pipeline::AckBoard board;
  prometheus::Registry registry;
  DnsSink sink;
};

TEST(ServerLoadbalance, OffKeepsTheOrder) {
  DnsOptions o;
  o.loadbalance = false;
  LoneSink lone(o);
  DnsSink& sink = lone.sink;
  ASSERT_TRUE(sink.start());
  std::vector<model::MergedEndpoint> many;
  for (int i = 1; i <= 5; ++i) many.push_back(endpoint("10.2.0." + std::to_string(i)));
  sink.apply(snapshot({service("default", "big", {"None"}, many)}, 3), model::Delta{});
  std::string cmd = "dig -p " + std::to_string(sink.port()) +
                    " @127.0.0.1 +time=2 +tries=1 +short big.default.svc.cluster.local A 2>&1";
  std::string first = run(cmd);
  EXPECT_EQ(std::count(first.begin(), first.end(), '\n'), 5) << first;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run(cmd), first);
  sink.stop();
}

// CoreDNS's endpoint_pod_names: a headless endpoint without a hostname is named by its pod; one
// with a hostname keeps it; one without a pod (or with a pod name that is no DNS label) keeps
// its dashed address.
TEST(ServerEndpointPodNames, HeadlessEndpointsNamedByTheirPods) {
  DnsOptions o;
  o.endpoint_pod_names = true;
  LoneSink lone(o);
  DnsSink& sink = lone.sink;
  ASSERT_TRUE(sink.start());
  auto by_pod = endpoint("10.3.0.1");
  by_pod.target_ref = model::ObjectRef{"Pod", "default", "api-7f9c-x2k4", "uid-1"};
  auto named = endpoint("10.3.0.2", true, false, "api-0");
  named.target_ref = model::ObjectRef{"Pod", "default", "api-other", "uid-2"};
  auto no_pod = endpoint("10.3.0.3");
  auto bad_label = endpoint("10.3.0.4");
  bad_label.target_ref = model::ObjectRef{"Pod", "default", std::string(70, 'p'), "uid-4"};
  sink.apply(snapshot({service("default", "api", {"None"}, {by_pod, named, no_pod, bad_label})}, 3),
             model::Delta{});
  auto dig = [&](const std::string& args) {
    return run("dig -p " + std::to_string(sink.port()) + " @127.0.0.1 +time=2 +tries=1 " + args +
               " 2>&1");
  };
  EXPECT_EQ(dig("+short api-7f9c-x2k4.api.default.svc.cluster.local A"), "10.3.0.1\n");
  EXPECT_NE(dig("10-3-0-1.api.default.svc.cluster.local A").find("status: NXDOMAIN"),
            std::string::npos);
  EXPECT_EQ(dig("+short api-0.api.default.svc.cluster.local A"), "10.3.0.2\n");
  EXPECT_EQ(dig("+short 10-3-0-3.api.default.svc.cluster.local A"), "10.3.0.3\n");
  EXPECT_EQ(dig("+short 10-3-0-4.api.default.svc.cluster.local A"), "10.3.0.4\n");
  sink.stop();
}

TEST_F(ServerTest, CaseEchoedOverTheWire) {
  sync();
  std::string out = dig("+noall +answer WeB.DeFault.svc.Cluster.Local A");
  EXPECT_NE(out.find("WeB.DeFault.svc.Cluster.Local."), std::string::npos) << out;
  auto m = ask("WEB.default.svc.cluster.local", type::kA);
  EXPECT_EQ(m->qname, "WEB.default.svc.cluster.local.");
}

TEST_F(ServerTest, TruncationThenTcp) {
  sync();
  auto m = ask("big.default.svc.cluster.local", type::kA);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->tc());
  EXPECT_TRUE(m->answer.empty());
  // EDNS0 with room: the whole answer over UDP.
  m = ask("big.default.svc.cluster.local", type::kA, 4096);
  EXPECT_FALSE(m->tc());
  EXPECT_EQ(m->answer.size(), 60u);
  EXPECT_TRUE(m->edns);
  // dig retries over TCP by itself on TC.
  std::string out = dig("+noedns +short big.default.svc.cluster.local A");
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 60) << out;
  std::string k = run("kdig -p " + std::to_string(port_) +
                      " @127.0.0.1 +tcp +short big.default.svc.cluster.local A 2>&1");
  EXPECT_EQ(std::count(k.begin(), k.end(), '\n'), 60) << k;
}

TEST_F(ServerTest, TcpSeveralQueriesPerConnection) {
  sync();
  auto rs = tcp_ask(port_, {query("web.default.svc.cluster.local", type::kA, 0, 1),
                            query("nope.default.svc.cluster.local", type::kA, 0, 2),
                            query("big.default.svc.cluster.local", type::kA, 0, 3)});
  ASSERT_EQ(rs.size(), 3u);
  auto a = parse_message(rs[0]), b = parse_message(rs[1]), c = parse_message(rs[2]);
  EXPECT_EQ(a->id, 1);
  EXPECT_EQ(a->answer.size(), 1u);
  EXPECT_EQ(b->rcode, 3);
  EXPECT_EQ(c->answer.size(), 60u);
  EXPECT_FALSE(c->tc());
}

TEST_F(ServerTest, TcpGarbageClosesTheConnection) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port_);
  ASSERT_EQ(connect(fd, as_sa(&a), sizeof a), 0);
  uint8_t junk[] = {0, 3, 1, 2, 3};
  send(fd, junk, sizeof junk, MSG_NOSIGNAL);
  uint8_t b;
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 3000), 1);
  EXPECT_EQ(recv(fd, &b, 1, 0), 0);  // closed, nothing sent
  close(fd);
}

// `n` copies of one TCP query, length-prefixed, as a client pipelining them sends them.
std::vector<uint8_t> pipelined_queries(int n) {
  auto q = query("web.default.svc.cluster.local", type::kA, 0, 7);
  std::vector<uint8_t> batch;
  for (int i = 0; i < n; ++i) {
    batch.push_back(static_cast<uint8_t>(q.size() >> 8));
    batch.push_back(static_cast<uint8_t>(q.size()));
    batch.insert(batch.end(), q.begin(), q.end());
  }
  return batch;
}

// A client that sends queries and never reads the answers: the server drops it once its unread
// answers pass the per-connection limit, counts it, and keeps answering others.
TEST_F(ServerTest, TcpClientThatNeverReadsIsDropped) {
  sync();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sockaddr_in a = loopback(port_);
  ASSERT_EQ(connect(fd, as_sa(&a), sizeof a), 0);
  std::vector<uint8_t> batch = pipelined_queries(1000);
  bool closed = false;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  size_t sent = 0;
  while (!closed && std::chrono::steady_clock::now() < until) {
    ssize_t n = send(fd, batch.data(), batch.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) closed = true;
    if (n > 0) sent += static_cast<size_t>(n);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // The server stopped reading (its answers are stuck) or dropped us: look for the close.
      pollfd p{fd, POLLIN | POLLRDHUP, 0};
      if (poll(&p, 1, 100) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) closed = true;
    }
  }
  close(fd);
  EXPECT_TRUE(closed) << "still open after sending " << sent << " bytes of queries";
  EXPECT_GE(sink_->server()->tcp_slow_dropped(), 1u);
  // Others are still answered.
  auto rs = tcp_ask(port_, {query("web.default.svc.cluster.local", type::kA, 0, 8)});
  ASSERT_EQ(rs.size(), 1u);
}

// Twenty clients flooding queries and reading nothing: each is dropped at its 256 KiB of
// unread answers, so the server's memory stays bounded (at most tcp_max_connections x 256 KiB
// of answers in all), and others are still answered.
TEST_F(ServerTest, TwentyClientsThatNeverReadLeaveMemoryBounded) {
  sync();
  auto rss_mib = [] {
    FILE* f = std::fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    return resident * sysconf(_SC_PAGESIZE) / (1 << 20);
  };
  long before = rss_mib();
  uint64_t dropped_before = sink_->server()->tcp_slow_dropped();
  std::vector<uint8_t> batch = pipelined_queries(1000);
  std::vector<int> fds;
  for (int c = 0; c < 20; ++c) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    sockaddr_in a = loopback(port_);
    ASSERT_EQ(connect(fd, as_sa(&a), sizeof a), 0);
    fds.push_back(fd);
  }
  long peak = before;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
#if defined(__SANITIZE_ADDRESS__)
  constexpr uint64_t kWant = 3;
#else
  constexpr uint64_t kWant = 20;
#endif
  while (sink_->server()->tcp_slow_dropped() < dropped_before + kWant &&
         std::chrono::steady_clock::now() < until) {
    for (int fd : fds)
      [[maybe_unused]] auto n = send(fd, batch.data(), batch.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    peak = std::max(peak, rss_mib());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int fd : fds) close(fd);
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer the server is many times slower and freed memory sits in ASan's
  // quarantine: neither the time to drop all 20 nor RSS says anything about the agent. That
  // slow readers are dropped and others still served is checked.
  EXPECT_GE(sink_->server()->tcp_slow_dropped(), dropped_before + kWant);
  auto answered = tcp_ask(port_, {query("web.default.svc.cluster.local", type::kA, 0, 8)});
  ASSERT_EQ(answered.size(), 1u);
  return;
#endif
  std::printf(
      "20 TCP clients that never read: RSS %ld -> peak %ld MiB, %llu dropped\n", before, peak,
      static_cast<unsigned long long>(sink_->server()->tcp_slow_dropped() - dropped_before));
  EXPECT_EQ(sink_->server()->tcp_slow_dropped(), dropped_before + 20);
  EXPECT_LE(peak - before, 64) << "RSS grew from " << before << " to " << peak << " MiB";
  auto rs = tcp_ask(port_, {query("web.default.svc.cluster.local", type::kA, 0, 8)});
  ASSERT_EQ(rs.size(), 1u);
}

TEST_F(ServerTest, GarbageNeverAmplified) {
  sync();
  uint64_t before = sink_->server()->dropped();
  EXPECT_TRUE(udp_ask(port_, {1, 2, 3}, 200).empty());  // short: dropped
  EXPECT_EQ(sink_->server()->dropped(), before + 1);
  std::vector<uint8_t> bad(12, 0);
  bad[5] = 3;  // qdcount 3, nothing after
  auto r = udp_ask(port_, bad);
  ASSERT_EQ(r.size(), 12u);
  EXPECT_EQ(r[3] & 0xF, 1);  // FORMERR, header only
  auto loop = query("web.default.svc.cluster.local", type::kA);
  loop[12] = 0xC0;
  loop[13] = 12;
  r = udp_ask(port_, loop);
  EXPECT_LE(r.size(), loop.size());
  EXPECT_EQ(r[3] & 0xF, 1);
  // Still serving.
  EXPECT_EQ(ask("web.default.svc.cluster.local", type::kA)->rcode, 0);
}

TEST_F(ServerTest, EdnsBadVersion) {
  sync();
  std::string out = dig("+edns=1 +noednsneg web.default.svc.cluster.local A");
  EXPECT_NE(out.find("BADVERS"), std::string::npos) << out;
}

TEST_F(ServerTest, ForwardsToUpstream) {
  std::string out = dig("+short example.org A");
  EXPECT_EQ(out, "192.0.2.1\n");
  std::string nx = dig("missing.example A");
  EXPECT_NE(nx.find("status: NXDOMAIN"), std::string::npos) << nx;
  std::string refused = dig("refused.example A");
  EXPECT_NE(refused.find("status: REFUSED"), std::string::npos) << refused;
  // Timeout upstream: SERVFAIL.
  auto m = ask("silent.example", type::kA);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode, 2);
  EXPECT_GE(sink_->forwarder()->errors(), 1u);
  // Second ask is a cache hit: the upstream sees nothing new, the ID is the asker's.
  int seen = upstream_.queries();
  auto again = udp_ask(port_, query("EXAMPLE.org", type::kA, 1232, 0x4242));
  auto am = parse_message(again);
  ASSERT_TRUE(am);
  EXPECT_EQ(am->id, 0x4242);
  EXPECT_EQ(am->qname, "EXAMPLE.org.");
  EXPECT_EQ(am->answer.at(0).text, "192.0.2.1");
  EXPECT_EQ(upstream_.queries(), seen);
  EXPECT_GE(sink_->forwarder()->cache_hits(), 1u);
  // Over TCP too.
  auto rs = tcp_ask(port_, {query("example.org", type::kA, 0, 9)});
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(parse_message(rs[0])->answer.at(0).text, "192.0.2.1");

  // Counted under CoreDNS's forward plugin's names (`to`: the upstream), for its dashboards:
  // example.org (with EDNS and, over TCP, without: two cache keys), missing.example,
  // refused.example and silent.example went upstream.
  std::string text = prometheus::TextSerializer().Serialize(registry_.Collect());
  std::string to = "to=\"127.0.0.1:" + std::to_string(upstream_.port()) + "\"";
  auto value = [&](const std::string& series) {
    auto at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
  };
  EXPECT_EQ(value("coredns_forward_requests_total{" + to + "}"), 5) << text;
  EXPECT_EQ(value("coredns_forward_responses_total{rcode=\"NOERROR\"," + to + "}"), 2) << text;
  EXPECT_EQ(value("coredns_forward_responses_total{rcode=\"NXDOMAIN\"," + to + "}"), 1);
  EXPECT_EQ(value("coredns_forward_responses_total{rcode=\"REFUSED\"," + to + "}"), 1);
  EXPECT_EQ(value("coredns_proxy_request_duration_seconds_count{proxy_name=\"forward\","
                  "rcode=\"NOERROR\"," +
                  to + "}"),
            2);
  EXPECT_EQ(value("coredns_forward_request_duration_seconds_count{rcode=\"NXDOMAIN\"," + to + "}"),
            1);
  EXPECT_EQ(value("coredns_forward_healthcheck_broken_total"), 1);  // silent.example
  EXPECT_EQ(value("coredns_forward_max_concurrent_rejects_total"), 0);
}

// CoreDNS's answer for an ExternalName to a name outside the zone: the CNAME, then the
// target's records of the type asked, from upstream (and the forwarding cache after).
TEST_F(ServerTest, ExternalNameOutsideTheZoneCarriesTheTargetsRecordsFromUpstream) {
  sink_->apply(snapshot({external_name("default", "ext", "example.org"),
                         external_name("default", "stray", "nope.default.svc.cluster.local")},
                        7),
               model::Delta{});
  EXPECT_EQ(dig("+short ext.default.svc.cluster.local A"), "example.org.\n192.0.2.1\n");
  int seen = upstream_.queries();
  // The target's records now come from the forwarding cache: upstream is not asked again.
  auto m =
      parse_message(udp_ask(port_, query("Ext.default.svc.cluster.local", type::kA, 1232, 77)));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 77);
  EXPECT_EQ(m->rcode, 0);
  EXPECT_EQ(m->qname, "Ext.default.svc.cluster.local.");
  ASSERT_EQ(m->answer.size(), 2u);
  EXPECT_EQ(m->answer[0].type, type::kCNAME);
  EXPECT_EQ(m->answer[0].text, "example.org.");
  EXPECT_EQ(m->answer[0].ttl, 5u);
  EXPECT_EQ(m->answer[1].name, "example.org.");
  EXPECT_EQ(m->answer[1].text, "192.0.2.1");
  EXPECT_LE(m->answer[1].ttl, 2u);  // the upstream's TTL, aged in the cache
  EXPECT_TRUE(m->edns);
  EXPECT_EQ(upstream_.queries(), seen);
  // Over TCP, the same.
  EXPECT_EQ(dig("+tcp +short ext.default.svc.cluster.local A"), "example.org.\n192.0.2.1\n");
  // The upstream has nothing for AAAA (it stays silent, the forwarder gives up): the CNAME
  // alone, NOERROR, as CoreDNS answers when its upstream lookup fails.
  std::string aaaa = dig("ext.default.svc.cluster.local AAAA");
  EXPECT_NE(aaaa.find("status: NOERROR"), std::string::npos) << aaaa;
  EXPECT_NE(aaaa.find("ANSWER: 1,"), std::string::npos) << aaaa;
  // Other types get the CNAME alone without asking upstream; so does a CNAME into the zone
  // that names no service (the zone is ours: nothing to ask anyone).
  seen = upstream_.queries();
  EXPECT_EQ(dig("+short ext.default.svc.cluster.local TXT"), "example.org.\n");
  EXPECT_EQ(dig("+short stray.default.svc.cluster.local A"), "nope.default.svc.cluster.local.\n");
  EXPECT_EQ(upstream_.queries(), seen);
}

TEST_F(ServerTest, MetricsCount) {
  sync();
  ask("web.default.svc.cluster.local", type::kA);
  ask("nope.default.svc.cluster.local", type::kA);
  // The workers count into blocks of their own; stop() joins them and folds the blocks into
  // the registry (a scrape folds them while they serve: MetricsFoldedAtEachScrape).
  sink_->stop();
  std::string text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_NE(text.find("endpointd_dns_queries_total{rcode=\"NXDOMAIN\",type=\"A\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("endpointd_dns_programming_duration_seconds_count 1"), std::string::npos);
  // The same under CoreDNS's names, for the dashboards made for it.
  std::string server = "server=\"dns://127.0.0.1:0\"";
  EXPECT_NE(text.find("coredns_dns_requests_total{" + server + ",type=\"A\",zone=\".\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("coredns_dns_responses_total{rcode=\"NXDOMAIN\"," + server + ",zone=\".\"} 1"),
      std::string::npos);
  EXPECT_NE(text.find("coredns_dns_request_duration_seconds_count{" + server + ",zone=\".\"} 2"),
            std::string::npos);
}

// What a scrape sees while the servers serve: every answer already sent (a worker counts a
// query before it sends the answer), folded once (a second fold adds nothing), UDP and TCP.
TEST_F(ServerTest, MetricsFoldedAtEachScrape) {
  sync();
  auto scrape = [&] {
    sink_->fold_metrics();
    return prometheus::TextSerializer().Serialize(registry_.Collect());
  };
  auto has = [](const std::string& text, const std::string& line) {
    return text.find(line + "\n") != std::string::npos;
  };
  const std::string server = "server=\"dns://127.0.0.1:0\"";
  EXPECT_FALSE(has(scrape(), "endpointd_dns_queries_total{rcode=\"NOERROR\",type=\"A\"} 1"));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ask("web.default.svc.cluster.local", type::kA));
  ASSERT_TRUE(ask("nope.default.svc.cluster.local", type::kA));
  std::string text = scrape();
  EXPECT_TRUE(has(text, "endpointd_dns_queries_total{rcode=\"NOERROR\",type=\"A\"} 3")) << text;
  EXPECT_TRUE(has(text, "endpointd_dns_queries_total{rcode=\"NXDOMAIN\",type=\"A\"} 1"));
  EXPECT_TRUE(has(text, "coredns_dns_requests_total{" + server + ",type=\"A\",zone=\".\"} 4"));
  EXPECT_TRUE(
      has(text, "coredns_dns_responses_total{rcode=\"NOERROR\"," + server + ",zone=\".\"} 3"));
  // Folding again adds nothing.
  EXPECT_EQ(scrape(), text);
  // Over TCP, the TCP thread's block.
  auto r = tcp_ask(port_, {query("web.default.svc.cluster.local", type::kSRV, 0, 1)});
  ASSERT_EQ(r.size(), 1u);
  text = scrape();
  EXPECT_TRUE(has(text, "endpointd_dns_queries_total{rcode=\"NOERROR\",type=\"SRV\"} 1")) << text;
  EXPECT_TRUE(has(text, "endpointd_dns_queries_total{rcode=\"NOERROR\",type=\"A\"} 3"));
  // A worker records a batch's latency after it sent the batch: by stop(), every one is in.
  sink_->stop();
  text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_TRUE(has(text, "endpointd_dns_request_duration_seconds_count 4")) << text;
  EXPECT_TRUE(has(text, "coredns_dns_request_duration_seconds_count{" + server + ",zone=\".\"} 4"));
}

TEST_F(ServerTest, TerminatingEndpointLeavesButItsLastAnswerIsRemembered) {
  sync();
  auto before = std::chrono::steady_clock::now();
  auto m = ask("db.default.svc.cluster.local", type::kA);
  ASSERT_EQ(m->answer.size(), 1u);
  auto snap =
      snapshot({service("default", "db", {"None"}, {endpoint("10.1.0.1", true, true, "db-0")})}, 8);
  // What drain/ reads is the DNS entry on the board, and it is there by the time the entry
  // says generation 8 applied: every observer that sees the new state sees the answers too.
  std::shared_ptr<const pipeline::AnswerExpiry> seen_with_8;
  board_.on_change([&] {
    for (const auto& e : board_.entries())
      if (e.consumer == "dns" && e.generation() == 8 && !seen_with_8) seen_with_8 = e.answers;
  });
  sink_->apply(snap, model::Delta{});
  EXPECT_EQ(ask("db.default.svc.cluster.local", type::kA)->rcode, 3);
  ASSERT_TRUE(seen_with_8);
  auto exp = seen_with_8->expiry(ip("10.1.0.1"));
  ASSERT_TRUE(exp);
  EXPECT_GE(*exp, before + std::chrono::seconds(5));
  EXPECT_LE(*exp, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  EXPECT_FALSE(seen_with_8->expiry(ip("10.9.9.9")));
  EXPECT_EQ(sink_->answers()->expiry(ip("10.1.0.1")), exp);
}

// Answers keep being given between applies (insecure pod records: any pod name answers its
// address whatever the endpoints say): the sink publishes them again within a few ticks, for
// the addresses a drain may ask about (a terminating endpoint's here).
TEST(DnsSinkAnswers, AnswersGivenBetweenAppliesArePublishedWithinATick) {
  pipeline::AckBoard board;
  prometheus::Registry registry;
  DnsOptions o;
  o.listen = "127.0.0.1:0";
  o.forwarding = false;
  o.pod_mode = PodMode::kInsecure;
  DnsSink sink(o, &board, &registry);
  ASSERT_TRUE(sink.start());
  auto snap = snapshot(
      {service("default", "db", {"None"}, {endpoint("10.1.0.7", false, true, "db-0")})}, 9);
  model::Delta d;
  d.to_generation = 9;
  d.added.push_back({"default", "db"});
  sink.apply(snap, d);
  ASSERT_FALSE(sink.answers()->expiry(ip("10.1.0.7")));  // never handed out
  auto before = std::chrono::steady_clock::now();
  auto r = udp_ask(sink.port(), query("10-1-0-7.default.pod.cluster.local", type::kA));
  auto m = parse_message(r);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->rcode, 0);
  ASSERT_EQ(m->answer.size(), 1u);
  std::optional<std::chrono::steady_clock::time_point> exp;
  auto until = before + 5 * DnsSink::kAnswersTick + std::chrono::seconds(1);
  while (!exp && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(DnsSink::kAnswersTick / 5);
    for (const auto& e : board.entries())
      if (e.consumer == "dns" && e.answers) exp = e.answers->expiry(ip("10.1.0.7"));
  }
  ASSERT_TRUE(exp) << "the pod answer was never published";
  EXPECT_GE(*exp, before + std::chrono::seconds(5));
  sink.stop();
}

// CoreDNS's cache `success` and `denial` TTLs: a forwarded answer stays cached no longer than
// its cap, and its TTLs say so from the first reply on; a denial cap of 0 caches no NXDOMAIN.
TEST(ServerCacheCaps, SuccessAndDenialCapsSeenByDig) {
  FakeUpstream up;
  DnsOptions o;
  o.listen = "127.0.0.1:0";
  o.upstreams = {"127.0.0.1:" + std::to_string(up.port())};
  o.forward_timeout = std::chrono::milliseconds(300);
  o.forward_tries = 1;
  o.cache_max_ttl = 1;         // example.org's A comes with TTL 2
  o.cache_denial_max_ttl = 0;  // missing.example's NXDOMAIN with SOA minimum 1
  DnsSink sink(o, nullptr, nullptr);
  ASSERT_TRUE(sink.start().ok());
  auto dig = [&](const std::string& args) {
    return run("dig -p " + std::to_string(sink.port()) +
               " @127.0.0.1 +time=2 +tries=1 +noall +answer +authority " + args + " 2>&1");
  };
  // The first reply already carries the capped TTL (the upstream said 2).
  std::string first = dig("example.org A");
  EXPECT_NE(first.find("example.org.\t\t1\tIN\tA\t192.0.2.1"), std::string::npos) << first;
  int seen = up.queries();
  std::string again = dig("example.org A");  // from the cache, within the second
  EXPECT_NE(again.find("192.0.2.1"), std::string::npos) << again;
  EXPECT_EQ(up.queries(), seen);
  // Past the cap the upstream is asked again, although its TTL (2 s) has not run out.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_NE(dig("example.org A").find("192.0.2.1"), std::string::npos);
  EXPECT_EQ(up.queries(), seen + 1);
  // Denial cap 0: every NXDOMAIN goes upstream.
  seen = up.queries();
  for (int i = 0; i < 3; ++i) EXPECT_NE(dig("missing.example A").find("SOA"), std::string::npos);
  EXPECT_EQ(up.queries(), seen + 3);
  EXPECT_EQ(sink.forwarder()->cache_size(), 1u);  // example.org alone
  sink.stop();
}

// CoreDNS's additional zones (`kubernetes cluster.local example.com`): every name under each
// zone, SRV targets and negative answers in the zone asked, reverse names in the first; none of
// it goes upstream.
TEST(ServerExtraZones, EveryNameUnderEachZoneReverseUnderTheFirst) {
  FakeUpstream up;
  DnsOptions o;
  o.listen = "127.0.0.1:0";
  o.extra_zones = {"example.com"};
  o.upstreams = {"127.0.0.1:" + std::to_string(up.port())};
  o.forward_timeout = std::chrono::milliseconds(300);
  o.forward_tries = 1;
  DnsSink sink(o, nullptr, nullptr);
  ASSERT_TRUE(sink.start().ok());
  auto dig = [&](const std::string& args) {
    return run("dig -p " + std::to_string(sink.port()) + " @127.0.0.1 +time=2 +tries=1 " + args +
               " 2>&1");
  };
  // Before the first sync both zones say SERVFAIL (nothing is forwarded).
  EXPECT_NE(dig("web.default.svc.example.com A").find("status: SERVFAIL"), std::string::npos);
  auto alias = external_name("default", "alias", "web.default.svc.example.com");
  sink.apply(
      snapshot(
          {service("default", "web", {"10.96.0.10"}),
           service("default", "db", {"None"}, {endpoint("10.1.0.1", true, false, "db-0")}), alias},
          3),
      model::Delta{});
  EXPECT_EQ(dig("+short web.default.svc.example.com A"), "10.96.0.10\n");
  EXPECT_EQ(dig("+short WEB.default.svc.Example.COM A"), "10.96.0.10\n");
  EXPECT_EQ(dig("+short web.default.svc.cluster.local A"), "10.96.0.10\n");
  EXPECT_EQ(dig("+short db-0.db.default.svc.example.com A"), "10.1.0.1\n");
  EXPECT_EQ(dig("+short _http._tcp.db.default.svc.example.com SRV"),
            "0 100 8080 db-0.db.default.svc.example.com.\n");
  std::string nx = dig("nope.default.svc.example.com A");
  EXPECT_NE(nx.find("status: NXDOMAIN"), std::string::npos) << nx;
  EXPECT_NE(nx.find("example.com.\t\t5\tIN\tSOA\tns.dns.example.com."), std::string::npos) << nx;
  EXPECT_EQ(dig("+short -x 10.96.0.10"), "web.default.svc.cluster.local.\n");
  // An ExternalName into the other zone: the CNAME alone, not asked upstream.
  EXPECT_EQ(dig("+short alias.default.svc.cluster.local A"), "web.default.svc.example.com.\n");
  EXPECT_EQ(up.queries(), 0);
  // Changes reach both zones.
  sink.apply(snapshot({service("default", "web", {"10.96.0.20"})}, 4), model::Delta{});
  EXPECT_EQ(dig("+short web.default.svc.example.com A"), "10.96.0.20\n");
  EXPECT_EQ(dig("+short web.default.svc.cluster.local A"), "10.96.0.20\n");
  // A reload may not change the zones.
  DnsOptions next = o;
  next.extra_zones = {"example.org"};
  auto st = sink.reconfigure(next);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().find("cluster.local example.com to cluster.local example.org"),
            std::string::npos)
      << st.error();
  EXPECT_EQ(dig("+short web.default.svc.example.com A"), "10.96.0.20\n");
  sink.stop();
}

TEST(ServerTcpLimit, ConnectionsPastTheLimitAreClosedAndCounted) {
  DnsOptions o;
  o.listen = "127.0.0.1:0";
  o.forwarding = false;
  o.tcp_max_connections = 1;
  prometheus::Registry registry;
  DnsSink sink(o, nullptr, &registry);
  ASSERT_TRUE(sink.start().ok());
  sink.apply(snapshot({service("default", "web", {"10.96.0.10"})}), model::Delta{});
  // The first connection is served (its answer proves it was accepted) and stays open.
  int first = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(sink.port());
  ASSERT_EQ(connect(first, as_sa(&a), sizeof a), 0);
  auto q = query("web.default.svc.cluster.local", type::kA);
  uint8_t len[2];
  store_u16(len, static_cast<uint16_t>(q.size()));
  send(first, len, 2, MSG_NOSIGNAL);
  send(first, q.data(), q.size(), MSG_NOSIGNAL);
  uint8_t got[2];
  ASSERT_TRUE(read_full(first, got, 2));
  // The second is closed at once, without an answer.
  int second = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(second, as_sa(&a), sizeof a), 0);
  pollfd p{second, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 3000), 1);
  uint8_t b;
  EXPECT_EQ(recv(second, &b, 1, 0), 0);
  EXPECT_EQ(sink.server()->tcp_rejected(), 1u);
  std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(text.find("endpointd_dns_tcp_connections_rejected_total 1"), std::string::npos);
  close(second);
  close(first);
}

TEST(ServerAllowList, RefusedOutsideTheAllowList) {
  FakeUpstream up;
  DnsOptions o;
  o.listen = "127.0.0.1:0";
  o.upstreams = {"127.0.0.1:" + std::to_string(up.port())};
  o.forward_allow = {*model::IpPrefix::parse("10.0.0.0/8")};
  DnsSink sink(o, nullptr, nullptr);
  ASSERT_TRUE(sink.start().ok());
  sink.apply(snapshot({service("default", "web", {"10.96.0.10"})}), model::Delta{});
  auto m = parse_message(udp_ask(sink.port(), query("example.org", type::kA)));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode, 5);
  EXPECT_EQ(up.queries(), 0);
  m = parse_message(udp_ask(sink.port(), query("web.default.svc.cluster.local", type::kA)));
  EXPECT_EQ(m->rcode, 0);  // the cluster zone is served to everyone
}

TEST(ForwarderCache, ExpiresWithTheTtlAndShedsOverTheLimit) {
  FakeUpstream up;
  auto now = std::chrono::steady_clock::now();
  ForwarderOptions o;
  o.upstreams = {"127.0.0.1:" + std::to_string(up.port())};
  o.now = [&now] { return now; };
  o.timeout = std::chrono::milliseconds(300);
  o.tries = 1;
  Forwarder f(o);
  ASSERT_TRUE(f.start().ok());
  auto ask_through = [&](const std::string& name) {
    auto pkt = query(name, type::kA, 0, 77);
    Query q = parse_query(pkt);
    std::promise<std::vector<uint8_t>> p;
    auto fut = p.get_future();
    EXPECT_TRUE(f.forward(q, [&p](std::span<const uint8_t> r) {
      p.set_value({r.begin(), r.end()});
    }));
    return fut.get();
  };
  auto r = parse_message(ask_through("example.org"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, 77);
  Query q = parse_query(query("example.org", type::kA, 0, 5));
  uint8_t out[512];
  ASSERT_GT(f.cached(q, out, sizeof out), 0u);
  now += std::chrono::seconds(1);
  size_t n = f.cached(q, out, sizeof out);
  ASSERT_GT(n, 0u);
  EXPECT_EQ(parse_message({out, n})->answer.at(0).ttl, 1u);  // TTL counts down
  now += std::chrono::seconds(1);
  EXPECT_EQ(f.cached(q, out, sizeof out), 0u);  // expired after its TTL of 2 s
  // Negative answers are cached for the SOA minimum (1 s).
  EXPECT_EQ(parse_message(ask_through("missing.example"))->rcode, 3);
  Query nq = parse_query(query("missing.example", type::kA));
  EXPECT_GT(f.cached(nq, out, sizeof out), 0u);
  now += std::chrono::seconds(1);
  EXPECT_EQ(f.cached(nq, out, sizeof out), 0u);
  // REFUSED from upstream is passed through, never cached.
  EXPECT_EQ(parse_message(ask_through("refused.example"))->rcode, 5);
  Query rq = parse_query(query("refused.example", type::kA));
  EXPECT_EQ(f.cached(rq, out, sizeof out), 0u);
  f.stop();

  ForwarderOptions tiny = o;
  tiny.max_inflight = 1;
  Forwarder g(tiny);
  prometheus::Registry registry;
  Metrics metrics(&registry);
  g.set_metrics(&metrics);
  ASSERT_TRUE(g.start().ok());
  Query sq = parse_query(query("silent.example", type::kA));
  std::promise<void> done;
  EXPECT_TRUE(g.forward(sq, [&](std::span<const uint8_t>) { done.set_value(); }));
  EXPECT_FALSE(g.forward(sq, [](std::span<const uint8_t>) {}));  // shed
  EXPECT_EQ(g.shed(), 1u);
  done.get_future().wait();
  g.stop();
  std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(text.find("\ncoredns_forward_max_concurrent_rejects_total 1\n"), std::string::npos)
      << text;
}

TEST(ForwarderCache, FullCacheEvictsTheOldestAndCountsIt) {
  FakeUpstream up;
  ForwarderOptions o;
  o.upstreams = {"127.0.0.1:" + std::to_string(up.port())};
  o.timeout = std::chrono::milliseconds(300);
  o.tries = 1;
  o.cache_entries = 2;
  Forwarder f(o);
  ASSERT_TRUE(f.start().ok());
  auto ask_through = [&](const std::string& name, uint16_t t) {
    Query q = parse_query(query(name, t));
    std::promise<void> p;
    EXPECT_TRUE(f.forward(q, [&p](std::span<const uint8_t>) { p.set_value(); }));
    p.get_future().wait();
    return q;
  };
  uint8_t out[512];
  Query a = ask_through("example.org", type::kA);
  Query b = ask_through("missing.example", type::kA);
  EXPECT_EQ(f.evictions(), 0u);
  Query c = ask_through("missing.example", type::kAAAA);  // a third: the oldest goes
  EXPECT_EQ(f.cache_size(), 2u);
  EXPECT_EQ(f.evictions(), 1u);
  EXPECT_EQ(f.cached(a, out, sizeof out), 0u);
  EXPECT_GT(f.cached(b, out, sizeof out), 0u);
  EXPECT_GT(f.cached(c, out, sizeof out), 0u);
  // Storing a name again makes it the youngest: b is stored again, so c goes next.
  ask_through("missing.example", type::kA);
  ask_through("example.org", type::kA);
  EXPECT_EQ(f.evictions(), 2u);
  EXPECT_EQ(f.cached(c, out, sizeof out), 0u);
  EXPECT_GT(f.cached(b, out, sizeof out), 0u);
  EXPECT_GT(f.cached(a, out, sizeof out), 0u);
  f.stop();
}

}  // namespace
}  // namespace endpointd::dns
