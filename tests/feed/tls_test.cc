// The feed over TLS with client-certificate authentication, from files made here with the
// openssl CLI: a client with a certificate of the CA is served; one without a certificate,
// one with a certificate of another CA and one without TLS are refused; unreadable files are
// named in the error.
#include <gtest/gtest.h>

#include <filesystem>

#include "endpointd/v1/feed.grpc.pb.h"
#include "fixture.h"
#include "tests/support/test_certs.h"

namespace endpointd::feed {
namespace {

using endpointd::testing::make_test_certs;
using endpointd::testing::slurp_file;
using testing::service;
using testing::snapshot;

class FeedTls : public testing::FeedFixture {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "endpointd-feed-tls-XXXXXX");
    if (!mkdtemp(tmpl.data())) FAIL() << "mkdtemp";
    dir_ = tmpl;
    ASSERT_EQ(make_test_certs(dir_), "");
    other_ = dir_ + "/other";
    std::filesystem::create_directory(other_);
    ASSERT_EQ(make_test_certs(other_), "");  // a second CA the server does not trust
  }
  void TearDown() override {
    FeedFixture::TearDown();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  FeedOptions tls_options() {
    FeedOptions o;
    o.listen = "127.0.0.1:0";
    o.tls_cert_file = dir_ + "/server.crt";
    o.tls_key_file = dir_ + "/server.key";
    o.tls_client_ca_file = dir_ + "/ca.crt";
    return o;
  }
  // Subscribes to default/web over TLS with `client_dir`'s certificate (none when empty) and
  // returns the first response's version, or the status of the failed stream.
  std::pair<uint64_t, grpc::Status> watch_over_tls(const std::string& client_dir) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = slurp_file(dir_ + "/ca.crt");
    if (!client_dir.empty()) {
      ssl.pem_cert_chain = slurp_file(client_dir + "/client.crt");
      ssl.pem_private_key = slurp_file(client_dir + "/client.key");
    }
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    auto ch = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(sink_->port()),
                                        grpc::SslCredentials(ssl), args);
    return watch(ch);
  }
  std::pair<uint64_t, grpc::Status> watch(const std::shared_ptr<grpc::Channel>& ch) {
    auto stub = v1::UpstreamFeed::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub->Watch(&ctx);
    v1::WatchRequest req;
    auto* sel = req.mutable_subscribe()->add_selectors();
    sel->set_namespace_("default");
    sel->set_name("web");
    v1::WatchResponse resp;
    if (stream->Write(req) && stream->Read(&resp)) {
      ctx.TryCancel();
      stream->Finish().ok();
      return {resp.version(), grpc::Status::OK};
    }
    return {0, stream->Finish()};
  }

  std::string dir_, other_;
};

TEST_F(FeedTls, ClientCertificateOfTheCaIsServedAndOthersAreRefused) {
  start(tls_options());
  publish(snapshot(3, {service("default", "web", {{.ip = "10.0.0.1"}})}));

  auto [version, ok] = watch_over_tls(dir_);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(version, 3u);

  auto [v1, no_cert] = watch_over_tls("");
  EXPECT_EQ(v1, 0u);
  EXPECT_EQ(no_cert.error_code(), grpc::StatusCode::UNAVAILABLE) << no_cert.error_message();

  auto [v2, stranger] = watch_over_tls(other_);
  EXPECT_EQ(v2, 0u);
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::UNAVAILABLE) << stranger.error_message();

  auto [v3, plain] = watch(grpc::CreateChannel("127.0.0.1:" + std::to_string(sink_->port()),
                                               grpc::InsecureChannelCredentials()));
  EXPECT_EQ(v3, 0u);
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();

  // Still serving the good client afterwards.
  EXPECT_EQ(watch_over_tls(dir_).first, 3u);
}

TEST_F(FeedTls, UnreadableFilesAreNamed) {
  FeedOptions o = tls_options();
  o.tls_key_file = dir_ + "/no-such.key";
  FeedSink a(o, nullptr, nullptr);
  auto st = a.start();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().find("no-such.key"), std::string::npos) << st.error();

  o = tls_options();
  o.tls_client_ca_file = dir_ + "/missing-ca.crt";
  FeedSink b(o, nullptr, nullptr);
  st = b.start();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().find("missing-ca.crt"), std::string::npos) << st.error();
}

}  // namespace
}  // namespace endpointd::feed
