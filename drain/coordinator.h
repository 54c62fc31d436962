// The drain coordinator: runs the state machine on its own thread, fed by snapshots, the
// acknowledgement board, peer agents' answers and conntrack counts; serves peers
// (Peer.AwaitRemoval over gRPC) and pods' prestop calls (a unix socket).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "drain/aggregate.h"
#include "drain/flows.h"
#include "drain/local_marks.h"
#include "drain/machine.h"
#include "drain/members.h"
#include "drain/node_state.h"
#include "drain/peer_tls.h"
#include "pipeline/ack_board.h"

namespace prometheus {
class Registry;
}

namespace endpointd::drain {

struct BoardHook;
class Cluster;

struct CoordinatorOptions {
  Options machine;  // node_name, budgets, peer policy, release-after default
  // Peer server: "ADDR:PORT" to listen on (empty: no server). Peers are called at their
  // Node's InternalIP and `peer_port`.
  std::string peer_listen = "0.0.0.0:9465";
  uint16_t peer_port = 9465;
  // Mutual TLS for the peer server and every call to a peer; plaintext only with
  // peer_insecure (start() fails when neither is given and peer_listen is set).
  PeerTlsFiles peer_tls;
  bool peer_insecure = false;
  size_t peer_concurrency = 16;  // calls in flight at once
  // A peer server holds an AwaitRemoval call at most this long.
  milliseconds peer_answer_max{30000};
  // The cluster watermark (peer protocol v2): drains whose update has a resourceVersion are
  // confirmed by it instead of one AwaitRemoval call per endpoint and peer. Off: v1 only.
  bool watermark = true;
  AggregatorOptions aggregator;
  // The prestop socket (empty: none).
  std::string drain_socket;
  size_t prestop_max_connections = 256;
  // How often live flows are counted while a drain waits for them.
  milliseconds conntrack_poll{20};
  // A member whose Node is deleted stays one (unknown) until its agent has been excluded for
  // silence this long: a machine whose Node object went may still route by its rules.
  milliseconds deleted_node_hold{30000};
  prometheus::Registry* registry = nullptr;
  // What the node keeps across this agent's restarts (--drain-state-file): with
  // machine.members_service, the nodes seen running an agent are loaded from it and added to
  // it, so a restart cannot forget a node whose agent is out of the Service now. Null: none.
  NodeStateFile* node_state = nullptr;
  // New connections to this node's terminating pods (observed removal, drain/late.h): the late
  // senders after a removal, shown on the drain and counted. Null: not observed.
  NewFlows* new_flows = nullptr;
  // How long a released pod's address is still watched (or until another pod holds it).
  milliseconds late_window{5000};
};

class Coordinator {
 public:
  // `board` and `flows` must outlive the coordinator; `flows` may be null (stage 3
  // then proceeds as with conntrack unavailable). What consumers whose answers are cached
  // have handed out (DNS) is on their board entries (`Entry::answers`).
  Coordinator(pipeline::AckBoard* board, Flows* flows, CoordinatorOptions opts);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Starts the state-machine thread, the peer server and the prestop socket. Sockets are made
  // in the calling thread's network namespace.
  Status start();
  void stop();

  // Every published snapshot (UpdateLoop::on_publish). Cheap: hands it to the thread.
  void on_snapshot(model::SnapshotPtr snap);

  // For /debug/state.
  std::string drains_json() const;
  Counters counters() const;
  uint16_t peer_port() const { return bound_peer_port_; }
  // For /debug/state: the cluster watermark's view ("null" when it is off).
  std::string cluster_json() const;
  // Grows with every pass of the drain loop (a snapshot, a board or cluster watermark change,
  // a prestop call, a deadline): what drains_json() and the members and watermark in
  // cluster_json() show changes only when it does. A reader that polls them looks at this
  // first.
  uint64_t state_version() const { return state_version_.load(std::memory_order_acquire); }

  // Whether this agent's own consumers still route new connections to `ip` (what a peer asks).
  // `revision`: the EndpointSlice revision of the removal asked about (0: not known).
  LocalRemoval local_removal(const model::IpAddr& ip, uint64_t revision = 0) const;
  // Waits until local_removal(ip, revision).removed or the deadline.
  LocalRemoval await_local_removal(const model::IpAddr& ip, uint64_t revision,
                                   TimePoint deadline) const;

  // Runs a drain action in the prestop client (bounded by the deadline) and says what it gave.
  using RunAction = std::function<Result<std::string>(const std::string& spec, TimePoint deadline)>;
  // A prestop call from a pod, identified by the caller. Blocks until a verdict, the caller
  // hanging up (`gone` returns true) or `hard_deadline`. `action`: the client's --drain-action;
  // `run_action`: how to have the client run the drain action when it is due (empty: a client
  // that cannot, whose pod then releases after removal).
  Verdict prestop(const model::ObjectKey& pod, const std::string& uid,
                  const std::function<bool()>& gone, const std::string& action = {},
                  const RunAction& run_action = {});

  // The newest snapshot the coordinator has seen.
  model::SnapshotPtr snapshot() const;
  // Waits until a snapshot arrived that satisfies pred (for the prestop server: the pod list).
  model::SnapshotPtr wait_snapshot(const std::function<bool(const model::Snapshot&)>& pred,
                                   TimePoint deadline) const;

 private:
  struct Metrics;
  struct PeerJob {
    model::IpAddr ip;
    std::string node;
    std::string address;
    TimePoint deadline;
    uint64_t revision = 0;  // the removal's EndpointSlice revision, sent with the question
  };
  class PeerServer;
  class PrestopServer;
  void run();
  void peer_worker();
  void wake();
  void record(const std::vector<Transition>& ts);
  // Under mu_: the late-sender watch brought to the drains and fed what was seen (late.h).
  void observe_late(TimePoint now);
  // Hands cluster_ the members (drain/members.h).
  void update_members(Members current, TimePoint now);
  // Under mu_: the cluster watermark's members and this agent's own watermark from the board.
  void update_watermark(const std::vector<pipeline::AckBoard::Entry>& entries, TimePoint now,
                        TimePoint* next);

  pipeline::AckBoard* board_;
  Flows* flows_;
  CoordinatorOptions opts_;
  std::unique_ptr<Metrics> metrics_;

  mutable std::mutex mu_;
  std::atomic<uint64_t> state_version_{0};
  static constexpr std::chrono::milliseconds kMinDeadlineWait{5};
  static constexpr std::chrono::milliseconds kLatePoll{100};
  mutable std::condition_variable cv_;  // work for run()
  // Work for the peer workers: their own, so that a snapshot (cv_, several a second under
  // churn) does not wake every one of them to find nothing to do.
  std::condition_variable peer_cv_;
  mutable std::condition_variable changed_;  // verdicts, board changes, snapshots
  Machine machine_;
  model::SnapshotPtr pending_;  // newest snapshot not yet given to the machine
  model::SnapshotPtr latest_;
  bool dirty_ = false;
  bool stopping_ = false;
  Counters last_counters_;
  std::deque<PeerJob> peer_jobs_;
  std::thread thread_;
  std::vector<std::thread> peer_threads_;
  std::unique_ptr<Cluster> cluster_;
  LocalMarks marks_;                        // this agent's own watermarks
  std::set<model::IpAddr> local_fallback_;  // from marks_: routed here by the fallback
  std::set<std::string> agents_seen_;       // nodes ever seen in the agents' Service
  std::set<std::string> departed_;          // of those, not in it now (their Node still listed)
  // Members whose Node was deleted while their machine may run: held until their agent has
  // been silent past the bound (drain/members.h).
  DeletedNodes deleted_{std::chrono::seconds(30)};
  Members from_nodes_;  // the members the Node list (and the agents' Service) give
  LateWatch late_;      // new connections to this node's drains (opts_.new_flows)
  std::set<model::IpAddr> late_watched_;  // the addresses new_flows watches
  LateWatch::Stats late_counted_;         // what the metric has been given of late_.stats()
  // Where cluster_'s members came from: the Node objects, or the agents' Service's state.
  std::vector<model::NodePtr> member_nodes_;
  model::SnapshotPtr members_snap_;  // the snapshot the members were last made from
  model::ServiceStatePtr member_state_;
  Members current_members_;
  bool members_synced_ = false;      // current_members_ came from a synced snapshot
  std::optional<bool> self_member_;  // this node among current_members_ (unset: not yet said)
  std::unique_ptr<PeerServer> peer_server_;
  PeerCredentials peer_creds_;  // loaded by start() when there is a peer server
  std::unique_ptr<PrestopServer> prestop_server_;
  uint16_t bound_peer_port_ = 0;
  std::shared_ptr<BoardHook> hook_;
};

// `endpointd prestop [--drain-socket PATH] [--timeout DURATION]`: exits 0 when the agent
// releases the pod, non-zero with the reason on stderr otherwise. Retries while the agent is
// unreachable (a restart) until its own deadline.
int prestop_main(int argc, char** argv);
struct PrestopClientOptions {
  std::string socket = "/run/endpointd/drain.sock";
  milliseconds timeout{120000};
  milliseconds retry{200};
  std::string action;  // --drain-action: run once the pod is removed everywhere
  // --allow-writable-socket-dir: skip verify_drain_socket's directory check (development
  // machines and tests, where the socket lives in a directory the caller can write).
  bool allow_writable_dir = false;
};
// What `endpointd prestop` exits with and prints: 0 and the agent's reason on release; else
// 2 (bad socket path), 3 (refused), 4 (not released), 5 (timed out), 6 (the socket is not
// verifiably the agent's; see verify_drain_socket) and why.
struct PrestopOutcome {
  int exit_code = 0;
  std::string message;
};
PrestopOutcome run_prestop(const PrestopClientOptions& opts);
// Whether the socket at `path` can only be the agent's: it is a socket (not a link), and its
// directory is owned by root or by the socket's owner, writable by neither group nor others,
// and not writable by this process (the pod mounts it read-only). A pod that could write the
// directory could have put its own socket there, and an impostor would "release" every pod at
// once. `allow_writable_dir` skips the last check only. The error names what was wrong.
Status verify_drain_socket(const std::string& path, bool allow_writable_dir);
// After connecting: the server's credentials (SO_PEERCRED) must be those of the socket
// file's owner — the process that bound it, not one that merely connected a proxy to it.
Status verify_drain_server(int fd, const std::string& path);
// "500ms", "30s", "2m", "1h", or plain seconds.
std::optional<milliseconds> parse_duration(const std::string& s);

}  // namespace endpointd::drain
