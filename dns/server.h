// The DNS server: one SO_REUSEPORT UDP socket per worker thread (recvmmsg/sendmmsg batches)
// and one TCP thread (several queries per connection, idle timeout, connection limit).
// Answers come from the zone published in a ZoneSlot; other names go to the Forwarder.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dns/forwarder.h"
#include "dns/metrics.h"
#include "dns/zone.h"
#include "model/ip.h"

namespace endpointd::dns {

// Where workers find the current zone: a version they poll with one relaxed load per batch,
// and the zone itself, loaded only when the version moved.
class ZoneSlot {
 public:
  void publish(ZonePtr z) {
    zone_.store(std::move(z));
    version_.fetch_add(1, std::memory_order_release);
  }
  ZonePtr load() const { return zone_.load(); }
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::shared_ptr<const Zone>> zone_;
  std::atomic<uint64_t> version_{0};
};

struct ServerOptions {
  std::string listen_address = "127.0.0.1";
  uint16_t port = 53;  // 0: the kernel picks one; port() says which
  int workers = 1;
  size_t tcp_max_connections = 256;
  std::chrono::milliseconds tcp_idle_timeout{10000};
  // Answers waiting for a TCP client to read them, per connection: a client past it does not
  // read and is dropped (counted).
  size_t tcp_max_pending_bytes = 256 * 1024;
  // Clients allowed to use forwarding; others get REFUSED for names outside the zone.
  std::vector<model::IpPrefix> forward_allow;
};

class Server {
 public:
  // `forwarder` may be null (names outside the zone: REFUSED); `metrics` may be null (counts
  // nowhere). Its threads count into blocks of `metrics` (Metrics::thread_counts), which
  // reach the registry when Metrics::fold is called.
  Server(ServerOptions opts, const ZoneSlot* zones, Forwarder* forwarder, Metrics* metrics);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  Status start();
  // Stops the threads, then the forwarder (its last callbacks still find open sockets).
  void stop();
  uint16_t port() const { return port_; }

  uint64_t dropped() const { return dropped_.load(); }
  uint64_t tcp_rejected() const { return tcp_rejected_.load(); }
  uint64_t tcp_slow_dropped() const { return tcp_slow_dropped_.load(); }

 private:
  class Worker;
  class TcpServer;
  ServerOptions opts_;
  const ZoneSlot* zones_;
  Forwarder* forwarder_;
  std::unique_ptr<Metrics> own_metrics_;  // when given none: counts kept, registered nowhere
  Metrics* metrics_;                      // never null
  uint16_t port_ = 0;
  int stop_fd_ = -1;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<TcpServer> tcp_;
  std::atomic<uint64_t> dropped_{0}, tcp_rejected_{0}, tcp_slow_dropped_{0};
  bool running_ = false;
};

bool allowed(const std::vector<model::IpPrefix>& allow, const model::IpAddr& a);

}  // namespace endpointd::dns
