// Observed removal in the coordinator (drain/late.h, CoordinatorOptions::new_flows): a
// terminating pod's address is handed to the flow watch, connections that reach it after its
// removal are named on its drain in /debug/state and counted, and make its release unconfirmed.
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <deque>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "drain/coordinator.h"
#include "tests/drain/fixture.h"

namespace endpointd::drain {
namespace {

using namespace std::chrono_literals;
using testing::Ep;
using testing::ip;
using testing::make_snapshot;
using testing::PodDef;
using Clock = std::chrono::steady_clock;

// A flow watch the test feeds.
class FakeNewFlows final : public NewFlows {
 public:
  Status watch(const std::set<model::IpAddr>& addresses) override {
    std::lock_guard lock(mu_);
    watched_ = addresses;
    return {};
  }
  std::vector<SeenFlow> take() override {
    std::lock_guard lock(mu_);
    std::vector<SeenFlow> out(queue_.begin(), queue_.end());
    queue_.clear();
    return out;
  }
  // Connections that arrive together: the coordinator takes all of them or none.
  void arrive(const std::vector<std::pair<const char*, const char*>>& flows) {
    std::lock_guard lock(mu_);
    for (const auto& [src, dst] : flows) queue_.push_back({ip(src), ip(dst), Clock::now()});
  }
  std::set<model::IpAddr> watched() const {
    std::lock_guard lock(mu_);
    return watched_;
  }

 private:
  mutable std::mutex mu_;
  std::set<model::IpAddr> watched_;
  std::deque<SeenFlow> queue_;
};

// Polls `cond` for up to 5 s.
template <typename F>
bool eventually(F cond) {
  for (int i = 0; i < 500; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return cond();
}

TEST(CoordinatorLate, ConnectionsAfterTheRemovalAreNamedOnTheDrainAndCounted) {
  pipeline::AckBoard board;
  prometheus::Registry registry;
  FakeNewFlows flows;
  CoordinatorOptions o;
  o.machine.node_name = "node-a";
  o.peer_listen = "";
  o.peer_insecure = true;
  o.registry = &registry;
  o.new_flows = &flows;
  Coordinator c(&board, nullptr, o);
  ASSERT_TRUE(c.start().ok());

  // web-1 on node-a terminates; a client pod on node-b (whose Node is not listed: no peer to
  // wait for) still opens connections to it.
  auto snap = std::const_pointer_cast<model::Snapshot>(make_snapshot(
      2, {Ep{"10.244.1.10", "node-a", false, true, true, "web-1"}},
      {PodDef{"web-1", "10.244.1.10", "node-a", true}, PodDef{"client", "10.244.2.7", "node-b"}}));
  std::erase_if(snap->nodes, [](const auto& n) { return n->name == "node-b"; });
  c.on_snapshot(snap);

  ASSERT_TRUE(eventually([&] { return flows.watched().count(ip("10.244.1.10")) > 0; }))
      << c.drains_json();
  ASSERT_TRUE(eventually([&] { return c.drains_json().find("\"removed\":") != std::string::npos; }))
      << c.drains_json();

  flows.arrive({{"10.244.2.7", "10.244.1.10"},
                {"10.244.2.7", "10.244.1.10"},
                {"192.168.77.2", "10.244.1.10"},  // node-a itself (a hostNetwork client)
                {"10.244.2.7", "10.244.1.99"}});  // nobody's drain
  std::string json;
  ASSERT_TRUE(eventually([&] {
    json = c.drains_json();
    return json.find("\"count\":2") != std::string::npos;
  })) << json;
  EXPECT_NE(json.find("\"late\":{\"before_removal\":0,\"after_removal\":{\"total\":3"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"source\":\"pod\",\"name\":\"demo/client\",\"node\":\"node-b\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"source\":\"node\",\"name\":\"node-a\""), std::string::npos) << json;
  // The release is unconfirmed: "late traffic", naming the senders, in the drain's record and
  // in the verdict the pod's prestop gets.
  ASSERT_TRUE(eventually([&] {
    json = c.drains_json();
    return json.find("\"consumer\":\"late traffic\"") != std::string::npos;
  })) << json;
  EXPECT_NE(json.find("new connections after the removal from pod demo/client on node-b "
                      "(10.244.2.7): 2, node node-a"),
            std::string::npos)
      << json;
  Verdict v = c.prestop({"demo", "web-1"}, "uid-web-1", [] { return false; });
  EXPECT_TRUE(v.release) << v.reason;
  EXPECT_NE(v.reason.find("late traffic"), std::string::npos) << v.reason;
  EXPECT_EQ(v.reason.find("confirmed: nothing"), std::string::npos) << v.reason;

  std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(text.find("endpointd_drain_late_connections_total{source=\"pod\",when=\"before_"
                      "release\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("endpointd_drain_late_connections_total{source=\"node\",when=\"before_"
                      "release\"} 1"),
            std::string::npos)
      << text;
  c.stop();
}

}  // namespace
}  // namespace endpointd::drain
