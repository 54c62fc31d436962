// The feed benchmark: a FeedSink on loopback holding 10,000 services x 10 endpoints, 1,000
// endpointd.v1.UpstreamFeed/Watch subscribers, then one endpoint change at a time.
//
// Two processes, so that the server's memory per subscriber is the sink's own: the parent
// runs the FeedSink and applies the changes; it starts itself again with --client, and that
// child holds every subscriber (a few channels, many streams each, gRPC's callback API: no
// thread per stream). Both read CLOCK_MONOTONIC (steady_clock), which is one clock for the
// whole machine, so a receive time in the child minus an apply time in the parent is the
// delivery latency.
//
// Per change g: apply -> the last subscriber that should receive g has read it (child), and
// apply -> the AckBoard shows applied("feed", g) (every subscriber acked; parent).
//
//   feed_bench --mode one|one-hot|all [--subscribers 1000] [--services 10000]
//              [--endpoints 10] [--changes 200] [--channels 16] [--gap-ms 2]
//              [--keepalive-ms N]   (the server's keepalive ping interval; default 30 s)
//              [--fanout-threads N] (threads writing one change to the subscribers; 0: per core)
//
// mode one:     subscriber i watches its own service (every 10th one); a change touches the
//               service of one subscriber, the 999 others see nothing.
// mode one-hot: every subscriber watches the same single service, and that one changes.
// mode all:     every subscriber watches all services; every change goes to all of them.
#include <google/protobuf/arena.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "endpointd/v1/feed.grpc.pb.h"
#include "feed/feed.h"
#include "model/snapshot.h"
#include "pipeline/ack_board.h"

namespace {

using namespace endpointd;
using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

int64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t process_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

long thread_waits() {  // voluntary context switches of this thread: it blocked (lock, I/O)
  rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nvcsw;
}

long vm_kib(const char* field) {  // "VmRSS" / "VmHWM" from /proc/self/status, in KiB
  std::ifstream f("/proc/self/status");
  std::string line;
  size_t n = std::strlen(field);
  while (std::getline(f, line))
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':')
      return std::strtol(line.c_str() + n + 1, nullptr, 10);
  return -1;
}

struct Args {
  std::string mode = "all";
  int subscribers = 1000;
  int services = 10000;
  int endpoints = 10;
  int changes = 200;
  int channels = 16;
  int gap_ms = 2;
  int keepalive_ms = 0;    // 0: FeedOptions' default
  int fanout_threads = 0;  // FeedOptions::fanout_threads (0: one per core)
  bool client = false;
  int port = 0;
  // How a subscriber reads a response: "full" parses the WatchResponse as a real client does;
  // "version" reads only its version and full fields. Subscribers live in a process on the
  // same 2 cores as endpointd, so "version" keeps their parsing out of endpointd's CPU.
  std::string client_parse = "full";
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "feed_bench: " << k << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--mode")
      a.mode = val();
    else if (k == "--subscribers")
      a.subscribers = std::stoi(val());
    else if (k == "--services")
      a.services = std::stoi(val());
    else if (k == "--endpoints")
      a.endpoints = std::stoi(val());
    else if (k == "--changes")
      a.changes = std::stoi(val());
    else if (k == "--channels")
      a.channels = std::stoi(val());
    else if (k == "--gap-ms")
      a.gap_ms = std::stoi(val());
    else if (k == "--keepalive-ms")
      a.keepalive_ms = std::stoi(val());
    else if (k == "--fanout-threads")
      a.fanout_threads = std::stoi(val());
    else if (k == "--client")
      a.client = true;
    else if (k == "--port")
      a.port = std::stoi(val());
    else if (k == "--client-parse")
      a.client_parse = val();
    else {
      std::cerr << "feed_bench: unknown argument " << k << "\n";
      std::exit(2);
    }
  }
  if (a.client_parse != "full" && a.client_parse != "version") {
    std::cerr << "feed_bench: --client-parse full|version\n";
    std::exit(2);
  }
  if (a.mode != "one" && a.mode != "one-hot" && a.mode != "all") {
    std::cerr << "feed_bench: --mode one|one-hot|all\n";
    std::exit(2);
  }
  return a;
}

// ---------------------------------------------------------------- the cluster (parent)

std::string ns_of(int svc) {
  return "ns-" + std::to_string(svc / 100);
}
std::string name_of(int svc) {
  return "svc-" + std::to_string(svc);
}

std::string ipv4(uint32_t v) {
  return std::to_string(v >> 24) + "." + std::to_string((v >> 16) & 255) + "." +
         std::to_string((v >> 8) & 255) + "." + std::to_string(v & 255);
}

model::ServiceStatePtr make_service(int svc, int endpoints) {
  auto st = std::make_shared<model::ServiceState>();
  st->service.key = {ns_of(svc), name_of(svc)};
  st->service.cluster_ips = {
      *model::IpAddr::parse(ipv4((10u << 24) | (96u << 16) | uint32_t(svc)))};
  model::ServicePort sp;
  sp.name = "http";
  sp.port = 80;
  sp.target_port_name = "http";
  st->service.ports.push_back(sp);
  for (int j = 0; j < endpoints; ++j) {
    uint32_t ip = (10u << 24) + uint32_t(svc) * 16u + uint32_t(j) + 1u;  // 10.0.0.0/8
    model::MergedEndpoint m;
    m.address = *model::IpAddr::parse(ipv4(ip));
    m.conditions = {true, true, false};
    m.ports.push_back({"http", model::Protocol::kTCP, 8080, ""});
    m.zone = "zone-" + std::string(1, char('a' + j % 3));
    m.node_name = "node-" + std::to_string((svc * endpoints + j) % 500);
    m.target_ref = model::ObjectRef{"Pod", ns_of(svc), name_of(svc) + "-" + std::to_string(j),
                                    "uid-" + std::to_string(svc) + "-" + std::to_string(j)};
    st->endpoints.push_back(std::move(m));
  }
  std::sort(st->endpoints.begin(), st->endpoints.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  return st;
}

// Which service subscriber i watches (modes one and one-hot).
int service_of_subscriber(const Args& a, int i) {
  if (a.mode == "one-hot") return 0;
  int stride = std::max(1, a.services / a.subscribers);
  return (i * stride) % a.services;
}

// ---------------------------------------------------------------- the subscribers (child)

struct Record {  // per version: how many subscribers read it, and when the last one did
  std::atomic<int> count{0};
  std::atomic<int64_t> last_ns{0};
};

// The version (field 1) and full (field 2) of a serialized WatchResponse, from its first
// bytes: protobuf writes fields in number order, so both precede the services.
bool peek_version(grpc::ByteBuffer& bytes, uint64_t* version, bool* full) {
  std::vector<grpc::Slice> slices;
  if (!bytes.Dump(&slices).ok()) return false;
  grpc::Slice joined;
  const grpc::Slice* head = slices.empty() ? nullptr : &slices[0];
  if (head && head->size() < 16 && slices.size() > 1) {
    if (!bytes.DumpToSingleSlice(&joined).ok()) return false;
    head = &joined;
  }
  *version = 0;
  *full = false;
  if (!head) return true;  // an empty message: version 0
  const uint8_t* p = head->begin();
  const uint8_t* end = head->end();
  auto varint = [&](uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; p < end && shift < 64; shift += 7) {
      uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) {
        *out = v;
        return true;
      }
    }
    return false;
  };
  while (p < end) {
    uint64_t tag = 0, value = 0;
    if (!varint(&tag)) return false;
    if ((tag & 7) != 0) return true;  // the repeated messages: nothing after them matters
    if (!varint(&value)) return false;
    if (tag >> 3 == 1) *version = value;
    if (tag >> 3 == 2) *full = value != 0;
  }
  return true;
}

class Subscriber final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  Subscriber(grpc::GenericStub* stub, const Args& a, int index, std::vector<Record>* records,
             std::atomic<int>* ready, std::atomic<int>* done)
      : parse_full_(a.client_parse == "full"), records_(records), ready_(ready), done_(done) {
    auto* sub = wreq_.mutable_subscribe();
    sub->set_client_name("bench");
    if (a.mode == "all") {
      sub->set_all(true);
    } else {
      int s = service_of_subscriber(a, index);
      auto* sel = sub->add_selectors();
      sel->set_namespace_(ns_of(s));
      sel->set_name(name_of(s));
    }
    stub->PrepareBidiStreamingCall(&ctx_, "/endpointd.v1.UpstreamFeed/Watch", grpc::StubOptions(),
                                   this);
    writing_ = true;
    start_write_locked();
    StartRead(&rbytes_);
    StartCall();
  }
  void cancel() { ctx_.TryCancel(); }
  grpc::Status status() {
    std::lock_guard lock(mu_);
    return status_;
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    uint64_t v = 0;
    bool full = false;
    if (parse_full_) {
      // Every field into a fresh message on an arena whose first block is on the stack, as a
      // proxy decodes each response into a new message: no heap allocation for an update of a
      // few services, and nothing of the previous response to clear first.
      alignas(16) char block[16384];
      google::protobuf::ArenaOptions opts;
      opts.initial_block = block;
      opts.initial_block_size = sizeof block;
      google::protobuf::Arena arena(opts);
      auto* resp = google::protobuf::Arena::CreateMessage<v1::WatchResponse>(&arena);
      if (!grpc::SerializationTraits<v1::WatchResponse>::Deserialize(&rbytes_, resp).ok()) {
        ctx_.TryCancel();
        return;
      }
      v = resp->version();
      full = resp->full();
    } else if (!peek_version(rbytes_, &v, &full)) {
      ctx_.TryCancel();
      return;
    }
    rbytes_.Clear();
    int64_t t = now_ns();
    if (v < records_->size()) {
      auto& r = (*records_)[v];
      r.count.fetch_add(1, std::memory_order_relaxed);
      int64_t prev = r.last_ns.load(std::memory_order_relaxed);
      while (prev < t && !r.last_ns.compare_exchange_weak(prev, t)) {
      }
    }
    {
      std::lock_guard lock(mu_);
      if (writing_) {
        pending_ack_ = v;
      } else {
        write_ack_locked(v);
      }
    }
    if (full && !counted_ready_) {
      counted_ready_ = true;
      ready_->fetch_add(1);
    }
    StartRead(&rbytes_);
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (!ok) return;
    if (pending_ack_) {
      uint64_t v = pending_ack_;
      pending_ack_ = 0;
      write_ack_locked(v);
    }
  }
  void OnDone(const grpc::Status& s) override {
    {
      std::lock_guard lock(mu_);
      status_ = s;
    }
    done_->fetch_add(1);
  }

 private:
  void write_ack_locked(uint64_t v) {
    wreq_.Clear();
    wreq_.mutable_ack()->set_version(v);
    writing_ = true;
    start_write_locked();
  }
  void start_write_locked() {
    wbytes_.Clear();
    bool own = false;
    grpc::SerializationTraits<v1::WatchRequest>::Serialize(wreq_, &wbytes_, &own);
    StartWrite(&wbytes_);
  }

  const bool parse_full_;
  grpc::ClientContext ctx_;
  v1::WatchRequest wreq_;
  grpc::ByteBuffer wbytes_;
  grpc::ByteBuffer rbytes_;
  std::vector<Record>* records_;
  std::atomic<int>* ready_;
  std::atomic<int>* done_;
  bool counted_ready_ = false;  // touched by reads only, which are serialized
  std::mutex mu_;
  bool writing_ = false;
  uint64_t pending_ack_ = 0;
  grpc::Status status_;
};

int run_client(const Args& a) {
  std::vector<Record> records(static_cast<size_t>(a.changes) + 3);
  std::atomic<int> ready{0}, done{0};
  long rss_before = vm_kib("VmRSS");

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int c = 0; c < a.channels; ++c) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt("endpointd.bench.channel", c);  // a connection of its own per channel
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels.push_back(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(a.port),
                                                 grpc::InsecureChannelCredentials(), args));
    stubs.push_back(std::make_unique<grpc::GenericStub>(channels.back()));
  }
  // Every connection up before the first stream: a channel that connects while the server is
  // busy sending full states can miss its SETTINGS deadline.
  for (auto& ch : channels)
    if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20))) {
      std::cout << "error 14 cannot connect" << std::endl;
      _exit(1);
    }
  std::vector<std::unique_ptr<Subscriber>> subs;
  subs.reserve(static_cast<size_t>(a.subscribers));
  auto t0 = Clock::now();
  for (int i = 0; i < a.subscribers; ++i)
    subs.push_back(std::make_unique<Subscriber>(stubs[static_cast<size_t>(i % a.channels)].get(), a,
                                                i, &records, &ready, &done));
  while (ready.load() < a.subscribers) {
    if (getppid() == 1) _exit(1);  // the server process is gone
    if (done.load() > 0) {
      for (auto& s : subs) {
        auto st = s->status();
        if (!st.ok()) {
          std::cout << "error " << st.error_code() << " " << st.error_message() << std::endl;
          _exit(1);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  double connect_s = std::chrono::duration<double>(Clock::now() - t0).count();
  long rss_after = vm_kib("VmRSS");
  std::cout << "ready " << rss_before << " " << rss_after << " " << connect_s << std::endl;
  int64_t cpu_ready = process_cpu_ns();

  std::string cmd;
  while (std::getline(std::cin, cmd)) {
    if (cmd == "dump") {
      for (size_t v = 0; v < records.size(); ++v)
        std::cout << "rec " << v << " " << records[v].count.load() << " "
                  << records[v].last_ns.load() << "\n";
      std::cout << "end " << done.load() << " " << process_cpu_ns() - cpu_ready << std::endl;
    } else if (cmd == "quit") {
      break;
    }
  }
  std::cout.flush();
  _exit(0);  // the streams die with the process; the server sees them go away
}

// ---------------------------------------------------------------- the server (parent)

struct Stats {
  double p50, p99, max, mean;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    size_t i = static_cast<size_t>(std::ceil(q * double(v.size())));
    return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
  };
  double sum = 0;
  for (double x : v) sum += x;
  return {at(0.50), at(0.99), v.back(), sum / double(v.size())};
}

int run_server(const Args& a, const char* self) {
  // The cluster, generation 1.
  auto t_build = Clock::now();
  std::vector<model::ServiceStatePtr> states;
  states.reserve(static_cast<size_t>(a.services));
  for (int s = 0; s < a.services; ++s) states.push_back(make_service(s, a.endpoints));
  std::map<model::ServiceKey, int> index;  // key -> service number
  for (int s = 0; s < a.services; ++s) index[states[static_cast<size_t>(s)]->key()] = s;
  auto snap = std::make_shared<model::Snapshot>();
  snap->generation = 1;
  snap->synced = true;
  snap->services = model::ServiceList(states);
  snap->endpoints = static_cast<size_t>(a.services) * static_cast<size_t>(a.endpoints);
  model::SnapshotPtr current = snap;

  pipeline::AckBoard board;
  prometheus::Registry registry;
  std::mutex mu;
  std::condition_variable cv;
  board.on_change([&] {
    std::lock_guard lock(mu);
    cv.notify_all();
  });
  auto feed_generation = [&] {
    for (const auto& e : board.entries())
      if (e.consumer == "feed") return e.generation();
    return uint64_t{0};
  };

  feed::FeedOptions opts;
  opts.listen = "127.0.0.1:0";
  opts.max_streams = static_cast<size_t>(a.subscribers) + 64;
  if (a.keepalive_ms > 0) opts.keepalive_time = std::chrono::milliseconds(a.keepalive_ms);
  opts.fanout_threads = static_cast<size_t>(a.fanout_threads);
  feed::FeedSink sink(opts, &board, &registry);
  if (auto st = sink.start(); !st) {
    std::cerr << "feed_bench: " << st.error() << "\n";
    return 1;
  }
  model::Delta first;
  first.to_generation = 1;
  for (const auto& st : states) first.added.push_back(st->key());
  sink.apply(current, first);
  double build_s = std::chrono::duration<double>(Clock::now() - t_build).count();
  long rss_server_before = vm_kib("VmRSS");

  // The subscribers, in a child process.
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return 1;
  std::vector<std::string> cargs = {self,
                                    "--client",
                                    "--port",
                                    std::to_string(sink.port()),
                                    "--mode",
                                    a.mode,
                                    "--subscribers",
                                    std::to_string(a.subscribers),
                                    "--services",
                                    std::to_string(a.services),
                                    "--changes",
                                    std::to_string(a.changes),
                                    "--channels",
                                    std::to_string(a.channels),
                                    "--client-parse",
                                    a.client_parse};
  std::vector<char*> cargv;
  for (auto& s : cargs) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  posix_spawn_file_actions_addclose(&fa, to_child[1]);
  posix_spawn_file_actions_addclose(&fa, from_child[0]);
  pid_t child;
  if (posix_spawn(&child, self, &fa, nullptr, cargv.data(), environ) != 0) {
    std::cerr << "feed_bench: cannot start the client process\n";
    return 1;
  }
  close(to_child[0]);
  close(from_child[1]);
  FILE* cin = fdopen(from_child[0], "r");
  FILE* cout = fdopen(to_child[1], "w");
  auto read_line = [&]() -> std::string {
    char buf[512];
    if (!fgets(buf, sizeof buf, cin)) return "";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  };

  std::string line = read_line();
  long rss_client_before = 0, rss_client_after = 0;
  double connect_s = 0;
  {
    std::istringstream is(line);
    std::string word;
    is >> word;
    if (word != "ready") {
      std::cerr << "feed_bench: client: " << line << "\n";
      return 1;
    }
    is >> rss_client_before >> rss_client_after >> connect_s;
  }
  // Every subscriber acked its full answer.
  {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(120), [&] { return feed_generation() >= 1; });
  }
  size_t live = sink.subscribers().size();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let freed buffers settle
  long rss_server_after = vm_kib("VmRSS");
  long hwm_server = vm_kib("VmHWM");

  // The changes: one endpoint of one service, its ready condition flipped.
  std::vector<int64_t> t_apply(static_cast<size_t>(a.changes) + 3, 0);
  std::vector<double> apply_ms, acked_ms, apply_cpu_ms, apply_waits;
  std::vector<int> expected(static_cast<size_t>(a.changes) + 3, 0);
  int missed_acks = 0;
  int64_t server_cpu0 = process_cpu_ns();
  for (int k = 0; k < a.changes; ++k) {
    uint64_t g = current->generation + 1;
    int svc = a.mode == "all" ? (k * 37) % a.services : service_of_subscriber(a, k % a.subscribers);
    expected[g] = a.mode == "one" ? 1 : a.subscribers;
    auto key = model::ServiceKey{ns_of(svc), name_of(svc)};
    auto old = current->find_ptr(key);
    auto changed = std::make_shared<model::ServiceState>(*old);
    auto& ep = changed->endpoints[static_cast<size_t>(k) % changed->endpoints.size()];
    ep.conditions.ready = !ep.conditions.ready;
    auto next = std::make_shared<model::Snapshot>();
    next->generation = g;
    next->synced = true;
    next->services = current->services.with({{key, changed}});
    next->endpoints = current->endpoints;
    model::Delta d;
    d.from_generation = current->generation;
    d.to_generation = g;
    d.changed.push_back(key);
    current = next;

    long w0 = thread_waits();
    int64_t c0 = thread_cpu_ns();
    int64_t t0 = now_ns();
    t_apply[g] = t0;
    sink.apply(current, d);
    int64_t t1 = now_ns();
    apply_cpu_ms.push_back(double(thread_cpu_ns() - c0) / 1e6);
    apply_waits.push_back(double(thread_waits() - w0));
    apply_ms.push_back(double(t1 - t0) / 1e6);
    {
      std::unique_lock lock(mu);
      if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return feed_generation() >= g; })) {
        ++missed_acks;
        continue;
      }
    }
    acked_ms.push_back(double(now_ns() - t0) / 1e6);
    std::this_thread::sleep_for(std::chrono::milliseconds(a.gap_ms));
  }

  int64_t server_cpu = process_cpu_ns() - server_cpu0;
  fputs("dump\n", cout);
  fflush(cout);
  std::vector<double> recv_ms;
  int short_deliveries = 0;
  int client_done = -1;
  int64_t client_cpu = 0;
  for (;;) {
    line = read_line();
    if (line.empty()) break;
    std::istringstream is(line);
    std::string word;
    is >> word;
    if (word == "end") {
      is >> client_done >> client_cpu;
      break;
    }
    size_t v;
    int count;
    int64_t last;
    is >> v >> count >> last;
    if (v < 2 || v >= t_apply.size() || t_apply[v] == 0) continue;
    if (count < expected[v]) ++short_deliveries;
    if (count > 0) recv_ms.push_back(double(last - t_apply[v]) / 1e6);
  }
  fputs("quit\n", cout);
  fflush(cout);
  int wstatus;
  waitpid(child, &wstatus, 0);

  auto r = stats(recv_ms);
  auto k = stats(acked_ms.empty() ? std::vector<double>{0} : acked_ms);
  auto p = stats(apply_ms);
  auto pc = stats(apply_cpu_ms);
  auto pw = stats(apply_waits);
  double server_per_sub = double(rss_server_after - rss_server_before) / double(a.subscribers);
  double client_per_sub = double(rss_client_after - rss_client_before) / double(a.subscribers);
  std::printf(
      "mode %s: %d subscribers (%zu live on the sink), %d services x %d endpoints, %d "
      "channels, %d changes\n",
      a.mode.c_str(), a.subscribers, live, a.services, a.endpoints, a.channels, a.changes);
  std::printf(
      "  cluster built and applied: %.2f s; subscribers connected and got their full "
      "state: %.2f s\n",
      build_s, connect_s);
  std::printf(
      "  apply -> last subscriber received (ms): p50 %.3f  p99 %.3f  max %.3f  mean %.3f"
      "  (n=%zu)\n",
      r.p50, r.p99, r.max, r.mean, recv_ms.size());
  std::printf(
      "  apply -> applied(\"feed\", g) on the AckBoard (ms): p50 %.3f  p99 %.3f  max %.3f"
      "  mean %.3f  (n=%zu)\n",
      k.p50, k.p99, k.max, k.mean, acked_ms.size());
  std::printf("  time inside FeedSink::apply (ms): p50 %.3f  p99 %.3f  max %.3f\n", p.p50, p.p99,
              p.max);
  std::printf(
      "  of which on the CPU (sink thread's CPU time, ms): p50 %.3f  p99 %.3f  mean %.3f; "
      "times it blocked per apply: p50 %.0f  p99 %.0f\n",
      pc.p50, pc.p99, pc.mean, pw.p50, pw.p99);
  std::printf(
      "  CPU per change, whole process: server %.3f ms, subscribers %.3f ms (the machine "
      "has %ld cores)\n",
      double(server_cpu) / 1e6 / a.changes, double(client_cpu) / 1e6 / a.changes,
      sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "  server RSS: %ld KiB before subscribers, %ld KiB after (peak %ld KiB): %.1f KiB "
      "per subscriber\n",
      rss_server_before, rss_server_after, hwm_server, server_per_sub);
  std::printf("  client RSS: %ld KiB before, %ld KiB after: %.1f KiB per subscriber\n",
              rss_client_before, rss_client_after, client_per_sub);
  std::printf(
      "  changes never acked within 10 s: %d; versions delivered to fewer subscribers "
      "than expected: %d; client streams ended early: %d\n",
      missed_acks, short_deliveries, client_done);
  std::printf(
      "RESULT mode=%s client_parse=%s subs=%d recv_p50=%.3f recv_p99=%.3f recv_max=%.3f "
      "ack_p50=%.3f "
      "ack_p99=%.3f ack_max=%.3f apply_p50=%.3f apply_p99=%.3f apply_cpu_p50=%.3f "
      "server_cpu_ms=%.3f client_cpu_ms=%.3f server_kib_per_sub=%.1f "
      "client_kib_per_sub=%.1f connect_s=%.2f missed=%d short=%d\n",
      a.mode.c_str(), a.client_parse.c_str(), a.subscribers, r.p50, r.p99, r.max, k.p50, k.p99,
      k.max, p.p50, p.p99, pc.p50, double(server_cpu) / 1e6 / a.changes,
      double(client_cpu) / 1e6 / a.changes, server_per_sub, client_per_sub, connect_s, missed_acks,
      short_deliveries);
  std::fflush(stdout);
  _exit(missed_acks == 0 && short_deliveries == 0 ? 0 : 1);  // skip a slow teardown
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse_args(argc, argv);
  if (a.client) return run_client(a);
  return run_server(a, "/proc/self/exe");
}
