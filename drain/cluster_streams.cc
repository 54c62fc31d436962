// The cluster thread's stream bookkeeping: a new incoming stream, the inbox gRPC's callbacks
// post to, each event handled (a stream named, refused, replaced or done; a report checked and
// handed to the Aggregator), the Aggregator's sends put on a stream (one opened when there is
// none, with backoff) and the sweep of unnamed and idle streams.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <variant>

#include "drain/cluster_internal.h"
#include "drain/peer_wire.h"

namespace endpointd::drain {

grpc::ServerBidiReactor<pb::PeerMessage, pb::PeerMessage>* Cluster::exchange(
    grpc::CallbackServerContext* ctx) {
  auto* s = new InStream(this, ctx, opts_.queue);
  Event ev;
  ev.kind = Event::Kind::kNewIn;
  ev.in = s;
  post(std::move(ev));
  return s;
}

void Cluster::post(Event ev) {
  {
    std::lock_guard lock(inbox_mu_);
    if (ev.kind == Event::Kind::kNewIn || ev.kind == Event::Kind::kOutDone ||
        ev.kind == Event::Kind::kInDone) {
      if (ev.kind == Event::Kind::kNewIn) ++live_reactors_;
      inbox_.push_back(std::move(ev));
    } else if (inbox_messages_ >= opts_.inbox) {
      // Full: the sender's next report (every heartbeat) carries the same state.
      std::lock_guard vl(view_mu_);
      ++stats_.dropped_inbox;
      return;
    } else {
      ++inbox_messages_;
      inbox_.push_back(std::move(ev));
    }
  }
  inbox_cv_.notify_all();
}

void Cluster::handle(Event& ev, SteadyClock::time_point now) {
  auto refuse = [&](InStream* s, grpc::StatusCode code, const std::string& why,
                    uint64_t Stats::*counter, const char* reason) {
    s->refused = true;
    // Logged at powers of two per reason: a hostile neighbour does not fill the log.
    uint64_t n = ++refusals_logged_[reason];
    if ((n & (n - 1)) == 0)
      spdlog::warn("drain: peer stream from {} refused ({}, {} so far): {}", s->peer(), reason, n,
                   why);
    {
      std::lock_guard lock(view_mu_);
      ++(stats_.*counter);
    }
    metrics_->refused->Add({{"reason", reason}}).Increment();
    s->finish(grpc::Status(code, "endpointd drain: " + why));
  };
  switch (ev.kind) {
    case Event::Kind::kNewIn:
      incoming_.insert(ev.in);
      if (incoming_.size() > opts_.max_incoming) {
        refuse(ev.in, grpc::StatusCode::RESOURCE_EXHAUSTED, "too many peer streams",
               &Stats::refused_limit, "limit");
      } else {
        std::lock_guard lock(view_mu_);
        ++stats_.streams_accepted;
      }
      return;
    case Event::Kind::kInDone:
      if (!ev.in->node.empty()) {
        auto it = incoming_by_node_.find(ev.in->node);
        if (it != incoming_by_node_.end() && it->second == ev.in) incoming_by_node_.erase(it);
      }
      if (!ev.in->credential.empty()) {
        auto it = incoming_by_credential_.find(ev.in->credential);
        if (it != incoming_by_credential_.end() && it->second == ev.in)
          incoming_by_credential_.erase(it);
      }
      incoming_.erase(ev.in);
      delete ev.in;
      {
        std::lock_guard lock(inbox_mu_);
        --live_reactors_;
      }
      return;
    case Event::Kind::kOutDone: {
      auto it = outgoing_.find(ev.out->node);
      if (it != outgoing_.end() && it->second == ev.out) outgoing_.erase(it);
      if (!ev.out->answered) {
        // Never answered (down, starting, or refusing us): wait twice as long before the next
        // attempt, up to half the liveness deadline. A rollout of a DaemonSet starts agents
        // whose parents are not up yet; a fixed interval had 200 agents dial the absent ones
        // five times a second each.
        auto& b = backoff_[ev.out->node];
        b.delay = std::min(std::max(opts_.reconnect, 2 * b.delay),
                           std::max(opts_.reconnect, opts_.aggregator.silence / 2));
      }
      if (!ev.out->status.ok() && ev.out->status.error_code() != grpc::StatusCode::CANCELLED)
        spdlog::debug("drain: stream to peer {} ended: {}", ev.out->node,
                      ev.out->status.error_message());
      delete ev.out;
      {
        std::lock_guard lock(inbox_mu_);
        --live_reactors_;
      }
      return;
    }
    case Event::Kind::kMessage:
      break;
  }
  auto parsed = from_wire(ev.message);
  const std::string from = parsed.ok() ? sender(ev.message) : std::string();
  if (ev.in) {
    InStream* s = ev.in;
    if (!incoming_.count(s) || s->refused) return;
    if (!parsed.ok()) {
      refuse(s, grpc::StatusCode::INVALID_ARGUMENT, parsed.error(), &Stats::refused_malformed,
             "malformed");
      return;
    }
    if (s->node.empty()) {
      if (!agg_.members().count(from) || from == opts_.node) {
        refuse(s, grpc::StatusCode::PERMISSION_DENIED,
               "\"" + from.substr(0, 64) + "\" is not a member of the cluster watermark",
               &Stats::refused_not_member, "not_member");
        return;
      }
      if (opts_.tls &&
          std::find(s->cert_names.begin(), s->cert_names.end(), from) == s->cert_names.end()) {
        refuse(s, grpc::StatusCode::PERMISSION_DENIED,
               "it spoke as \"" + from.substr(0, 64) + "\" but its " +
                   (opts_.verifier ? "token" : "certificate") + " names " +
                   (s->cert_names.empty() ? std::string("no node")
                                          : "\"" + s->cert_names.front().substr(0, 64) + "\""),
               &Stats::refused_identity, opts_.verifier ? "other_node" : "identity");
        return;
      }
      if (opts_.verifier) {
        // A token is taken on one live stream at a time: the same token on a second stream
        // while the first is open is someone who holds a copy (a peer it was sent to).
        if (s->credential.empty()) {
          refuse(s, grpc::StatusCode::UNAUTHENTICATED, "no token on the stream",
                 &Stats::refused_identity, "no_token");
          return;
        }
        auto [cit, fresh_cred] = incoming_by_credential_.emplace(s->credential, s);
        if (!fresh_cred && cit->second != s) {
          InStream* first = cit->second;
          if (incoming_.count(first) && !first->refused) {
            refuse(s, grpc::StatusCode::PERMISSION_DENIED,
                   "node " + from.substr(0, 64) +
                       "'s token is already in use on another open stream (from " + first->peer() +
                       ")",
                   &Stats::refused_replayed, "replayed");
            return;
          }
          cit->second = s;
        }
      }
      s->node = from;
      auto [it, fresh] = incoming_by_node_.emplace(from, s);
      if (!fresh) {
        // A newer stream from the same node (it reconnected): the older one goes.
        it->second->finish(grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "replaced"));
        it->second->node.clear();
        it->second = s;
      }
    } else if (from != s->node) {
      refuse(s, grpc::StatusCode::INVALID_ARGUMENT,
             "a stream of node " + s->node + " spoke as \"" + from.substr(0, 64) + "\"",
             &Stats::refused_renamed, "renamed");
      return;
    }
  } else {
    OutStream* s = ev.out;
    if (parsed.ok() && from == s->node) {
      s->answered = true;
      backoff_[s->node].delay = opts_.reconnect;
    }
    if (!parsed.ok() || from != s->node) {
      spdlog::warn("drain: peer {} sent {}; stream closed", s->node,
                   parsed.ok() ? "a report as \"" + from.substr(0, 64) + "\"" : parsed.error());
      s->close();
      return;
    }
  }
  {
    std::lock_guard lock(view_mu_);
    (ev.message.has_up() ? stats_.up_received : stats_.down_received)++;
    stats_.bytes_received += ev.bytes;
  }
  metrics_->messages
      ->Add({{"direction", "received"}, {"kind", ev.message.has_up() ? "up" : "down"}})
      .Increment();
  metrics_->bytes->Add({{"direction", "received"}}).Increment(static_cast<double>(ev.bytes));
  agg_.receive(parsed.value(), now);
}

void Cluster::dispatch(std::vector<Aggregator::Send> sends, SteadyClock::time_point now) {
  for (auto& s : sends) {
    bool up = std::holds_alternative<UpReport>(s.message);
    pb::PeerMessage m = to_wire(s.message);
    size_t bytes = m.ByteSizeLong();
    bool delivered = false, kept = true;
    auto in = incoming_by_node_.find(s.to);
    auto out = outgoing_.find(s.to);
    // Up reports on this agent's own stream, down reports on the child's; either on whatever
    // stream there is with that peer; else a new stream of this agent's (a probe, a child
    // that has not connected yet).
    if (!up && in != incoming_by_node_.end()) {
      kept = in->second->send(std::move(m));
      delivered = true;
    } else if (out != outgoing_.end()) {
      kept = out->second->send(std::move(m));
      delivered = true;
    } else if (in != incoming_by_node_.end()) {
      kept = in->second->send(std::move(m));
      delivered = true;
    } else {
      auto addr = addresses_.find(s.to);
      auto& b = backoff_[s.to];
      if (b.delay.count() == 0) b.delay = opts_.reconnect;
      if (addr != addresses_.end() && now - b.last >= b.delay) {
        b.last = now;
        {
          std::lock_guard lock(inbox_mu_);
          ++live_reactors_;
        }
        auto* o =
            new OutStream(this, s.to, addr->second, opts_.credentials, opts_.tls, opts_.queue);
        outgoing_[s.to] = o;
        {
          std::lock_guard lock(view_mu_);
          ++stats_.streams_opened;
        }
        kept = o->send(std::move(m));
        delivered = true;
      }
    }
    // Not delivered: the last attempt to open a stream to that peer is too recent.
    std::lock_guard lock(view_mu_);
    if (!delivered) {
      ++stats_.dropped_no_stream;
      metrics_->dropped->Add({{"reason", "no_stream"}}).Increment();
      continue;
    }
    if (!kept) {
      ++stats_.dropped_queue;
      metrics_->dropped->Add({{"reason", "queue"}}).Increment();
    }
    (up ? stats_.up_sent : stats_.down_sent)++;
    stats_.bytes_sent += bytes;
    metrics_->messages->Add({{"direction", "sent"}, {"kind", up ? "up" : "down"}}).Increment();
    metrics_->bytes->Add({{"direction", "sent"}}).Increment(static_cast<double>(bytes));
  }
}

void Cluster::sweep(SteadyClock::time_point now) {
  for (InStream* s : incoming_) {
    if (s->node.empty() && !s->refused && now - s->opened() > opts_.hello) {
      s->refused = true;
      spdlog::warn("drain: peer stream from {} refused: it named no node within {} ms", s->peer(),
                   opts_.hello.count());
      {
        std::lock_guard lock(view_mu_);
        ++stats_.refused_unnamed;
      }
      metrics_->refused->Add({{"reason", "unnamed"}}).Increment();
      s->finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                             "endpointd drain: the stream named no node in time"));
    }
  }
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    const std::string* parent = agg_.tree().parent(opts_.node);
    bool is_parent = parent && *parent == it->first;
    if (!is_parent && now - it->second->last_send > opts_.idle) {
      it->second->close();  // OnDone removes it
    }
    ++it;
  }
}

}  // namespace endpointd::drain
