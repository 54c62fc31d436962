// The spine at 10k services / 100k endpoints: decoding the initial lists into the first
// snapshot, and one endpoint change from watch-event bytes to a published snapshot, with and
// without the update loop's thread hop. Data comes from bench/gen_cluster.py.
//
//   spine_bench --data=DIR [google benchmark flags]     (or ENDPOINTD_BENCH_DATA=DIR)
#include <benchmark/benchmark.h>
#include <prometheus/registry.h>
#include <simdjson.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "model/event.h"
#include "model/snapshot.h"
#include "pipeline/store.h"
#include "pipeline/update_loop.h"
#include "tests/fakeapi/protobuf_encode.h"
#include "watcher/decode.h"
#include "watcher/kube_watch.h"

namespace {

using endpointd::model::Event;
using endpointd::model::ObjectKind;
using endpointd::model::Replace;
using endpointd::model::Snapshot;
using endpointd::model::SnapshotPtr;
using endpointd::model::Upsert;
using endpointd::pipeline::Store;
using endpointd::pipeline::UpdateLoop;
namespace watcher = endpointd::watcher;
using Clock = std::chrono::steady_clock;

std::string g_data_dir;

struct Data {
  std::string services;
  std::string slices;
  std::vector<std::string> events;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "spine_bench: cannot read %s (run bench/gen_cluster.py first)\n",
                 path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Data& data() {
  static const Data d = [] {
    Data x;
    x.services = read_file(g_data_dir + "/services.json");
    x.slices = read_file(g_data_dir + "/endpointslices.json");
    std::istringstream lines(read_file(g_data_dir + "/events.jsonl"));
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) x.events.push_back(std::move(line));
    return x;
  }();
  return d;
}

// CPU time of this thread, and the process's involuntary context switches: with them, a slow
// sample is told apart as work done or time spent preempted by other processes.
double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}
long involuntary_switches() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_nivcsw;
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Nearest-rank percentile of unsorted samples.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

void report(benchmark::State& state, const std::string& prefix, const std::vector<double>& us) {
  double sum = 0;
  for (double x : us) sum += x;
  state.counters[prefix + "p50_us"] = percentile(us, 0.50);
  state.counters[prefix + "p90_us"] = percentile(us, 0.90);
  state.counters[prefix + "p99_us"] = percentile(us, 0.99);
  state.counters[prefix + "max_us"] = us.empty() ? 0 : *std::max_element(us.begin(), us.end());
  state.counters[prefix + "mean_us"] = us.empty() ? 0 : sum / static_cast<double>(us.size());
}

// The decoded initial lists, as the Kubernetes client hands them to the update loop.
struct Lists {
  Replace services{ObjectKind::kService, {}};
  Replace slices{ObjectKind::kEndpointSlice, {}};
};

Lists decode_lists(benchmark::State& state) {
  Lists l;
  auto svc = watcher::decode_list(data().services, ObjectKind::kService);
  auto sl = watcher::decode_list(data().slices, ObjectKind::kEndpointSlice);
  if (!svc || !sl || !svc->errors.empty() || !sl->errors.empty()) {
    state.SkipWithError("the generated lists do not decode cleanly");
    return l;
  }
  l.services.objects = std::move(svc->objects);
  l.slices.objects = std::move(sl->objects);
  return l;
}

size_t expected_endpoints() {
  static const size_t n = [] {
    Store s({ObjectKind::kService, ObjectKind::kEndpointSlice});
    auto svc = watcher::decode_list(data().services, ObjectKind::kService);
    auto sl = watcher::decode_list(data().slices, ObjectKind::kEndpointSlice);
    s.apply(Event{Replace{ObjectKind::kService, std::move(svc->objects)}});
    s.apply(Event{Replace{ObjectKind::kEndpointSlice, std::move(sl->objects)}});
    return s.build(nullptr)->endpoint_count();
  }();
  return n;
}

// The EndpointSliceList in protobuf, as the API server answers a client that asks for it (the
// fake API server's encoder): one page of every slice, as data().slices is one JSON page.
const std::string& slices_protobuf() {
  static const std::string page = [] {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    simdjson::dom::array items;
    if (parser.parse(data().slices).get(root) || root["items"].get_array().get(items)) {
      std::fprintf(stderr, "spine_bench: the slices list is not JSON\n");
      std::exit(2);
    }
    std::vector<std::string> encoded;
    for (simdjson::dom::element item : items) {
      auto pb = endpointd::fakeapi::endpoint_slice_protobuf(simdjson::minify(item));
      if (!pb) {
        std::fprintf(stderr, "spine_bench: a slice has no protobuf form\n");
        std::exit(2);
      }
      encoded.push_back(std::move(*pb));
    }
    std::vector<std::string_view> views(encoded.begin(), encoded.end());
    return endpointd::fakeapi::protobuf_list_page("discovery.k8s.io/v1", "EndpointSliceList", 1, "",
                                                  views);
  }();
  return page;
}

// The EndpointSliceList decoded, from JSON (arg 0) or protobuf (arg 1): what the agent's list
// decoder does with the largest list at start, without the transfer.
void BM_DecodeSlices(benchmark::State& state) {
  const bool protobuf = state.range(0) == 1;
  const std::string& bytes = protobuf ? slices_protobuf() : data().slices;
  size_t objects = 0;
  for (auto _ : state) {
    auto l = protobuf ? watcher::decode_list_protobuf(bytes, ObjectKind::kEndpointSlice)
                      : watcher::decode_list(bytes, ObjectKind::kEndpointSlice);
    if (!l || !l->errors.empty()) {
      state.SkipWithError("the slices do not decode cleanly");
      return;
    }
    objects = l->objects.size();
    benchmark::DoNotOptimize(l);
  }
  state.SetLabel(protobuf ? "protobuf" : "json");
  state.counters["bytes_MiB"] = static_cast<double>(bytes.size()) / (1024.0 * 1024.0);
  state.counters["slices"] = static_cast<double>(objects);
}

// (a) ServiceList + EndpointSliceList bytes → decoded → Store → first snapshot.
void BM_InitialLoad(benchmark::State& state) {
  const Data& d = data();
  double decode_ms = 0, apply_ms = 0, build_ms = 0;
  size_t services = 0, endpoints = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    Lists l = decode_lists(state);
    auto t1 = Clock::now();
    auto store = std::make_unique<Store>(
        std::set<ObjectKind>{ObjectKind::kService, ObjectKind::kEndpointSlice});
    store->apply(Event{std::move(l.services)});
    store->apply(Event{std::move(l.slices)});
    auto t2 = Clock::now();
    SnapshotPtr snap = store->build(nullptr);
    auto t3 = Clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t3 - t0).count());
    decode_ms += ms_between(t0, t1);
    apply_ms += ms_between(t1, t2);
    build_ms += ms_between(t2, t3);
    services = snap->services.size();
    endpoints = snap->endpoint_count();
    if (!snap->synced) state.SkipWithError("first snapshot is not synced");
    // store and snap are destroyed here, outside the measured time.
  }
  auto n = static_cast<double>(state.iterations());
  state.counters["decode_ms"] = decode_ms / n;
  state.counters["apply_ms"] = apply_ms / n;
  state.counters["build_ms"] = build_ms / n;
  state.counters["services"] = static_cast<double>(services);
  state.counters["endpoints"] = static_cast<double>(endpoints);
  state.counters["input_MiB"] =
      static_cast<double>(d.services.size() + d.slices.size()) / (1024.0 * 1024.0);
}

// (b) One endpoint change through the update loop: watch-event line → parse_watch_event →
// post → the loop applies and builds → published snapshot seen by wait_for. One iteration is
// one change; every sample is kept and reported as percentiles. Argument: an idle gap (µs)
// before each change; 0 is back to back, so a change also waits for the loop to finish the
// previous one's tail (metrics, releasing the old snapshot); a gap measures an isolated change.
void BM_OneChange_UpdateLoop(benchmark::State& state) {
  const Data& d = data();
  prometheus::Registry registry;  // the daemon runs the loop with metrics on
  UpdateLoop::Options opts;
  opts.registry = &registry;
  UpdateLoop loop(opts);
  // When the loop thread published: observers run on the loop thread right after the waiters
  // are notified. Splits each change into post → published (loop wake-up, apply, build) and
  // published → seen by the waiting thread (its wake-up).
  std::atomic<int64_t> published_at{0};
  std::atomic<uint64_t> published_gen{0};
  // The loop thread's CPU time at each publish: between two publishes it is what the loop
  // spent on a change (and on the previous one's tail), so a slow sample whose loop CPU is
  // small was waiting for a CPU, not working.
  std::atomic<double> loop_cpu_at{0};
  loop.on_publish([&](const SnapshotPtr& s) {
    loop_cpu_at.store(thread_cpu_us(), std::memory_order_relaxed);
    published_at.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    published_gen.store(s->generation, std::memory_order_release);
  });
  loop.start();
  {
    Lists l = decode_lists(state);
    loop.post(Event{std::move(l.services)});
    loop.post(Event{std::move(l.slices)});
  }
  const size_t want = expected_endpoints();
  if (!loop.wait_for([&](const Snapshot& s) { return s.synced && s.endpoint_count() == want; },
                     std::chrono::seconds(120))) {
    state.SkipWithError("the initial state was never published");
    return;
  }
  simdjson::dom::parser parser;
  size_t next = 0;
  auto change = [&](double* decode_us, bool* preempted, double* to_publish_us, double* to_seen_us,
                    double* loop_cpu_us) -> double {
    const std::string& line = d.events[next++ % d.events.size()];
    uint64_t g = loop.current()->generation;
    double loop_cpu0 = loop_cpu_at.load(std::memory_order_relaxed);
    long sw0 = involuntary_switches();
    auto t0 = Clock::now();
    auto ev = watcher::parse_watch_event(line, ObjectKind::kEndpointSlice, parser);
    if (!ev || !ev->object) return -1;
    auto t1 = Clock::now();
    loop.post(Event{Upsert{std::move(*ev->object)}});
    auto snap =
        loop.wait_for([g](const Snapshot& s) { return s.generation > g; }, std::chrono::seconds(5));
    auto t2 = Clock::now();
    if (!snap) return -1;
    if (decode_us) *decode_us = us_between(t0, t1);
    if (preempted) *preempted = involuntary_switches() != sw0;
    // The waiter can run before the observer has: wait for it (outside the measured time).
    while (published_gen.load(std::memory_order_acquire) < snap->generation)
      std::this_thread::yield();
    Clock::time_point pub{Clock::duration(published_at.load(std::memory_order_relaxed))};
    if (to_publish_us) *to_publish_us = us_between(t1, pub);
    if (to_seen_us) *to_seen_us = us_between(pub, t2);
    if (loop_cpu_us) *loop_cpu_us = loop_cpu_at.load(std::memory_order_relaxed) - loop_cpu0;
    return us_between(t0, t2);
  };
  for (int i = 0; i < 200; ++i)  // warm-up: caches, allocator, the loop thread's first wakeups
    if (change(nullptr, nullptr, nullptr, nullptr, nullptr) < 0) {
      state.SkipWithError("a change was not published within 5 s");
      return;
    }
  const auto gap = std::chrono::microseconds(state.range(0));
  std::vector<double> total, decode, quiet, to_publish, to_seen, loop_cpu;
  total.reserve(static_cast<size_t>(state.max_iterations));
  decode.reserve(static_cast<size_t>(state.max_iterations));
  for (auto _ : state) {
    if (gap.count() > 0) std::this_thread::sleep_for(gap);  // the loop finishes and goes idle
    double dec = 0, tp = 0, ts = 0, lc = 0;
    bool preempted = false;
    double us = change(&dec, &preempted, &tp, &ts, &lc);
    if (us < 0) {
      state.SkipWithError("a change was not published within 5 s");
      break;
    }
    state.SetIterationTime(us / 1e6);
    total.push_back(us);
    decode.push_back(dec);
    to_publish.push_back(tp);
    to_seen.push_back(ts);
    loop_cpu.push_back(lc);
    if (!preempted) quiet.push_back(us);
  }
  report(state, "", total);
  report(state, "decode_", decode);
  report(state, "unpreempted_", quiet);
  report(state, "post_to_publish_", to_publish);
  report(state, "publish_to_seen_", to_seen);
  report(state, "loop_cpu_", loop_cpu);
  state.counters["changes"] = static_cast<double>(total.size());
  state.counters["preempted_changes"] = static_cast<double>(total.size() - quiet.size());
  state.counters["endpoints"] = static_cast<double>(loop.current()->endpoint_count());
  loop.stop();
}

// Writes a buffer larger than the last-level cache: what the caches look like when a change
// arrives after other work on the node (events are sparse; pods and other daemons run between).
void evict_caches() {
  static std::vector<char> junk(64u << 20);
  static char round = 0;
  ++round;
  for (size_t i = 0; i < junk.size(); i += 64) junk[i] = round;
  benchmark::DoNotOptimize(junk.data());
  benchmark::ClobberMemory();
}

// The same change without the thread hop: decode, Store::apply, Store::build on this thread.
// Argument: evict the caches before each change (outside the measured time), or not.
void BM_OneChange_StoreOnly(benchmark::State& state) {
  const Data& d = data();
  const bool cold = state.range(0) != 0;
  Store store({ObjectKind::kService, ObjectKind::kEndpointSlice});
  {
    Lists l = decode_lists(state);
    store.apply(Event{std::move(l.services)});
    store.apply(Event{std::move(l.slices)});
  }
  SnapshotPtr prev = store.build(nullptr);
  simdjson::dom::parser parser;
  size_t next = 0;
  std::vector<double> total, decode, apply, build, cpu, quiet;
  bool failed = false;
  auto change = [&](bool keep) {
    const std::string& line = d.events[next++ % d.events.size()];
    long sw0 = involuntary_switches();
    double c0 = thread_cpu_us();
    auto t0 = Clock::now();
    auto ev = watcher::parse_watch_event(line, ObjectKind::kEndpointSlice, parser);
    if (!ev || !ev->object) {
      failed = true;
      return 0.0;
    }
    auto t1 = Clock::now();
    store.apply(Event{Upsert{std::move(*ev->object)}});
    auto t2 = Clock::now();
    SnapshotPtr snap = store.build(prev);
    auto t3 = Clock::now();
    double c = thread_cpu_us() - c0;
    bool preempted = involuntary_switches() != sw0;
    if (snap == prev) failed = true;  // every generated event is a real change
    prev.swap(snap);                  // the old snapshot is released outside the timing
    if (keep) {
      total.push_back(us_between(t0, t3));
      decode.push_back(us_between(t0, t1));
      apply.push_back(us_between(t1, t2));
      build.push_back(us_between(t2, t3));
      cpu.push_back(c);
      if (!preempted) quiet.push_back(us_between(t0, t3));
    }
    return us_between(t0, t3);
  };
  for (int i = 0; i < 200; ++i) change(false);
  for (auto _ : state) {
    if (cold) evict_caches();
    double us = change(true);
    if (failed) {
      state.SkipWithError("an event did not decode or did not change the snapshot");
      break;
    }
    state.SetIterationTime(us / 1e6);
  }
  report(state, "", total);
  report(state, "decode_", decode);
  report(state, "apply_", apply);
  report(state, "build_", build);
  report(state, "cpu_", cpu);
  report(state, "unpreempted_", quiet);
  state.counters["changes"] = static_cast<double>(total.size());
  state.counters["preempted_changes"] = static_cast<double>(total.size() - quiet.size());
}

}  // namespace

BENCHMARK(BM_InitialLoad)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(5);
BENCHMARK(BM_DecodeSlices)
    ->ArgName("protobuf")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK(BM_OneChange_UpdateLoop)
    ->ArgName("gap_us")
    ->Arg(0)
    ->Arg(2000)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Iterations(4000);
BENCHMARK(BM_OneChange_StoreOnly)
    ->ArgName("cold_cache")
    ->Arg(0)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Iterations(4000);
BENCHMARK(BM_OneChange_StoreOnly)
    ->ArgName("cold_cache")
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Iterations(1000);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (const char* env = std::getenv("ENDPOINTD_BENCH_DATA")) g_data_dir = env;
  for (int i = 1; i < argc; ++i) {
    std::string_view a(argv[i]);
    if (a.starts_with("--data=")) {
      g_data_dir = std::string(a.substr(7));
    } else {
      std::fprintf(stderr, "spine_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (g_data_dir.empty()) {
    std::fprintf(
        stderr,
        "usage: spine_bench --data=DIR [benchmark flags] (DIR from bench/gen_cluster.py)\n");
    return 2;
  }
  benchmark::AddCustomContext("data_dir", g_data_dir);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
