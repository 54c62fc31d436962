// Peers: the server answers AwaitRemoval when this agent's own consumers no longer route to
// the endpoint; the workers call every other node's agent, a bounded number at a time, each
// call retried until that peer's deadline.
#include <algorithm>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>
#include <spdlog/spdlog.h>

#include "drain/cluster.h"
#include "drain/peer_tls.h"
#include "drain/servers.h"
#include "endpointd/v1/drain.grpc.pb.h"

namespace endpointd::drain {

namespace pb = endpointd::v1;

namespace {

// Peer.Exchange on an agent without the cluster watermark.
class Unimplemented final : public grpc::ServerBidiReactor<pb::PeerMessage, pb::PeerMessage> {
 public:
  Unimplemented() {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "endpointd drain: this agent runs without the cluster watermark"));
  }
  void OnDone() override { delete this; }
};

}  // namespace

// AwaitRemoval holds a thread of the server's bounded pool per call (v1); Exchange streams are
// callback reactors (v2) and hold none.
class Coordinator::PeerServer::Service final
    : public pb::Peer::WithCallbackMethod_Exchange<pb::Peer::Service> {
 public:
  Service(Coordinator* c, std::string node, milliseconds max, Cluster* cluster)
      : c_(c), node_(std::move(node)), max_(max), cluster_(cluster) {}
  bool tls = false;  // a caller must be the node its token or certificate names
  grpc::ServerBidiReactor<pb::PeerMessage, pb::PeerMessage>* Exchange(
      grpc::CallbackServerContext* ctx) override {
    if (!cluster_) return new Unimplemented();
    return cluster_->exchange(ctx);
  }
  grpc::Status AwaitRemoval(grpc::ServerContext* ctx, const pb::AwaitRemovalRequest* req,
                            pb::AwaitRemovalResponse* resp) override {
    if (tls) {
      auto names = peer_certificate_names(*ctx->auth_context());
      if (std::find(names.begin(), names.end(), req->from_node()) == names.end())
        return {grpc::StatusCode::PERMISSION_DENIED,
                "the caller's token or certificate does not name node \"" +
                    req->from_node().substr(0, 64) + "\""};
    }
    auto ip = model::IpAddr::parse(req->address());
    if (!ip)
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "not an IP address: " + req->address().substr(0, 64)};
    auto now = Clock::now();
    TimePoint deadline = now + max_;
    auto left = ctx->deadline() - std::chrono::system_clock::now();
    // Answer a little before the caller's deadline, so it gets a reason rather than a timeout.
    if (left < std::chrono::hours(1)) deadline = std::min(deadline, now + left - milliseconds(50));
    LocalRemoval r;
    while (true) {
      r = c_->await_local_removal(*ip, req->revision(),
                                  std::min(deadline, Clock::now() + milliseconds(200)));
      if (r.removed || Clock::now() >= deadline || ctx->IsCancelled()) break;
    }
    resp->set_removed(r.removed);
    resp->set_node(node_);
    for (const auto& cs : r.consumers) {
      auto* m = resp->add_consumers();
      m->set_consumer(cs.name);
      m->set_generation(cs.generation);
      m->set_routes(cs.routes);
      if (cs.routes)
        resp->set_reason(resp->reason() + (resp->reason().empty() ? "still routed by " : ", ") +
                         cs.name);
    }
    spdlog::debug("drain: peer {} asked about {}: removed={}", req->from_node(), req->address(),
                  r.removed);
    return grpc::Status::OK;
  }

 private:
  Coordinator* c_;
  std::string node_;
  milliseconds max_;
  Cluster* cluster_;
};

Coordinator::PeerServer::PeerServer(Coordinator* c, std::string node, milliseconds answer_max,
                                    Cluster* cluster)
    : service_(std::make_unique<Service>(c, std::move(node), answer_max, cluster)) {}

Coordinator::PeerServer::~PeerServer() {
  stop();
}

Result<uint16_t> Coordinator::PeerServer::start(const std::string& listen,
                                                const PeerCredentials& creds) {
  service_->tls = creds.tls;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(listen, creds.server ? creds.server : grpc::InsecureServerCredentials(),
                     &port);
  b.RegisterService(service_.get());
  // Reports are small; a peer that sends more is not a peer.
  b.SetMaxReceiveMessageSize(4 << 20);
  b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 32);
  // A connection that has not finished its TLS handshake within 5 s is closed (gRPC's default
  // holds it for 120 s): a neighbour opening connections and saying nothing costs a socket for
  // seconds, not minutes.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 5000);
  grpc::ResourceQuota quota("endpointd-drain-peer");
  quota.SetMaxThreads(64);
  b.SetResourceQuota(quota);
  server_ = b.BuildAndStart();
  if (!server_ || port == 0) {
    server_.reset();
    return Error{"drain: cannot listen for peers on " + listen};
  }
  return static_cast<uint16_t>(port);
}

void Coordinator::PeerServer::stop() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_.reset();
  }
}

void Coordinator::peer_worker() {
  while (true) {
    PeerJob job;
    {
      std::unique_lock lock(mu_);
      peer_cv_.wait(lock, [&] { return stopping_ || !peer_jobs_.empty(); });
      if (stopping_) return;
      job = peer_jobs_.front();
      peer_jobs_.pop_front();
    }
    grpc::ChannelArguments args;
    // The peer's certificate must name the node it is called as.
    if (peer_creds_.tls) args.SetSslTargetNameOverride(job.node);
    auto channel = grpc::CreateCustomChannel(
        job.address, peer_creds_.client ? peer_creds_.client : grpc::InsecureChannelCredentials(),
        args);
    auto stub = pb::Peer::NewStub(channel);
    bool confirmed = false;
    std::string last_error = "not asked";
    auto started = Clock::now();
    while (Clock::now() < job.deadline) {
      {
        std::lock_guard lock(mu_);
        if (stopping_) return;
      }
      grpc::ClientContext ctx;
      auto call_deadline = std::min(job.deadline, Clock::now() + std::chrono::seconds(2));
      ctx.set_deadline(std::chrono::system_clock::now() + (call_deadline - Clock::now()));
      pb::AwaitRemovalRequest req;
      req.set_address(job.ip.str());
      req.set_from_node(opts_.machine.node_name);
      req.set_revision(job.revision);
      pb::AwaitRemovalResponse resp;
      grpc::Status st = stub->AwaitRemoval(&ctx, req, &resp);
      if (st.ok() && resp.removed() && resp.node() == job.node) {
        confirmed = true;
        break;
      }
      if (st.ok() && resp.removed()) {
        last_error = "answered as node '" + resp.node().substr(0, 64) + "', not " + job.node;
      } else if (st.ok()) {
        last_error = "still routing: " + resp.reason().substr(0, 200);
      } else {
        last_error = "rpc failed (" + std::to_string(st.error_code()) +
                     "): " + st.error_message().substr(0, 200);
      }
      // A short pause before asking again (a peer that is down answers at once).
      std::unique_lock lock(mu_);
      changed_.wait_for(lock, milliseconds(100), [&] { return stopping_; });
    }
    auto took = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
    if (confirmed) {
      spdlog::info("drain: peer {} confirmed removal of {} after {:.1f} ms", job.node, job.ip.str(),
                   took);
    } else {
      spdlog::warn("drain: peer {} ({}) did not confirm removal of {} by its deadline: {}",
                   job.node, job.address, job.ip.str(), last_error);
    }
    {
      std::lock_guard lock(mu_);
      machine_.peer_answered(job.ip, job.node, confirmed, last_error, Clock::now());
      dirty_ = true;
    }
    cv_.notify_all();
  }
}

}  // namespace endpointd::drain
