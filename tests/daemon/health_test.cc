// /healthz and /livez decided from their inputs: node eligibility, a dataplane behind, a stuck
// update; kube-proxy's JSON body and Go's time format.
#include "daemon/health.h"

#include <gtest/gtest.h>

#include "model/time.h"

namespace endpointd::daemon {
namespace {

using namespace std::chrono_literals;

HealthInputs base() {
  HealthInputs in;
  in.now = *model::parse_rfc3339("2026-11-25T21:00:00.5Z");
  in.last_updated = *model::parse_rfc3339("2026-11-25T20:59:59Z");
  return in;
}

TEST(GoTimeString, MatchesGosTimeStringInUtc) {
  EXPECT_EQ(model::go_time_string(*model::parse_rfc3339("2026-11-25T21:00:00Z")),
            "2026-11-25 21:00:00 +0000 UTC");
  EXPECT_EQ(model::go_time_string(*model::parse_rfc3339("2026-11-25T21:00:00.25Z")),
            "2026-11-25 21:00:00.25 +0000 UTC");
  EXPECT_EQ(model::go_time_string(*model::parse_rfc3339("2026-11-25T23:00:00+02:00")),
            "2026-11-25 21:00:00 +0000 UTC");
  EXPECT_FALSE(model::parse_rfc3339("2026-13-01T00:00:00Z"));
  EXPECT_FALSE(model::parse_rfc3339("yesterday"));
  // Years the nanosecond clock cannot hold are refused, not overflowed (found by fuzz_decode,
  // a slice's trigger-time annotation).
  EXPECT_FALSE(model::parse_rfc3339("1013-11-27T10:00:00Z"));
  EXPECT_FALSE(model::parse_rfc3339("9999-01-01T00:00:00Z"));
  EXPECT_TRUE(model::parse_rfc3339("1970-01-01T00:00:00Z"));
  EXPECT_TRUE(model::parse_rfc3339("2261-12-31T23:59:59Z"));
}

TEST(GoDuration, AsKubernetesConfigurationWritesThem) {
  EXPECT_EQ(model::parse_go_duration("24h0m0s"), std::chrono::hours(24));
  EXPECT_EQ(model::parse_go_duration("1h30m"), std::chrono::minutes(90));
  EXPECT_EQ(model::parse_go_duration("1.5s"), std::chrono::seconds(1));
  EXPECT_EQ(model::parse_go_duration("300"), std::chrono::seconds(300));
  EXPECT_EQ(model::parse_go_duration("0s"), std::chrono::seconds(0));
  for (const char* bad : {"", "1 day", "5x", "h", "1.2.3s", "-5s", "99999999999999999h"})
    EXPECT_FALSE(model::parse_go_duration(bad)) << bad;
}

TEST(Healthz, KubeProxysBodyWhenEligible) {
  model::Node n;
  n.name = "node-a";
  HealthInputs in = base();
  in.node = &n;
  Probe p = healthz_probe(in);
  EXPECT_TRUE(p.ok);
  EXPECT_EQ(p.json,
            "{\"lastUpdated\": \"2026-11-25 20:59:59 +0000 UTC\",\"currentTime\": "
            "\"2026-11-25 21:00:00.5 +0000 UTC\", \"nodeEligible\": true}\n");
}

TEST(Healthz, FailsForANodeBeingDeletedOrMarkedByTheAutoscaler) {
  model::Node n;
  n.name = "node-a";
  n.taint_keys = {"node.kubernetes.io/unschedulable", "ToBeDeletedByClusterAutoscaler"};
  HealthInputs in = base();
  in.node = &n;
  Probe p = healthz_probe(in);
  EXPECT_FALSE(p.ok);
  EXPECT_NE(p.json.find("\"nodeEligible\": false"), std::string::npos);
  EXPECT_NE(p.detail.find("ToBeDeletedByClusterAutoscaler"), std::string::npos);
  n.taint_keys = {"node.kubernetes.io/unschedulable"};  // cordoned only: still eligible
  EXPECT_TRUE(healthz_probe(in).ok);
  n.deleting = true;
  p = healthz_probe(in);
  EXPECT_FALSE(p.ok);
  EXPECT_NE(p.detail.find("being deleted"), std::string::npos);
  // /livez does not care.
  EXPECT_TRUE(livez_probe(in).ok);
}

TEST(Healthz, NoNodeObjectYetIsEligibleAndADataplaneBehindFails) {
  HealthInputs in = base();
  EXPECT_TRUE(healthz_probe(in).ok);
  in.dataplane_behind = true;
  EXPECT_FALSE(healthz_probe(in).ok);
  EXPECT_FALSE(livez_probe(in).ok);
}

TEST(Livez, FailsOnceAnUpdateHasWaitedPastTheBound) {
  HealthInputs in = base();
  in.livez_timeout = 60s;
  in.waiting_in = "proxy";
  in.waited = 59s;
  Probe p = livez_probe(in);
  EXPECT_TRUE(p.ok);
  EXPECT_EQ(p.json,
            "{\"lastUpdated\": \"2026-11-25 20:59:59 +0000 UTC\",\"currentTime\": "
            "\"2026-11-25 21:00:00.5 +0000 UTC\"}\n");
  in.waited = 61s;
  p = livez_probe(in);
  EXPECT_FALSE(p.ok);
  EXPECT_NE(p.detail.find("61 s in proxy"), std::string::npos) << p.detail;
  EXPECT_NE(p.json.find("\"reason\": "), std::string::npos);
  in.last_updated = {};
  EXPECT_NE(livez_probe(in).json.find("\"lastUpdated\": \"0001-01-01 00:00:00 +0000 UTC\""),
            std::string::npos);
}

}  // namespace
}  // namespace endpointd::daemon
