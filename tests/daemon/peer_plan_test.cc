// The peer port on a manifest directory: off when no other node is named, an error that says
// what to pass when others are, and untouched whenever peer TLS or plaintext was chosen.
#include "daemon/peer_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace endpointd::daemon {
namespace {

Config manifest_config() {
  Config cfg;
  cfg.source_dir = "/m";
  cfg.node_name = "node-a";
  return cfg;
}

TEST(PeerPlan, NoOtherNodeNoPeerPort) {
  auto plan = plan_peers(manifest_config(), {"node-a"});
  ASSERT_TRUE(plan) << plan.error();
  EXPECT_FALSE(plan->listen);
  EXPECT_NE(plan->note.find("no peer port"), std::string::npos) << plan->note;
  plan = plan_peers(manifest_config(), {});
  ASSERT_TRUE(plan);
  EXPECT_FALSE(plan->listen);
}

TEST(PeerPlan, OtherNodesGetAnErrorSayingWhatToPass) {
  auto plan = plan_peers(manifest_config(), {"node-a", "node-b"});
  ASSERT_FALSE(plan);
  const std::string& e = plan.error();
  EXPECT_NE(e.find("(node-b)"), std::string::npos) << e;
  EXPECT_NE(e.find("scripts/peer-certs --dir PKI node-a node-b"), std::string::npos) << e;
  EXPECT_NE(e.find("--drain-peer-ca PKI/ca.crt --drain-peer-cert PKI/node-a.crt "
                   "--drain-peer-key PKI/node-a.key"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--drain-peer-insecure"), std::string::npos) << e;
}

TEST(PeerPlan, ManyNodesAreNamedInShort) {
  std::vector<std::string> nodes = {"node-a"};
  for (int i = 0; i < 40; ++i) nodes.push_back("n" + std::to_string(i));
  auto plan = plan_peers(manifest_config(), nodes);
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.error().find("and 35 more"), std::string::npos) << plan.error();
  EXPECT_LT(plan.error().size(), 700u);
}

TEST(PeerPlan, AChoiceAlreadyMadeIsKept) {
  Config tls = manifest_config();
  tls.drain_peer_ca = "ca.crt";
  tls.drain_peer_cert = "a.crt";
  tls.drain_peer_key = "a.key";
  Config insecure = manifest_config();
  insecure.drain_peer_insecure = true;
  Config api = manifest_config();
  api.source_dir.clear();
  api.kubeconfig = "/k";
  Config off = manifest_config();
  off.drain_peer_listen = std::nullopt;
  for (const Config* c : {&tls, &insecure, &api, &off}) {
    EXPECT_FALSE(peer_plan_needs_nodes(*c));
    auto plan = plan_peers(*c, {"node-a"});
    ASSERT_TRUE(plan);
    EXPECT_TRUE(plan->listen);
  }
}

TEST(PeerPlan, NodeNamesFromTheDirectory) {
  char tmpl[] = "/tmp/endpointd-peerplan-XXXXXX";
  std::filesystem::path dir = mkdtemp(tmpl);
  std::ofstream(dir / "n.yaml") << "kind: Node\nmetadata: {name: node-b}\n---\nkind: Node\n"
                                   "metadata: {name: node-a}\n---\nkind: Service\nmetadata: "
                                   "{name: web, namespace: demo}\nspec: {clusterIP: 10.96.0.10, "
                                   "ports: [{port: 80}]}\n";
  auto names = manifest_node_names(dir.string());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(names, (std::vector<std::string>{"node-a", "node-b"}));
}

}  // namespace
}  // namespace endpointd::daemon
