// A load generator that keeps a DNS server saturated from one core: the queries of a dnsperf
// input file, encoded once, sent and received in sendmmsg/recvmmsg batches over several
// connected UDP sockets with a fixed window of outstanding queries. dnsperf spends more CPU
// per query than the servers measured here, so on a two-core machine it cannot saturate a
// server's core; this can. Prints "<answers per second> <answers> <seconds>".
// Usage: blast PORT QUERYFILE [seconds] [window]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dns/message.h"

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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: blast PORT QUERYFILE [seconds] [window]\n");
    return 2;
  }
  int port = std::atoi(argv[1]);
  double seconds = argc > 3 ? std::atof(argv[3]) : 5;
  size_t window = argc > 4 ? std::strtoul(argv[4], nullptr, 10) : 256;
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

  constexpr int kSockets = 8;
  constexpr int kBatch = 32;
  std::array<int, kSockets> fds{};
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int& fd : fds) {
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {  // sockaddr API
      std::perror("connect");
      return 1;
    }
  }
  std::array<mmsghdr, kBatch> msgs{};
  std::array<iovec, kBatch> iovs{};
  std::vector<uint8_t> rbuf(kBatch * 1500);
  size_t next = 0, sent = 0, received = 0, counted = 0;
  size_t per_socket = std::max<size_t>(1, window / kSockets);
  std::array<size_t, kSockets> outstanding{};
  auto start = Clock::now();
  auto warm = start + std::chrono::milliseconds(500);  // not counted: caches, first batches
  bool counting = false;
  Clock::time_point t0 = warm;
  auto end =
      warm + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  auto last_progress = start;
  while (true) {
    auto now = Clock::now();
    if (!counting && now >= warm) {
      counting = true;
      counted = received;
      t0 = now;
    }
    if (now >= end) break;
    bool progress = false;
    for (int s = 0; s < kSockets; ++s) {
      // Send up to the socket's share of the window.
      int n = static_cast<int>(
          std::min<size_t>(kBatch, per_socket - std::min(per_socket, outstanding[s])));
      for (int i = 0; i < n; ++i) {
        auto& q = queries[next++ % queries.size()];
        iovs[i] = {q.data(), q.size()};
        msgs[i].msg_hdr = {};
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      if (n > 0) {
        int k = sendmmsg(fds[s], msgs.data(), static_cast<unsigned>(n), 0);
        if (k > 0) {
          outstanding[s] += static_cast<size_t>(k);
          sent += static_cast<size_t>(k);
        }
      }
      for (int i = 0; i < kBatch; ++i) {
        iovs[i] = {rbuf.data() + i * 1500, 1500};
        msgs[i].msg_hdr = {};
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      int r = recvmmsg(fds[s], msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
      if (r > 0) {
        received += static_cast<size_t>(r);
        outstanding[s] -= std::min(outstanding[s], static_cast<size_t>(r));
        progress = true;
      }
    }
    if (progress) {
      last_progress = now;
    } else if (now - last_progress > std::chrono::milliseconds(200)) {
      outstanding.fill(0);  // lost answers: forget them rather than stall
      last_progress = now;
    } else {
      pollfd p{fds[0], POLLIN, 0};
      poll(&p, 1, 1);
    }
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  size_t answers = received - counted;
  std::printf("%.0f %zu %.2f\n", static_cast<double>(answers) / secs, answers, secs);
  for (int fd : fds) close(fd);
  return 0;
}
