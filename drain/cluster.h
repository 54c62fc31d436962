// The cluster watermark over the network: one agent's Aggregator (drain/aggregate.h) driven by
// its own thread, talking to its tree neighbours over persistent gRPC streams (Peer.Exchange,
// proto/endpointd/v1/drain.proto). A child opens the stream to its parent and sends its up
// reports on it; the parent answers with down reports on the same stream. An agent therefore
// holds one outgoing stream per parent it reports to (one, plus a former parent for a moment
// after the layout changed) and one incoming stream per child, plus one to the member it watches
// on the ring and one from the member that watches it: k + 3, whatever the cluster size and
// however many endpoints drain.
//
// Bounds (a hostile neighbour on the peer port): a stream must name its node within `hello`
// or it is closed; a name that is not a member (drain/members.h), that changes, or (mutual TLS)
// that the client's certificate does not carry closes it;
// incoming streams are capped at `max_incoming`, and one per node (a newer stream from the same
// node replaces the older); messages wait in a bounded queue per stream (the oldest unsent
// one is dropped: reports are state, the newest supersedes) and in a bounded inbox; nothing
// holds a thread per stream (callback reactors). Every refusal and drop is counted.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <grpcpp/support/server_callback.h>

#include "drain/aggregate.h"
#include "endpointd/v1/drain.pb.h"
#include "model/result.h"

namespace grpc {
class ChannelCredentials;
class CallbackServerContext;
}  // namespace grpc
namespace prometheus {
class Registry;
}

namespace endpointd::drain {

class TokenVerifier;

struct ClusterOptions {
  std::string node;  // this agent's node name
  AggregatorOptions aggregator;
  size_t max_incoming = 256;  // incoming streams at once (named or not)
  size_t queue = 8;           // messages waiting per stream
  size_t inbox = 4096;        // messages received and not yet handled
  std::chrono::milliseconds hello{2000};
  // An outgoing stream nothing was sent on for this long is closed (a former parent).
  std::chrono::milliseconds idle{10000};
  // Between two attempts to open a stream to the same peer (doubled while unanswered, up to
  // half of aggregator.silence).
  std::chrono::milliseconds reconnect{200};
  // Credentials for outgoing streams (null: insecure).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Mutual TLS: a parent's certificate must name the node dialled, and a stream's reports are
  // taken only from the node its client certificate names. Identity (drain/peer_identity.h):
  // only from the node its verified token names.
  bool tls = false;
  // Identity: the verifier (counts the stream's refusals). A token is taken on one live stream
  // at a time: a second stream presenting it while the first is open is refused (replayed).
  std::shared_ptr<TokenVerifier> verifier;
  prometheus::Registry* registry = nullptr;
};

class Cluster {
 public:
  // `on_change` runs on the cluster thread whenever the cluster watermark or the excluded list
  // changed (the coordinator re-evaluates its drains).
  Cluster(ClusterOptions opts, std::function<void()> on_change);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Peer.Exchange: a new incoming stream (the peer server's handler calls it).
  grpc::ServerBidiReactor<v1::PeerMessage, v1::PeerMessage>* exchange(
      grpc::CallbackServerContext* ctx);
  void start();
  void stop();

  // The live members (drain/members.h) and where their agents listen ("ip:port"); this agent's
  // own node must be among them to take part.
  void set_members(std::map<std::string, std::string> addresses);
  // This agent's own watermark: every consumer applied every EndpointSlice event up to it.
  void set_local(uint64_t watermark);
  void set_local(uint64_t watermark, uint64_t dns_watermark, HoldoutList holdouts);

  struct View {
    uint64_t local = 0;
    uint64_t cluster = 0;
    bool member = false;
    std::shared_ptr<const std::set<std::string>> members;  // never null once published
    std::set<std::string> excluded;
    ClusterFacts facts;  // what drains read
  };
  View view() const;
  // For /debug/state: the tree as this agent sees it, the excluded nodes, streams, counters.
  std::string to_json() const;

  struct Stats {
    uint64_t up_sent = 0, down_sent = 0, up_received = 0, down_received = 0;
    uint64_t bytes_sent = 0, bytes_received = 0;
    uint64_t streams_opened = 0;  // outgoing
    uint64_t streams_accepted = 0;
    uint64_t refused_unnamed = 0, refused_not_member = 0, refused_renamed = 0, refused_limit = 0;
    uint64_t refused_identity = 0;   // the certificate (or token) names another node
    uint64_t refused_replayed = 0;   // a token already presented on another live stream
    uint64_t refused_malformed = 0;  // a message that is no report
    uint64_t dropped_queue = 0, dropped_inbox = 0, dropped_no_stream = 0;
    uint64_t watermark_backwards = 0;      // a peer's report went backwards: taken, logged
    uint64_t watermark_clamped_ahead = 0;  // a parent's above this agent's own: clamped
    size_t incoming = 0, outgoing = 0;     // streams open now
    size_t peak_streams = 0;
  };
  Stats stats() const;

 private:
  class InStream;
  class OutStream;
  struct Event;
  struct Metrics;
  void run();
  void post(Event ev);
  void handle(Event& ev, std::chrono::steady_clock::time_point now);
  void dispatch(std::vector<Aggregator::Send> sends, std::chrono::steady_clock::time_point now);
  void sweep(std::chrono::steady_clock::time_point now);
  void publish_view();
  // Logs and counts the reports the aggregator found wrong on their face.
  void report_anomalies(std::chrono::steady_clock::time_point now);

  ClusterOptions opts_;
  std::function<void()> on_change_;
  std::unique_ptr<Metrics> metrics_;

  // The inbox: what callbacks hand to the cluster thread. Callbacks take only this lock (and
  // their stream's own), so the thread never holds it while it calls into a stream.
  mutable std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Event> inbox_;
  size_t inbox_messages_ = 0;
  bool stopping_ = false;
  size_t live_reactors_ = 0;  // reactors not yet done (stop() waits for 0)
  std::map<std::string, std::string> pending_members_;
  bool members_changed_ = false;
  uint64_t pending_local_ = 0;
  uint64_t pending_local_dns_ = 0;
  HoldoutList pending_holdouts_;
  bool local_changed_ = false;

  // Owned by the cluster thread.
  Aggregator agg_;
  std::map<std::string, std::string> addresses_;
  std::set<InStream*> incoming_;
  std::map<std::string, InStream*> incoming_by_node_;
  std::map<std::string, InStream*> incoming_by_credential_;  // identity: the live stream of a token
  std::map<std::string, uint64_t> refusals_logged_;          // per reason: logged at powers of two
  std::map<std::string, OutStream*> outgoing_;
  // Per peer: the last attempt to open a stream and the wait before the next one (doubled
  // while attempts go unanswered, reset by an answer).
  struct Backoff {
    std::chrono::steady_clock::time_point last{};
    std::chrono::milliseconds delay{0};
  };
  std::map<std::string, Backoff> backoff_;
  // When a wrong report from a peer was last logged, per kind and peer (one line per 10 s).
  std::map<std::string, uint64_t> anomaly_counts_;  // kind/peer -> how many, for the log
  std::thread thread_;

  mutable std::mutex view_mu_;  // the copy other threads read
  View view_;
  Stats stats_;
  std::string json_;
};

}  // namespace endpointd::drain
