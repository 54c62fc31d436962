// The client over HTTPS with a kubeconfig: a test CA, a server certificate and a client
// certificate made here with the openssl CLI; the server requires the client certificate.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/fakeapi/fake_api.h"
#include "tests/support/test_certs.h"
#include "tests/watcher/kube_test_util.h"
#include "watcher/kube_client.h"

namespace endpointd::watcher {
namespace {

using kubetest::Recorder;
using kubetest::TempDir;
using kubetest::wait_until;
using model::ObjectKind;
using namespace std::chrono_literals;

class KubeTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string err = endpointd::testing::make_test_certs(dir_.path().string());
    ASSERT_EQ(err, "");
    fakeapi::Options opts;
    opts.tls =
        fakeapi::TlsOptions{dir_.file("server.crt"), dir_.file("server.key"), dir_.file("ca.crt")};
    server_ = std::make_unique<fakeapi::FakeApiServer>(opts);
    ASSERT_TRUE(server_->ok()) << server_->error();
    server_->apply(kubetest::service_json("a"));
  }

  std::string kubeconfig(bool with_client_cert) {
    std::string user = "  user:\n    token: abc\n";
    if (with_client_cert) {
      // One as a relative file path, one as data: both ways are exercised.
      user += "    client-certificate: client.crt\n    client-key-data: " +
              endpointd::testing::slurp_file(dir_.file("client-key.b64")) + "\n";
    }
    return "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
           "clusters:\n- name: c\n  cluster:\n    server: " +
           server_->url() + "\n    certificate-authority-data: " +
           endpointd::testing::slurp_file(dir_.file("ca.b64")) +
           "\ncontexts:\n- name: test\n  context:\n    cluster: c\n    user: u\n"
           "users:\n- name: u\n" +
           user;
  }

  KubeClientConfig config() {
    KubeClientConfig c;
    c.watch_endpoint_slices = false;
    c.watch_nodes = false;
    c.backoff_initial = 5ms;
    c.backoff_max = 50ms;
    return c;
  }

  TempDir dir_;
  std::unique_ptr<fakeapi::FakeApiServer> server_;
  prometheus::Registry registry_;
  Recorder recorder_;
};

TEST_F(KubeTlsTest, KubeconfigWithClientCertificateSyncsOverHttps) {
  auto cluster = from_kubeconfig(dir_.write("config", kubeconfig(true)));
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  KubeClient client(*cluster, config(), recorder_.sink(), registry_);
  client.start();
  ASSERT_TRUE(wait_until([&] { return client.synced(); }));
  EXPECT_TRUE(recorder_.has("Service:default/a"));
  server_->apply(kubetest::service_json("b"));
  ASSERT_TRUE(wait_until([&] { return recorder_.has("Service:default/b"); }));
  auto reqs = server_->requests();
  ASSERT_FALSE(reqs.empty());
  EXPECT_EQ(reqs.front().header("authorization"), "Bearer abc");
  client.stop();
}

TEST_F(KubeTlsTest, WithoutClientCertificateTheHandshakeFailsAndIsRetried) {
  auto cluster = from_kubeconfig(dir_.write("config", kubeconfig(false)));
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  KubeClient client(*cluster, config(), recorder_.sink(), registry_);
  client.start();
  ASSERT_TRUE(
      wait_until([&] { return client.stats(ObjectKind::kService).reconnects_total() >= 2; }));
  EXPECT_FALSE(client.synced());
  EXPECT_EQ(recorder_.events(), 0u);
  client.stop();
}

TEST_F(KubeTlsTest, UntrustedServerCertificateIsRefusedUnlessInsecure) {
  auto cluster = from_kubeconfig(dir_.write("config", kubeconfig(true)));
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  cluster->ca_data.clear();
  cluster->ca_file = dir_.file("client.crt");  // not the CA that signed the server
  {
    KubeClient client(*cluster, config(), recorder_.sink(), registry_);
    client.start();
    ASSERT_TRUE(
        wait_until([&] { return client.stats(ObjectKind::kService).reconnects_total() >= 2; }));
    EXPECT_FALSE(client.synced());
  }
  cluster->insecure_skip_tls_verify = true;
  KubeClient client(*cluster, config(), recorder_.sink(), registry_);
  client.start();
  ASSERT_TRUE(wait_until([&] { return client.synced(); }));
}

}  // namespace
}  // namespace endpointd::watcher
