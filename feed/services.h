// The gRPC services of the feed (private to feed/): endpointd.v1.UpstreamFeed and
// envoy.service.discovery.v3.AggregatedDiscoveryService, both callback-based, so a stream
// costs memory, not a thread.
#pragma once

#include <memory>
#include <string>

#include "feed/hub.h"
#include "feed/metrics.h"

namespace grpc {
class Service;
}

namespace endpointd::feed {

struct ServiceContext {
  Hub* hub;
  Metrics* metrics;
  std::string zone;  // the cluster DNS zone in xDS names
};

std::unique_ptr<grpc::Service> make_watch_service(ServiceContext ctx);
std::unique_ptr<grpc::Service> make_ads_service(ServiceContext ctx);

}  // namespace endpointd::feed
