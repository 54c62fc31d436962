// A load generator that keeps a DNS server saturated from one core: the queries of a dnsperf
// input file, encoded once, sent and received in sendmmsg/recvmmsg batches over several
// connected UDP sockets, each keeping its share of a fixed window of queries outstanding.
// It never sleeps: its core is the client's, and a wake-up across cores costs more time than
// the server needs for a batch.
//
// On loopback the sender's core also pays for delivering its packets into the receiver's
// socket, so a client that spends per query what a server spends cannot keep that server's
// core busy. blast spends less: its sockets are connected (no route lookup per packet), it
// reads no answer (it counts them), and it sends runs of queries of one size as one UDP GSO
// message (UDP_SEGMENT: one send, one route, one trip through the stack, cut into datagrams
// on arrival; the server receives ordinary datagrams, one query each). So that runs are
// long, the queries are sorted by size within each block of 256: every block holds the same
// queries as in the file, in another order.
//
// Prints "<answers per second> <answers> <seconds> <sent> <stalls> <server CPU seconds>
// <server waits>" (a stall: a socket with queries outstanding and no answer for 20 ms, after
// which its outstanding queries are taken as lost; the CPU time of every thread of the PIDs
// given, over the same interval as the answers, from /proc/PID/task/*/schedstat; the waits:
// how often those threads blocked, their voluntary context switches: a server that never
// runs out of queries has none. Both 0 without PIDs).
// Usage: blast PORT QUERYFILE [seconds] [window] [sockets] [PID...]; BLAST_GSO=0: one
// datagram per send message.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dns/message.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

using namespace endpointd;
using Clock = std::chrono::steady_clock;

namespace {

uint16_t qtype_of(const std::string& t) {
  if (t == "A") return dns::type::kA;
  if (t == "AAAA") return dns::type::kAAAA;
  if (t == "SRV") return dns::type::kSRV;
  if (t == "PTR") return dns::type::kPTR;
  if (t == "TXT") return dns::type::kTXT;
  return dns::type::kA;
}

struct ServerUse {
  uint64_t cpu_ns = 0;  // on a CPU so far (schedstat's first field: user and system time)
  uint64_t waits = 0;   // voluntary context switches
};

// Every thread of every process in `pids`.
ServerUse server_use(const std::vector<std::string>& pids) {
  ServerUse u;
  for (const auto& pid : pids) {
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator("/proc/" + pid + "/task", ec)) {
      std::ifstream f(t.path() / "schedstat");
      uint64_t ns = 0;
      if (f >> ns) u.cpu_ns += ns;
      std::ifstream st(t.path() / "status");
      std::string key;
      uint64_t v = 0;
      while (st >> key) {
        if (key == "voluntary_ctxt_switches:" && st >> v) u.waits += v;
      }
    }
  }
  return u;
}

constexpr size_t kSendBatch = 32;  // queries per sendmmsg at most
constexpr size_t kRecvBatch = 64;
constexpr size_t kRecvSize = 2048;
constexpr size_t kSortBlock = 256;

// One send message: a run of queries of one size (GSO when more than one).
struct Message {
  mmsghdr hdr{};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(uint16_t))] = {};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: blast PORT QUERYFILE [seconds] [window] [sockets] [PID...]\n");
    return 2;
  }
  int port = std::atoi(argv[1]);
  double seconds = argc > 3 ? std::atof(argv[3]) : 5;
  size_t window = argc > 4 ? std::strtoul(argv[4], nullptr, 10) : 256;
  size_t nsockets = argc > 5 ? std::strtoul(argv[5], nullptr, 10) : 8;
  nsockets = std::clamp<size_t>(nsockets, 1, 256);
  std::vector<std::string> pids(argv + std::min(argc, 6), argv + argc);
  const char* gso_env = std::getenv("BLAST_GSO");
  bool gso = !(gso_env && std::string(gso_env) == "0");
  std::vector<std::vector<uint8_t>> queries;
  std::ifstream in(argv[2]);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name, t;
    ls >> name >> t;
    auto n = dns::name_from_text(name);
    if (!n) continue;
    std::vector<uint8_t> q(512);
    q.resize(dns::write_query(static_cast<uint16_t>(queries.size()), n->span(), qtype_of(t), false,
                              0, q.data(), q.size()));
    queries.push_back(std::move(q));
  }
  if (queries.empty()) return 2;
  if (gso) {
    for (size_t b = 0; b < queries.size(); b += kSortBlock) {
      auto end = queries.begin() + static_cast<ptrdiff_t>(std::min(queries.size(), b + kSortBlock));
      std::stable_sort(queries.begin() + static_cast<ptrdiff_t>(b), end,
                       [](const auto& x, const auto& y) { return x.size() < y.size(); });
    }
  }

  std::vector<int> fds(nsockets);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int& fd : fds) {
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    int buf = 1 << 20;  // answers wait here while the loop serves the other sockets
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {  // sockaddr API
      std::perror("connect");
      return 1;
    }
  }
  std::vector<Message> smsg(kSendBatch);
  std::vector<mmsghdr> shdr(kSendBatch), rmsg(kRecvBatch);
  std::vector<size_t> run_of(kSendBatch);  // queries in each send message
  std::vector<iovec> siov(kSendBatch), riov(kRecvBatch);
  std::vector<uint8_t> rbuf(kRecvBatch * kRecvSize);
  for (size_t i = 0; i < kRecvBatch; ++i) {
    riov[i] = {rbuf.data() + i * kRecvSize, kRecvSize};
    rmsg[i].msg_hdr.msg_iov = &riov[i];
    rmsg[i].msg_hdr.msg_iovlen = 1;
  }
  size_t next = 0, sent = 0, received = 0, counted = 0, stalls = 0;
  size_t per_socket = std::max<size_t>(1, window / nsockets);
  // Send when a socket's window has room for a batch worth the syscall (or it is empty).
  size_t min_send = std::clamp<size_t>(per_socket / 4, 1, kSendBatch);
  std::vector<size_t> outstanding(nsockets);
  std::vector<Clock::time_point> last_answer(nsockets, Clock::now());
  auto start = Clock::now();
  auto warm = start + std::chrono::milliseconds(500);  // not counted: caches, first batches
  bool counting = false;
  ServerUse use0;
  Clock::time_point t0 = warm;
  auto end =
      warm + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (true) {
    auto now = Clock::now();
    if (!counting && now >= warm) {
      counting = true;
      counted = received;
      use0 = server_use(pids);
      t0 = Clock::now();
    }
    if (now >= end) break;
    for (size_t s = 0; s < nsockets; ++s) {
      int r = recvmmsg(fds[s], rmsg.data(), kRecvBatch, MSG_DONTWAIT, nullptr);
      if (r > 0) {
        received += static_cast<size_t>(r);
        outstanding[s] -= std::min(outstanding[s], static_cast<size_t>(r));
        last_answer[s] = now;
      } else if (outstanding[s] != 0 && now - last_answer[s] > std::chrono::milliseconds(20)) {
        outstanding[s] = 0;  // lost (a full queue at the server): forget them rather than stall
        last_answer[s] = now;
        ++stalls;
      }
      size_t room = per_socket - std::min(per_socket, outstanding[s]);
      if (room < min_send && outstanding[s] != 0) continue;
      size_t n = std::min(kSendBatch, room);
      if (n == 0) continue;
      // The next n queries as runs of one size, a message each.
      size_t msgs = 0;
      for (size_t i = 0; i < n; ++i) {
        const auto& q = queries[next++ % queries.size()];
        siov[i] = {const_cast<uint8_t*>(q.data()), q.size()};  // sendmsg's iovec is not const
        if (msgs > 0 && gso && siov[i - 1].iov_len == q.size() &&
            smsg[msgs - 1].hdr.msg_hdr.msg_iov + smsg[msgs - 1].hdr.msg_hdr.msg_iovlen ==
                &siov[i]) {
          smsg[msgs - 1].hdr.msg_hdr.msg_iovlen++;
          run_of[msgs - 1]++;
          continue;
        }
        Message& m = smsg[msgs];
        m.hdr.msg_hdr = {};
        m.hdr.msg_hdr.msg_iov = &siov[i];
        m.hdr.msg_hdr.msg_iovlen = 1;
        run_of[msgs] = 1;
        ++msgs;
      }
      for (size_t m = 0; m < msgs; ++m) {
        msghdr& h = smsg[m].hdr.msg_hdr;
        if (h.msg_iovlen > 1) {
          h.msg_control = smsg[m].control;
          h.msg_controllen = sizeof smsg[m].control;
          cmsghdr* c = CMSG_FIRSTHDR(&h);
          c->cmsg_level = SOL_UDP;
          c->cmsg_type = UDP_SEGMENT;
          c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
          uint16_t seg = static_cast<uint16_t>(h.msg_iov[0].iov_len);
          std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
        }
        shdr[m] = smsg[m].hdr;
      }
      if (outstanding[s] == 0) last_answer[s] = now;  // the wait for an answer starts here
      int k = sendmmsg(fds[s], shdr.data(), static_cast<unsigned>(msgs), 0);
      if (k < 0 && gso && (errno == EINVAL || errno == EIO || errno == ENOPROTOOPT)) {
        std::fprintf(stderr, "blast: UDP GSO refused (%s): one datagram per message\n",
                     std::strerror(errno));
        gso = false;
      }
      for (int m = 0; m < k; ++m) {
        outstanding[s] += run_of[static_cast<size_t>(m)];
        sent += run_of[static_cast<size_t>(m)];
      }
      if (k < static_cast<int>(msgs)) {
        // Not sent: take them again next time (the window is what is outstanding).
        size_t unsent = 0;
        for (size_t m = static_cast<size_t>(std::max(k, 0)); m < msgs; ++m) unsent += run_of[m];
        next -= unsent;
      }
    }
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ServerUse use1 = server_use(pids);
  double cpu = static_cast<double>(use1.cpu_ns - use0.cpu_ns) / 1e9;
  size_t answers = received - counted;
  std::printf("%.0f %zu %.3f %zu %zu %.3f %llu\n", static_cast<double>(answers) / secs, answers,
              secs, sent, stalls, cpu,
              static_cast<unsigned long long>(use1.waits - std::min(use1.waits, use0.waits)));
  for (int fd : fds) close(fd);
  return 0;
}
