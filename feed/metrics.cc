// The feed's metrics.
#include "feed/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

namespace endpointd::feed {

namespace {
const char* kApiNames[] = {"watch", "ads", "delta_ads"};
const char* kRejectNames[] = {"too_many_streams", "invalid_subscribe", "invalid_ack",
                              "unknown_type",     "stale_nonce",       "bad_resource_name",
                              "malformed",        "stream_limit"};
const char* kLapseNames[] = {"disconnected", "unacknowledged", "nacking"};
const char* kForgetNames[] = {"expired", "limit"};
const char* kStateLoadNames[] = {"unreadable", "too_large", "malformed"};
const char* kStateWriteNames[] = {"open", "write", "rename"};
int idx(Metrics::Api a) {
  return static_cast<int>(a);
}
void bump(std::atomic<uint64_t>& c) {
  c.fetch_add(1, std::memory_order_relaxed);
}
uint64_t read(const std::atomic<uint64_t>& c) {
  return c.load(std::memory_order_relaxed);
}
}  // namespace

Metrics::Metrics(prometheus::Registry* r) {
  if (!r) return;
  auto& streams = prometheus::BuildGauge()
                      .Name("endpointd_feed_streams")
                      .Help("Open feed streams, by API")
                      .Register(*r);
  auto& updates = prometheus::BuildCounter()
                      .Name("endpointd_feed_updates_sent_total")
                      .Help("Responses sent to feed subscribers, by API")
                      .Register(*r);
  auto& acks = prometheus::BuildCounter()
                   .Name("endpointd_feed_acks_total")
                   .Help("Acknowledgements received from feed subscribers, by API")
                   .Register(*r);
  auto& nacks = prometheus::BuildCounter()
                    .Name("endpointd_feed_nacks_total")
                    .Help("xDS responses a client rejected (NACK), by API")
                    .Register(*r);
  for (int i = 0; i < kApis; ++i) {
    streams_[i] = &streams.Add({{"api", kApiNames[i]}});
    updates_[i] = &updates.Add({{"api", kApiNames[i]}});
    acks_[i] = &acks.Add({{"api", kApiNames[i]}});
    nacks_[i] = &nacks.Add({{"api", kApiNames[i]}});
  }
  auto& rejected = prometheus::BuildCounter()
                       .Name("endpointd_feed_rejected_total")
                       .Help("Streams refused and requests ignored by the feed, by reason")
                       .Register(*r);
  for (int i = 0; i < kRejects; ++i) rejected_[i] = &rejected.Add({{"reason", kRejectNames[i]}});
  coalesced_ = &prometheus::BuildCounter()
                    .Name("endpointd_feed_coalesced_total")
                    .Help("Snapshots a slow subscriber skipped: it was sent a newer state instead")
                    .Register(*r)
                    .Add({});
  applied_ = &prometheus::BuildGauge()
                  .Name("endpointd_feed_applied_generation")
                  .Help("The newest generation every live feed subscriber acknowledged")
                  .Register(*r)
                  .Add({});
  stale_total_ = &prometheus::BuildCounter()
                      .Name("endpointd_feed_stale_subscribers_total")
                      .Help(
                          "Connected feed streams that left a response unacknowledged past their "
                          "grace and stopped holding back the applied generation")
                      .Register(*r)
                      .Add({});
  stale_now_ = &prometheus::BuildGauge()
                    .Name("endpointd_feed_subscribers_stale")
                    .Help("Connected feed streams that no longer hold the applied generation")
                    .Register(*r)
                    .Add({});
  auto& lapsed = prometheus::BuildCounter()
                     .Name("endpointd_feed_subscribers_lapsed_total")
                     .Help(
                         "Feed subscribers (streams or the ghosts of named ones) that stopped "
                         "holding back the applied generation after their grace, by reason")
                     .Register(*r);
  for (int i = 0; i < kLapses; ++i) lapsed_[i] = &lapsed.Add({{"reason", kLapseNames[i]}});
  auto& forgotten = prometheus::BuildCounter()
                        .Name("endpointd_feed_ghosts_forgotten_total")
                        .Help(
                            "Ghosts of named feed subscribers forgotten: expired (10 minutes "
                            "after they lapsed) or limit (too many ghosts)")
                        .Register(*r);
  for (int i = 0; i < kForgets; ++i) forgotten_[i] = &forgotten.Add({{"reason", kForgetNames[i]}});
  remembered_ = &prometheus::BuildCounter()
                     .Name("endpointd_feed_subscribers_remembered_total")
                     .Help(
                         "Named feed subscribers loaded from the state file (--feed-state-file) "
                         "at start: each holds the applied generation until it comes back or its "
                         "grace passes")
                     .Register(*r)
                     .Add({});
  auto& load = prometheus::BuildCounter()
                   .Name("endpointd_feed_state_load_errors_total")
                   .Help("Feed subscriber state files not loaded (start empty), by reason")
                   .Register(*r);
  for (int i = 0; i < kStateLoads; ++i)
    state_load_[i] = &load.Add({{"reason", kStateLoadNames[i]}});
  auto& write = prometheus::BuildCounter()
                    .Name("endpointd_feed_state_write_errors_total")
                    .Help("Feed subscriber state file writes that failed, by reason")
                    .Register(*r);
  for (int i = 0; i < kStateWrites; ++i)
    state_write_[i] = &write.Add({{"reason", kStateWriteNames[i]}});
  ghosts_holding_ = &prometheus::BuildGauge()
                         .Name("endpointd_feed_ghosts_holding")
                         .Help(
                             "Named feed subscribers gone within their grace: their last "
                             "acknowledged state still holds the applied generation")
                         .Register(*r)
                         .Add({});
  holdouts_ = &prometheus::BuildGauge()
                   .Name("endpointd_feed_holdouts")
                   .Help(
                       "Feed subscribers that no longer hold the applied generation but may "
                       "still route by their last acknowledged state (on the acknowledgement "
                       "board)")
                   .Register(*r)
                   .Add({});
}

void Metrics::stream_opened(Api a) {
  if (streams_[idx(a)]) streams_[idx(a)]->Increment();
}
void Metrics::stream_closed(Api a) {
  if (streams_[idx(a)]) streams_[idx(a)]->Decrement();
}
void Metrics::update_sent(Api a) {
  if (updates_[idx(a)]) updates_[idx(a)]->Increment();
}
void Metrics::ack(Api a) {
  if (acks_[idx(a)]) acks_[idx(a)]->Increment();
}
void Metrics::nack(Api a) {
  bump(nack_count_);
  if (nacks_[idx(a)]) nacks_[idx(a)]->Increment();
}
void Metrics::coalesced() {
  bump(coalesced_count_);
  if (coalesced_) coalesced_->Increment();
}
void Metrics::rejected(Reject r) {
  const int i = static_cast<int>(r);
  bump(reject_counts_[i]);
  if (rejected_[i]) rejected_[i]->Increment();
}
void Metrics::applied(uint64_t g) {
  if (applied_) applied_->Set(static_cast<double>(g));
}
void Metrics::stale_entered(bool lapse) {
  if (lapse) {
    bump(stale_total_count_);
    if (stale_total_) stale_total_->Increment();
  }
  stale_now_count_.fetch_add(1, std::memory_order_relaxed);
  if (stale_now_) stale_now_->Increment();
}
void Metrics::lapsed(Lapse why) {
  const int i = static_cast<int>(why);
  bump(lapsed_counts_[i]);
  if (lapsed_[i]) lapsed_[i]->Increment();
}
void Metrics::forgotten(Forget why) {
  const int i = static_cast<int>(why);
  bump(forgotten_counts_[i]);
  if (forgotten_[i]) forgotten_[i]->Increment();
}
void Metrics::remembered(size_t n) {
  remembered_count_.fetch_add(n, std::memory_order_relaxed);
  if (remembered_) remembered_->Increment(static_cast<double>(n));
}
void Metrics::state_load_error(StateLoad why) {
  const int i = static_cast<int>(why);
  bump(state_load_counts_[i]);
  if (state_load_[i]) state_load_[i]->Increment();
}
void Metrics::state_write_error(StateWrite why) {
  const int i = static_cast<int>(why);
  bump(state_write_counts_[i]);
  if (state_write_[i]) state_write_[i]->Increment();
}
void Metrics::ghosts_holding(size_t n) {
  ghosts_holding_now_.store(static_cast<int64_t>(n), std::memory_order_relaxed);
  if (ghosts_holding_) ghosts_holding_->Set(static_cast<double>(n));
}
void Metrics::holdouts(size_t n) {
  holdouts_now_.store(static_cast<int64_t>(n), std::memory_order_relaxed);
  if (holdouts_) holdouts_->Set(static_cast<double>(n));
}
void Metrics::stale_left() {
  stale_now_count_.fetch_sub(1, std::memory_order_relaxed);
  if (stale_now_) stale_now_->Decrement();
}
uint64_t Metrics::count(Reject r) const {
  return read(reject_counts_[static_cast<int>(r)]);
}
uint64_t Metrics::nacks() const {
  return read(nack_count_);
}
uint64_t Metrics::coalesced_count() const {
  return read(coalesced_count_);
}
uint64_t Metrics::stale_total() const {
  return read(stale_total_count_);
}
int64_t Metrics::stale_now() const {
  return stale_now_count_.load(std::memory_order_relaxed);
}
uint64_t Metrics::lapsed_total(Lapse why) const {
  return read(lapsed_counts_[static_cast<int>(why)]);
}
uint64_t Metrics::forgotten_total(Forget why) const {
  return read(forgotten_counts_[static_cast<int>(why)]);
}
int64_t Metrics::ghosts_holding_now() const {
  return ghosts_holding_now_.load(std::memory_order_relaxed);
}
uint64_t Metrics::remembered_total() const {
  return read(remembered_count_);
}
uint64_t Metrics::state_load_errors(StateLoad why) const {
  return read(state_load_counts_[static_cast<int>(why)]);
}
uint64_t Metrics::state_write_errors(StateWrite why) const {
  return read(state_write_counts_[static_cast<int>(why)]);
}
int64_t Metrics::holdouts_now() const {
  return holdouts_now_.load(std::memory_order_relaxed);
}

}  // namespace endpointd::feed
