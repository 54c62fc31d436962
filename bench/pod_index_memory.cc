// What DNS's `pods verified` costs: with it the agent watches every node's pods, not only its
// own. Heap bytes in use (glibc mallinfo2) for 10,000 pods of other nodes, decoded from an API
// list as the watcher receives it, kept in the Store and the snapshot, and their names in the
// DNS zone; once with the pods as decoded, once slimmed as the watcher keeps other nodes' pods
// (labels and annotations dropped).
//
//   pod_index_memory [PODS]
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "dns/zone.h"
#include "model/event.h"
#include "pipeline/store.h"
#include "watcher/decode.h"

namespace {

namespace model = endpointd::model;
using model::ObjectKind;

double heap_mib() {
  return static_cast<double>(mallinfo2().uordblks) / (1024.0 * 1024.0);
}

// A pod as a Deployment makes it: a few labels, a few annotations, one IPv4 address.
std::string pod_list(int n) {
  std::string s =
      R"({"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[)";
  for (int i = 0; i < n; ++i) {
    std::string name = "web-7f9c6d8b4-" + std::to_string(100000 + i);
    std::string ip = "10.244." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    if (i) s += ",";
    s += R"({"metadata":{"name":")" + name + R"(","namespace":"ns)" + std::to_string(i % 50) +
         R"(","uid":"6c1a7e52-3f0b-4e7a-9a55-)" + std::to_string(100000000000 + i) +
         R"(","resourceVersion":")" + std::to_string(1000 + i) +
         R"(","labels":{"app":"web","pod-template-hash":"7f9c6d8b4","tier":"frontend"},)"
         R"("annotations":{"kubectl.kubernetes.io/restartedAt":"2026-11-20T10:00:00Z",)"
         R"("prometheus.io/scrape":"true"}},"spec":{"nodeName":"node-)" +
         std::to_string(i % 500 + 2) +
         R"(","terminationGracePeriodSeconds":30},)"
         R"("status":{"phase":"Running","podIP":")" +
         ip + R"(","podIPs":[{"ip":")" + ip + R"("}]}})";
  }
  return s + "]}";
}

struct Cost {
  double decoded = 0, store = 0, zone = 0;
};

Cost measure(int n, bool slim) {
  Cost c;
  std::string json = pod_list(n);
  double before = heap_mib();
  auto list = endpointd::watcher::decode_list(json, ObjectKind::kPod);
  if (!list || list->objects.size() != static_cast<size_t>(n)) {
    std::fprintf(stderr, "pod_index_memory: the list does not decode\n");
    std::exit(1);
  }
  if (slim)
    for (auto& o : list->objects) {
      auto& p = std::get<model::Pod>(o);
      p.labels.clear();
      p.annotations.clear();
    }
  c.decoded = heap_mib() - before;
  before = heap_mib();
  auto store = std::make_unique<endpointd::pipeline::Store>(std::set<ObjectKind>{ObjectKind::kPod});
  store->apply(model::Event{model::Replace{ObjectKind::kPod, std::move(list->objects)}});
  list->objects = {};
  auto snap = store->build(nullptr);
  c.store = heap_mib() - before;
  before = heap_mib();
  endpointd::dns::ZoneOptions o;
  o.pod_mode = endpointd::dns::PodMode::kVerified;
  endpointd::dns::ZoneBuilder b(o);
  auto z = b.apply(snap);
  c.zone = heap_mib() - before;
  if (z->name_count() < static_cast<size_t>(n)) {
    std::fprintf(stderr, "pod_index_memory: %zu names for %d pods\n", z->name_count(), n);
    std::exit(1);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 10000;
  std::printf("sizeof(model::Pod) %zu\n", sizeof(model::Pod));
  std::printf(
      "| %d pods of other nodes | decoded MiB | Store + snapshot MiB | DNS pod names MiB |\n", n);
  std::printf("|---|---|---|---|\n");
  for (bool slim : {false, true}) {
    Cost c = measure(n, slim);
    std::printf("| %s | %.1f | %.1f | %.1f |\n",
                slim ? "slimmed (as kept)" : "as decoded (labels, annotations)", c.decoded, c.store,
                c.zone);
  }
  return 0;
}
