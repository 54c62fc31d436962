// Kubeconfig and in-cluster loading, base64, and token re-reading.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/watcher/kube_test_util.h"
#include "watcher/kube_auth.h"

namespace endpointd::watcher {
namespace {

using kubetest::TempDir;
using namespace std::chrono_literals;

TEST(Base64, DecodesWithAndWithoutPadding) {
  EXPECT_EQ(*base64_decode("aGVsbG8="), "hello");
  EXPECT_EQ(*base64_decode("aGVsbG8"), "hello");
  EXPECT_EQ(*base64_decode("aGVs\nbG8h"), "hello!");
  EXPECT_EQ(*base64_decode(""), "");
  EXPECT_FALSE(base64_decode("a$bc").ok());
  EXPECT_FALSE(base64_decode("aGVsbG8=x").ok());
  EXPECT_FALSE(base64_decode("a").ok());
}

constexpr const char* kFullKubeconfig = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: dev-cluster
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority: certs/ca.crt
- name: prod-cluster
  cluster:
    server: https://prod.example:443
    certificate-authority-data: LS0tLS1CRUdJTg==
    insecure-skip-tls-verify: true
    disable-compression: true
contexts:
- name: dev
  context:
    cluster: dev-cluster
    user: dev-user
- name: prod
  context:
    cluster: prod-cluster
    user: prod-user
users:
- name: dev-user
  user:
    client-certificate: certs/client.crt
    client-key: /abs/does-not-matter-here
    tokenFile: token
- name: prod-user
  user:
    token: s3cret
    client-certificate-data: Y2VydA==
    client-key-data: a2V5
)";

TEST(Kubeconfig, ReadsCurrentContextAndResolvesRelativePaths) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "certs");
  dir.write("certs/ca.crt", "ca");
  dir.write("certs/client.crt", "cert");
  dir.write("token", "tok");
  std::string yaml = kFullKubeconfig;
  std::string key = dir.write("client.key", "key");
  yaml.replace(yaml.find("/abs/does-not-matter-here"),
               std::string("/abs/does-not-matter-here").size(), key);
  auto path = dir.write("config", yaml);

  auto cfg = from_kubeconfig(path);
  ASSERT_TRUE(cfg.ok()) << cfg.error();
  EXPECT_EQ(cfg->server, "https://10.0.0.1:6443");
  EXPECT_EQ(cfg->ca_file, dir.file("certs/ca.crt"));
  EXPECT_EQ(cfg->client_cert_file, dir.file("certs/client.crt"));
  EXPECT_EQ(cfg->client_key_file, key);
  EXPECT_EQ(cfg->token_file, dir.file("token"));
  EXPECT_FALSE(cfg->insecure_skip_tls_verify);
  EXPECT_FALSE(cfg->disable_compression);

  auto prod = from_kubeconfig(path, "prod");
  ASSERT_TRUE(prod.ok()) << prod.error();
  EXPECT_EQ(prod->server, "https://prod.example:443");
  EXPECT_EQ(prod->ca_data, "-----BEGIN");
  EXPECT_TRUE(prod->insecure_skip_tls_verify);
  EXPECT_TRUE(prod->disable_compression);
  EXPECT_EQ(prod->token, "s3cret");
  EXPECT_EQ(prod->client_cert_data, "cert");
  EXPECT_EQ(prod->client_key_data, "key");
}

struct BadCase {
  const char* name;
  std::string yaml;
  const char* must_mention;
};

TEST(Kubeconfig, ErrorsNameTheField) {
  const BadCase cases[] = {
      {"no current context", "clusters: []\ncontexts: []\nusers: []\n", "current-context"},
      {"unknown context", "current-context: x\ncontexts:\n- name: y\n  context: {cluster: c}\n",
       "no entry named 'x' in 'contexts'"},
      {"context without cluster",
       "current-context: x\ncontexts:\n- name: x\n  context: {user: u}\n",
       "contexts[name=x].context.cluster"},
      {"missing cluster", "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\n",
       "'clusters' is missing"},
      {"missing server",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {}\n",
       "clusters[name=c].cluster.server"},
      {"bad scheme",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'ftp://x'}\n",
       "must start with https://"},
      {"no host",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'https://'}\n",
       "clusters[name=c].cluster.server 'https://' names no host"},
      {"no host, a path",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'http:///api'}\n",
       "names no host"},
      {"bad base64",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'https://x', certificate-authority-data: '@@@'}\n",
       "certificate-authority-data"},
      {"missing user",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- "
       "name: c\n  cluster: {server: 'https://x'}\nusers: []\n",
       "no entry named 'u' in 'users'"},
      {"exec plugin",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- "
       "name: c\n  cluster: {server: 'https://x'}\nusers:\n- name: u\n  user: {exec: {command: "
       "foo}}\n",
       "users[name=u].user.exec"},
      {"cert without key",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- "
       "name: c\n  cluster: {server: 'https://x'}\nusers:\n- name: u\n  user: "
       "{client-certificate-data: Y2VydA==}\n",
       "client-key"},
      {"missing CA file",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'https://x', certificate-authority: nope.crt}\n",
       "certificate-authority file"},
      {"bad insecure flag",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'https://x', insecure-skip-tls-verify: maybe}\n",
       "insecure-skip-tls-verify"},
      {"bad disable-compression",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'https://x', disable-compression: often}\n",
       "disable-compression must be true or false"},
      {"proxy-url",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'https://x', proxy-url: 'http://proxy:3128'}\n",
       "clusters[name=c].cluster.proxy-url is not supported"},
      {"tls-server-name",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'https://10.0.0.1', tls-server-name: kubernetes}\n",
       "clusters[name=c].cluster.tls-server-name is not supported"},
      {"not yaml", "{{{", "invalid YAML"},
      // Found by fuzz_kubeconfig: a path the file system refuses (a name over 255 bytes) is an
      // error naming the field, not an exception out of from_kubeconfig.
      {"unusable CA path",
       "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
       "cluster: {server: 'https://x', certificate-authority: /" +
           std::string(300, 'a') + "}\n",
       "certificate-authority file"},
  };
  TempDir dir;
  for (const auto& c : cases) {
    auto path = dir.write("config", c.yaml);
    auto cfg = from_kubeconfig(path);
    ASSERT_FALSE(cfg.ok()) << c.name;
    EXPECT_NE(cfg.error().find(c.must_mention), std::string::npos) << c.name << ": " << cfg.error();
    EXPECT_NE(cfg.error().find(path), std::string::npos) << c.name << ": " << cfg.error();
  }
  auto missing = from_kubeconfig(dir.file("does-not-exist"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("cannot read"), std::string::npos);
}

class InClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    save("KUBERNETES_SERVICE_HOST");
    save("KUBERNETES_SERVICE_PORT");
  }
  void TearDown() override {
    for (const auto& [k, v] : saved_) {
      if (v) {
        setenv(k.c_str(), v->c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
  }
  void save(const std::string& k) {
    const char* v = std::getenv(k.c_str());
    saved_[k] = v ? std::optional<std::string>(v) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(InClusterTest, ReadsServiceAccountDirectory) {
  TempDir dir;
  dir.write("token", "sa-token\n");
  dir.write("ca.crt", "ca");
  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  auto cfg = in_cluster(dir.path().string());
  ASSERT_TRUE(cfg.ok()) << cfg.error();
  EXPECT_EQ(cfg->server, "https://10.96.0.1:443");
  EXPECT_EQ(cfg->token_file, dir.file("token"));
  EXPECT_EQ(cfg->ca_file, dir.file("ca.crt"));
  TokenSource tokens(*cfg);
  EXPECT_EQ(tokens.token(), "sa-token");

  setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
  cfg = in_cluster(dir.path().string());
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->server, "https://[fd00::1]:443");
}

TEST_F(InClusterTest, ErrorsNameWhatIsMissing) {
  TempDir dir;
  unsetenv("KUBERNETES_SERVICE_HOST");
  auto cfg = in_cluster(dir.path().string());
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.error().find("KUBERNETES_SERVICE_HOST"), std::string::npos);

  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  unsetenv("KUBERNETES_SERVICE_PORT");
  cfg = in_cluster(dir.path().string());
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.error().find("KUBERNETES_SERVICE_PORT"), std::string::npos);

  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  cfg = in_cluster(dir.path().string());
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.error().find("token"), std::string::npos);

  dir.write("token", "t");
  cfg = in_cluster(dir.path().string());
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.error().find("ca.crt"), std::string::npos);
}

TEST(TokenSource, RereadsTheFileAtMostOncePerIntervalUnlessForced) {
  TempDir dir;
  ClusterConfig cfg;
  cfg.token = "ignored-when-a-file-is-set";
  cfg.token_file = dir.write("token", "one\n");
  TokenSource tokens(cfg, std::chrono::hours(1));
  EXPECT_EQ(tokens.token(), "one");
  dir.write("token", "two");
  EXPECT_EQ(tokens.token(), "one");  // within the interval: cached
  EXPECT_EQ(tokens.token(/*force=*/true), "two");

  TokenSource fast(cfg, 0ms);
  EXPECT_EQ(fast.token(), "two");
  dir.write("token", "three");
  EXPECT_EQ(fast.token(), "three");

  ClusterConfig fixed;
  fixed.token = "static";
  TokenSource st(fixed);
  EXPECT_EQ(st.token(true), "static");
}

}  // namespace
}  // namespace endpointd::watcher
