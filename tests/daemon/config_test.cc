// `endpointd run` flags and the YAML config file.
#include "daemon/config.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <fstream>

namespace endpointd::daemon {
namespace {

struct Parsed {
  Config cfg;
  std::string error;
};

Parsed parse(std::vector<std::string> args) {
  Parsed p;
  CLI::App app;
  add_run_flags(app, p.cfg);
  std::vector<const char*> argv = {"endpointd-run"};
  for (auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    p.error = e.what();
  }
  return p;
}

TEST(Config, FlagsHaveTheDocumentedDefaults) {
  auto p = parse({});
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.cfg.dataplane, "nftables");
  EXPECT_EQ(p.cfg.dns_zone, "cluster.local");
  EXPECT_TRUE(p.cfg.dns_listen.empty());
  EXPECT_TRUE(p.cfg.feed_listen.empty());
}

TEST(Config, YamlFileTakesTheFlagNamesAndFlagsWin) {
  char path[] = "/tmp/endpointd-config-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "source-dir: /srv/manifests\n"
                         "dns-listen: 127.0.0.1:5353\n"
                         "cluster-cidr: [10.244.0.0/16, fd00:244::/56]\n"
                         "dataplane: none\n";
  auto p = parse({"--config", path, "--dataplane", "nftables"});
  unlink(path);
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.cfg.source_dir, "/srv/manifests");
  EXPECT_EQ(p.cfg.dns_listen, "127.0.0.1:5353");
  EXPECT_EQ(p.cfg.cluster_cidr.size(), 2u);
  EXPECT_EQ(p.cfg.dataplane, "nftables");
}

TEST(Config, BadValuesAreNamed) {
  auto p = parse({"--dataplane", "iptables"});
  EXPECT_NE(p.error.find("--dataplane"), std::string::npos) << p.error;
  Config c;
  c.dns_listen = "5353";
  EXPECT_NE(validate(c).find("--dns-listen"), std::string::npos);
  c = Config{};
  c.cluster_cidr = {"10.0.0.0/99"};
  EXPECT_NE(validate(c).find("--cluster-cidr"), std::string::npos);
  c = Config{};
  c.source_dir = "a";
  c.kubeconfig = "b";
  EXPECT_NE(validate(c).find("exclusive"), std::string::npos);
  EXPECT_EQ(validate(Config{}), "");
}

TEST(Config, UnknownKeyInFileIsAnError) {
  char path[] = "/tmp/endpointd-config-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "dns-lisen: 127.0.0.1:53\n";
  auto p = parse({"--config", path});
  unlink(path);
  EXPECT_NE(p.error.find("dns-lisen"), std::string::npos) << p.error;
}

}  // namespace
}  // namespace endpointd::daemon
