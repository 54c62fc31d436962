// The worker thread and the channel between it and the loop: slow and streamed routes run here,
// one job at a time. The stream handler's Writer blocks while its client is more than
// max_pending_output behind; the loop's end of the channel (pump_worker, report_pending) takes
// the worker's bytes and says how far behind the client is.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "httpd/server_internal.h"

namespace endpointd::httpd {

// The stream handler's Writer: frames chunks into the channel, waiting while the client is
// behind by more than max_pending_output.
class Server::Impl::ChannelWriter final : public Writer {
 public:
  ChannelWriter(Server::Impl& s, bool chunked) : s_(s), chunked_(chunked) {}
  bool write(std::string_view chunk) override {
    std::unique_lock lk(s_.mu_);
    s_.cv_.wait(lk, [&] {
      return s_.cancelled_ || s_.worker_stop_ ||
             s_.out_.size() + s_.loop_pending_ <= s_.limits_.max_pending_output;
    });
    if (s_.cancelled_ || s_.worker_stop_) return false;
    if (chunk.empty()) return true;  // an empty chunk would end a chunked body
    bool was_empty = s_.out_.empty();
    if (chunked_) {
      char size[32];
      int n = std::snprintf(size, sizeof size, "%zx\r\n", chunk.size());
      s_.out_.append(size, static_cast<size_t>(n));
    }
    s_.out_.append(chunk);
    if (chunked_) s_.out_.append("\r\n");
    lk.unlock();
    // The loop takes all of out_ when woken, so a wake is needed only when it was empty.
    if (was_empty) s_.wake();
    return true;
  }

 private:
  Server::Impl& s_;
  bool chunked_;
};

void Server::Impl::wake() {
  uint64_t one = 1;
  // The eventfd never blocks (EFD_NONBLOCK) and a pending wake is as good as a new one.
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

// ---- loop thread: its end of the channel ----

// Tells a waiting stream handler how much its client is behind.
void Server::Impl::report_pending(const Conn& c) {
  bool room;
  {
    std::lock_guard lk(mu_);
    loop_pending_ = c.pending();
    room = out_.size() + loop_pending_ <= limits_.max_pending_output;
  }
  if (room) cv_.notify_all();
}

// Takes the worker's bytes for its connection, and notices when the job is done.
void Server::Impl::pump_worker(Clock::time_point now) {
  if (!worker_busy_) return;
  std::string data;
  bool finished, abort;
  {
    std::lock_guard lk(mu_);
    data.swap(out_);
    loop_pending_ += data.size();
    finished = finished_;
    abort = abort_;
  }
  if (finished) worker_busy_ = false;
  uint64_t id = job_conn_;
  if (finished) job_conn_ = 0;
  auto it = id ? conns_.find(id) : conns_.end();
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (!data.empty()) {
    if (c.pending() == 0) {
      c.out = std::move(data);
      c.out_off = 0;
      c.deadline = now + limits_.write_timeout;
      c.deadline_reason = Drop::write_timeout;
    } else {
      c.out += data;
    }
  }
  if (finished) {
    c.state = State::writing;
    if (abort) c.close_after = true;
    if (c.pending() > 0) {
      c.deadline = std::min(c.deadline, now + limits_.write_timeout);
      c.deadline_reason = Drop::write_timeout;
    }
  }
  if (!flush(id, c, now)) return;
  if (!finish_if_sent(id, c, now)) return;
  if (c.state == State::reading) advance(id, c, now);
}

// ---- worker thread ----

void Server::Impl::worker_main() {
  std::unique_lock lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return worker_stop_ || job_.has_value(); });
    if (worker_stop_) return;
    Job job = std::move(*job_);
    job_.reset();
    lk.unlock();
    run_job(job);
    lk.lock();
  }
}

void Server::Impl::run_job(Job& job) {
  const Route& route = *job.route;
  bool abort = false;
  if (route.kind == Route::Kind::worker) {
    Response r;
    try {
      r = route.handler(job.request);
    } catch (const std::exception& e) {
      spdlog::error("{}: handler for {} threw: {}", name_, job.request.path, e.what());
      r = text(500, "internal error\n");
    }
    std::string bytes = serialize(r, job.head_only, job.close);
    std::lock_guard lk(mu_);
    out_ += bytes;
  } else {
    {
      std::lock_guard lk(mu_);
      out_ += response_head(200, route.content_type, std::nullopt, job.chunked, job.close, {});
    }
    wake();
    ChannelWriter w(*this, job.chunked);
    try {
      route.stream(job.request, w);
    } catch (const std::exception& e) {
      spdlog::error("{}: stream handler for {} threw: {}", name_, job.request.path, e.what());
      abort = true;
    }
    if (job.chunked && !abort) {
      std::lock_guard lk(mu_);
      out_ += "0\r\n\r\n";
    }
  }
  {
    std::lock_guard lk(mu_);
    finished_ = true;
    abort_ = abort;
  }
  wake();
}

}  // namespace endpointd::httpd
