// Where the spine's memory goes at 10k services / 100k endpoints: heap bytes in use (glibc
// mallinfo2) after each step from list bytes to the first snapshot, and the sizes of the
// model's per-endpoint types. Data comes from bench/gen_cluster.py.
//
//   spine_memory DIR
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "model/event.h"
#include "model/snapshot.h"
#include "pipeline/store.h"
#include "watcher/decode.h"

namespace {

using endpointd::model::Event;
using endpointd::model::ObjectKind;
using endpointd::model::Replace;
namespace model = endpointd::model;
namespace watcher = endpointd::watcher;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "spine_memory: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double heap_mib() {
  return static_cast<double>(mallinfo2().uordblks) / (1024.0 * 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: spine_memory DIR (from bench/gen_cluster.py)\n");
    return 2;
  }
  std::string dir = argv[1];
  std::printf(
      "sizeof: Service %zu, EndpointSlice %zu, Endpoint %zu, MergedEndpoint %zu, "
      "ServiceState %zu, EndpointPort %zu, ObjectRef %zu\n",
      sizeof(model::Service), sizeof(model::EndpointSlice), sizeof(model::Endpoint),
      sizeof(model::MergedEndpoint), sizeof(model::ServiceState), sizeof(model::EndpointPort),
      sizeof(model::ObjectRef));
  double base = heap_mib();
  std::printf("%-44s %8.1f MiB\n", "heap at start", base);

  double before = heap_mib();
  auto svc = watcher::decode_list(read_file(dir + "/services.json"), ObjectKind::kService);
  double svc_mib = heap_mib() - before;
  before = heap_mib();
  auto sl =
      watcher::decode_list(read_file(dir + "/endpointslices.json"), ObjectKind::kEndpointSlice);
  double sl_mib = heap_mib() - before;
  if (!svc || !sl) {
    std::fprintf(stderr, "spine_memory: the lists do not decode\n");
    return 1;
  }
  std::printf("%-44s %8.1f MiB\n", "decoded services (event objects)", svc_mib);
  std::printf("%-44s %8.1f MiB\n", "decoded endpoint slices (event objects)", sl_mib);

  before = heap_mib();
  auto store = std::make_unique<endpointd::pipeline::Store>(
      std::set<ObjectKind>{ObjectKind::kService, ObjectKind::kEndpointSlice});
  store->apply(Event{Replace{ObjectKind::kService, std::move(svc->objects)}});
  store->apply(Event{Replace{ObjectKind::kEndpointSlice, std::move(sl->objects)}});
  svc->objects = {};
  sl->objects = {};
  std::printf("%-44s %8.1f MiB\n", "store, after the event objects are freed", heap_mib() - base);

  before = heap_mib();
  auto snap = store->build(nullptr);
  std::printf("%-44s %8.1f MiB (%zu services, %zu endpoints)\n", "first snapshot",
              heap_mib() - before, snap->services.size(), snap->endpoint_count());
  std::printf("%-44s %8.1f MiB\n", "store + snapshot", heap_mib() - base);
  malloc_stats();
  return 0;
}
