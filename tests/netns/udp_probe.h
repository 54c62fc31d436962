// A UDP client for tests that talk to a namespace's test servers (tests/netns/testserver):
// one connected socket made inside a namespace, so every datagram has the same 5-tuple and
// hence one conntrack entry, and a one-datagram question whose answer is the server's name.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tests/netns/netns.h"

namespace endpointd::netns {

// A UDP socket made inside `ns`, connected to addr:port (the caller closes it).
inline int udp_socket_in(Netns& ns, const char* addr, uint16_t port) {
  return ns.run([&] {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("udp socket failed");
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    inet_pton(AF_INET, addr, &sin.sin_addr);
    if (connect(fd, static_cast<sockaddr*>(static_cast<void*>(&sin)), sizeof sin) != 0)
      throw std::runtime_error(std::string("udp connect to ") + addr + " failed");
    return fd;
  });
}

// Sends one datagram; the answer without its trailing newline (the answering server's name),
// or "" when none came within `timeout_ms`.
inline std::string udp_ask(int fd, int timeout_ms) {
  if (send(fd, "x\n", 2, 0) != 2) return "";
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return "";
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof buf, 0);
  if (n <= 0) return "";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace endpointd::netns
