// The manifest directory: initial read, edits in place, renames, removals, and broken files
// that keep their last good objects.
#include "watcher/manifest_source.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>

#include "pipeline/store.h"

namespace endpointd::watcher {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const char* kWeb = R"(apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.0.1]
- addresses: [10.244.0.2]
)";

// Collects posted events into a real Store and lets the test wait for the next post.
class Collector {
 public:
  void post(model::Event ev) {
    std::lock_guard lock(mu_);
    store_.apply(std::move(ev));
    snap_ = store_.build(snap_);
    ++posts_;
    cv_.notify_all();
  }
  // Waits for a post after the `after`-th one.
  model::SnapshotPtr wait_past(int after) {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 5s, [&] { return posts_ > after; }));
    return snap_;
  }
  int posts() {
    std::lock_guard lock(mu_);
    return posts_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  pipeline::Store store_{{model::ObjectKind::kService}};
  model::SnapshotPtr snap_;
  int posts_ = 0;
};

class ManifestSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endpointd-manifests-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    if (src_) src_->stop();
    fs::remove_all(dir_);
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  void start() {
    src_ = std::make_unique<ManifestSource>(
        dir_, [this](model::Event ev) { col_.post(std::move(ev)); }, &reg_);
    auto st = src_->start();
    ASSERT_TRUE(st) << st.error();
  }
  size_t endpoints(const model::SnapshotPtr& s) {
    auto* st = s->find({"demo", "web"});
    return st ? st->endpoints.size() : 0;
  }

  fs::path dir_;
  Collector col_;
  prometheus::Registry reg_;
  std::unique_ptr<ManifestSource> src_;
};

TEST_F(ManifestSourceTest, ReadsTheDirectoryAtStart) {
  write("web.yaml", kWeb);
  write("notes.txt", "not a manifest");
  write("other.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n");
  start();
  auto s = col_.wait_past(0);
  EXPECT_EQ(endpoints(s), 2u);
  EXPECT_TRUE(src_->errors().empty());
}

// A directory of many files is read on several threads (ManifestSource::load_files): every
// object arrives, an object two files define is the later file's, and each broken file is
// named once with its error, as when the files were read one by one.
TEST_F(ManifestSourceTest, ManyFilesReadTogetherKeepNameOrderAndTheirErrors) {
  constexpr int kFiles = 64;  // several threads' worth
  auto name = [](int i) {
    char b[32];
    std::snprintf(b, sizeof b, "svc-%03d.yaml", i);
    return std::string(b);
  };
  for (int i = 0; i < kFiles; ++i) {
    if (i % 16 == 5) {
      write(name(i), "kind: Service\nmetadata: {name: broken\n");  // unclosed
      continue;
    }
    // Each file defines its own service; every file also defines `shared`, whose cluster IP
    // says which file it came from.
    write(name(i), "kind: Service\nmetadata: {name: own-" + std::to_string(i) +
                       ", namespace: demo}\nspec: {ports: [{port: 80}]}\n---\n"
                       "kind: Service\nmetadata: {name: shared, namespace: demo}\n"
                       "spec: {clusterIP: 10.96.1." +
                       std::to_string(i) + ", ports: [{port: 80}]}\n");
  }
  start();
  auto s = col_.wait_past(0);
  int own = 0;
  for (int i = 0; i < kFiles; ++i)
    if (s->find({"demo", "own-" + std::to_string(i)})) ++own;
  EXPECT_EQ(own, kFiles - kFiles / 16);
  auto* shared = s->find({"demo", "shared"});
  ASSERT_NE(shared, nullptr);
  ASSERT_EQ(shared->service.cluster_ips.size(), 1u);
  EXPECT_EQ(shared->service.cluster_ips[0].str(), "10.96.1." + std::to_string(kFiles - 1));
  auto errs = src_->errors();
  ASSERT_EQ(errs.size(), static_cast<size_t>(kFiles / 16));
  for (size_t k = 0; k < errs.size(); ++k) {
    EXPECT_NE(errs[k].file.find(name(static_cast<int>(16 * k + 5))), std::string::npos);
    EXPECT_NE(errs[k].reason.find("YAML"), std::string::npos) << errs[k].reason;
  }
  EXPECT_EQ(src_->error_count(), static_cast<uint64_t>(kFiles / 16));
  EXPECT_EQ(src_->decoded_objects(), 2u * (kFiles - kFiles / 16));
}

TEST_F(ManifestSourceTest, EditInPlaceAndRenameArePickedUp) {
  write("web.yaml", kWeb);
  start();
  int n = col_.posts();
  {  // edit in place
    std::ofstream f(dir_ / "web.yaml", std::ios::trunc);
    f << kWeb << "- addresses: [10.244.0.3]\n";
  }
  EXPECT_EQ(endpoints(col_.wait_past(n)), 3u);
  n = col_.posts();
  // replace by rename, as editors and ConfigMap updates do
  std::string text = std::string(kWeb) + "- addresses: [10.244.0.3]\n- addresses: [10.244.0.4]\n";
  std::ofstream(dir_ / ".web.yaml.tmp") << text;
  fs::rename(dir_ / ".web.yaml.tmp", dir_ / "web.yaml");
  EXPECT_EQ(endpoints(col_.wait_past(n)), 4u);
  n = col_.posts();
  fs::remove(dir_ / "web.yaml");
  EXPECT_EQ(col_.wait_past(n)->find({"demo", "web"}), nullptr);
}

// An object defined by two files belongs to the later one in name order; when that one drops
// it, the earlier one's version takes over (decoded again, though that file did not change);
// when no file defines it, it goes.
TEST_F(ManifestSourceTest, ObjectDefinedTwiceFollowsTheLastFileThatDefinesIt) {
  auto svc = [](const char* ip) {
    return std::string(
               "kind: Service\nmetadata: {name: web, namespace: demo}\nspec: {clusterIP: ") +
           ip + ", ports: [{port: 80}]}\n";
  };
  auto cluster_ip = [](const model::SnapshotPtr& s) {
    auto* st = s->find({"demo", "web"});
    return st && !st->service.cluster_ips.empty() ? st->service.cluster_ips[0].str()
                                                  : std::string("none");
  };
  write("a.yaml", svc("10.96.0.1"));
  write("b.yaml", svc("10.96.0.2"));
  write("c.yaml",
        "kind: Service\nmetadata: {name: other, namespace: demo}\nspec: {ports: [{port: 80}]}\n");
  start();
  EXPECT_EQ(cluster_ip(col_.wait_past(0)), "10.96.0.2");
  int n = col_.posts();
  write(
      "b.yaml",
      "kind: Service\nmetadata: {name: unrelated, namespace: demo}\nspec: {ports: [{port: 80}]}\n");
  auto s = col_.wait_past(n);
  EXPECT_EQ(cluster_ip(s), "10.96.0.1");
  EXPECT_NE(s->find({"demo", "unrelated"}), nullptr);
  n = col_.posts();
  write("b.yaml", svc("10.96.0.3"));
  EXPECT_EQ(cluster_ip(col_.wait_past(n)), "10.96.0.3");
  n = col_.posts();
  fs::remove(dir_ / "b.yaml");
  s = col_.wait_past(n);
  EXPECT_EQ(cluster_ip(s), "10.96.0.1");
  EXPECT_EQ(s->find({"demo", "unrelated"}), nullptr);
  n = col_.posts();
  fs::remove(dir_ / "a.yaml");
  s = col_.wait_past(n);
  EXPECT_EQ(cluster_ip(s), "none");
  EXPECT_NE(s->find({"demo", "other"}), nullptr);
}

TEST_F(ManifestSourceTest, BrokenFileKeepsItsLastGoodObjects) {
  write("web.yaml", kWeb);
  start();
  int n = col_.posts();
  write("web.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web\n");  // unclosed
  auto s = col_.wait_past(n);
  EXPECT_EQ(endpoints(s), 2u);
  auto errs = src_->errors();
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_NE(errs[0].file.find("web.yaml"), std::string::npos);
  EXPECT_NE(errs[0].reason.find("YAML"), std::string::npos);
  EXPECT_EQ(src_->error_count(), 1u);
  auto text = prometheus::TextSerializer().Serialize(reg_.Collect());
  EXPECT_NE(text.find("endpointd_manifest_file_errors_total 1"), std::string::npos);
  // Fixed again: the error goes away.
  n = col_.posts();
  write("web.yaml", std::string(kWeb) + "- addresses: [10.244.0.9]\n");
  EXPECT_EQ(endpoints(col_.wait_past(n)), 3u);
  EXPECT_TRUE(src_->errors().empty());
}

TEST_F(ManifestSourceTest, BadObjectKeepsItsPreviousVersionOthersUpdate) {
  write("web.yaml", kWeb);
  write("api.yaml",
        "kind: Service\nmetadata: {name: api, namespace: demo}\nspec: {clusterIP: 10.96.0.20}\n");
  start();
  int n = col_.posts();
  // web's slice gets an invalid address; api changes its cluster IP.
  std::string broken = kWeb;
  broken.replace(broken.find("10.244.0.2"), 10, "10.244.0.999");
  write("web.yaml", broken);
  write("api.yaml",
        "kind: Service\nmetadata: {name: api, namespace: demo}\nspec: {clusterIP: 10.96.0.21}\n");
  model::SnapshotPtr s;
  for (int i = 0; i < 3; ++i) {  // one post per rescan; wait until both files were re-read
    s = col_.wait_past(n);
    n = col_.posts();
    if (s->find({"demo", "api"})->service.cluster_ips[0].str() == "10.96.0.21") break;
  }
  EXPECT_EQ(s->find({"demo", "api"})->service.cluster_ips[0].str(), "10.96.0.21");
  EXPECT_EQ(endpoints(s), 2u);  // the slice's last good version
  auto errs = src_->errors();
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_NE(errs[0].reason.find("EndpointSlice demo/web-1"), std::string::npos);
  EXPECT_NE(errs[0].reason.find("10.244.0.999"), std::string::npos);
  auto text = prometheus::TextSerializer().Serialize(reg_.Collect());
  EXPECT_NE(text.find("endpointd_decode_errors_total{kind=\"EndpointSlice\"} 1"),
            std::string::npos);
}

TEST_F(ManifestSourceTest, ListsAndJson) {
  write("list.yaml", R"(apiVersion: v1
kind: List
items:
- {kind: Service, metadata: {name: a, namespace: demo}, spec: {clusterIP: 10.96.0.1}}
- {kind: Service, metadata: {name: b, namespace: demo}, spec: {clusterIP: 10.96.0.2}}
)");
  write(
      "c.json",
      R"({"kind":"ServiceList","items":[{"kind":"Service","metadata":{"name":"c","namespace":"demo"},"spec":{}}]})");
  start();
  auto s = col_.wait_past(0);
  EXPECT_EQ(s->services.size(), 3u);
}

// A List is parsed once and each item handed to the decoder once; rewriting the file decodes
// only the item whose content changed.
TEST_F(ManifestSourceTest, ListItemsAreDecodedOnceAndAgainOnlyWhenChanged) {
  auto list = [](const char* b_ip) {
    return std::string(R"({"kind":"List","items":[)") +
           R"({"kind":"Service","metadata":{"name":"a","namespace":"demo"},"spec":{"clusterIP":"10.96.0.1"}},)" +
           R"({"kind":"Service","metadata":{"name":"b","namespace":"demo"},"spec":{"clusterIP":")" +
           b_ip + R"("}},)" +
           R"({"kind":"Deployment","metadata":{"name":"d","namespace":"demo"}},)" +
           R"({"kind":"Service","metadata":{"name":"c","namespace":"demo"},"spec":{"clusterIP":"10.96.0.3"}}]})";
  };
  write("list.json", list("10.96.0.2"));
  start();
  auto s = col_.wait_past(0);
  EXPECT_EQ(s->services.size(), 3u);
  EXPECT_EQ(src_->decoded_objects(), 3u);  // the Deployment is not decoded
  int n = col_.posts();
  write("list.json", list("10.96.0.22"));
  s = col_.wait_past(n);
  ASSERT_NE(s->find({"demo", "b"}), nullptr);
  EXPECT_EQ(s->find({"demo", "b"})->service.cluster_ips[0].str(), "10.96.0.22");
  EXPECT_EQ(s->services.size(), 3u);
  EXPECT_EQ(src_->decoded_objects(), 4u);
}

// metadata.managedFields is not read by the decoder: a write that changes only it decodes
// nothing again; one that changes a label the decoder reads does.
TEST_F(ManifestSourceTest, ManagedFieldsAloneDoNotCauseADecode) {
  auto list = [](const char* manager, const char* proxy_label) {
    return std::string(R"({"kind":"List","items":[)") +
           R"({"kind":"Service","metadata":{"name":"a","namespace":"demo","labels":{)" +
           proxy_label + R"(},"managedFields":[{"manager":")" + manager +
           R"(","fieldsV1":{"f:spec":{}}}]},"spec":{"clusterIP":"10.96.0.1"}}]})";
  };
  write("list.json", list("helm", ""));
  start();
  auto s = col_.wait_past(0);
  EXPECT_EQ(s->services.size(), 1u);
  EXPECT_EQ(src_->decoded_objects(), 1u);
  int n = col_.posts();
  write("list.json", list("kubectl", ""));
  // The file is read again (a post), its object is not decoded.
  s = col_.wait_past(n);
  EXPECT_EQ(src_->decoded_objects(), 1u);
  EXPECT_EQ(s->services.size(), 1u);
  n = col_.posts();
  write("list.json",
        list("kubectl", R"("service.kubernetes.io/service-proxy-name":"someone-else")"));
  s = col_.wait_past(n);
  EXPECT_EQ(src_->decoded_objects(), 2u);
  // Another proxy's service now: still in the snapshot (DNS and the feed serve it), labelled.
  ASSERT_EQ(s->services.size(), 1u);
  EXPECT_EQ(s->find({"demo", "a"})->service.service_proxy_name, "someone-else");
}

// Renames: into the directory from elsewhere, within it (the objects stay), out of it (they
// go); and a deletion.
TEST_F(ManifestSourceTest, FilesRenamedInWithinAndOutAndDeleted) {
  auto svc = [](const char* name) {
    return std::string("kind: Service\nmetadata: {name: ") + name +
           ", namespace: demo}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
  };
  write("keep.yaml", svc("keep"));
  start();
  EXPECT_EQ(col_.wait_past(0)->services.size(), 1u);
  char tmpl[] = "/tmp/endpointd-outside-XXXXXX";
  fs::path outside = mkdtemp(tmpl);
  std::ofstream(outside / "moved.yaml") << svc("moved");
  int n = col_.posts();
  fs::rename(outside / "moved.yaml", dir_ / "moved.yaml");
  auto s = col_.wait_past(n);
  EXPECT_NE(s->find({"demo", "moved"}), nullptr);
  n = col_.posts();
  fs::rename(dir_ / "moved.yaml", dir_ / "renamed.yaml");
  s = col_.wait_past(n);
  // The two halves of the rename may come in two reads: gone, then back.
  for (int i = 0; i < 2 && !s->find({"demo", "moved"}); ++i) s = col_.wait_past(col_.posts());
  EXPECT_NE(s->find({"demo", "moved"}), nullptr);
  n = col_.posts();
  fs::rename(dir_ / "renamed.yaml", outside / "moved.yaml");
  s = col_.wait_past(n);
  EXPECT_EQ(s->find({"demo", "moved"}), nullptr);
  EXPECT_NE(s->find({"demo", "keep"}), nullptr);
  n = col_.posts();
  fs::remove(dir_ / "keep.yaml");
  s = col_.wait_past(n);
  EXPECT_EQ(s->services.size(), 0u);
  EXPECT_TRUE(src_->errors().empty());
  fs::remove_all(outside);
}

// A ConfigMap volume: each manifest is a link through `..data`, and an update swaps `..data`
// by rename. No event names the manifests, so every file is looked at again.
TEST_F(ManifestSourceTest, ConfigMapStyleLinkSwapIsPickedUp) {
  fs::create_directory(dir_ / "..v1");
  std::ofstream(dir_ / "..v1" / "web.yaml") << kWeb;
  fs::create_directory_symlink("..v1", dir_ / "..data");
  fs::create_symlink("..data/web.yaml", dir_ / "web.yaml");
  start();
  EXPECT_EQ(endpoints(col_.wait_past(0)), 2u);
  fs::create_directory(dir_ / "..v2");
  std::ofstream(dir_ / "..v2" / "web.yaml") << kWeb << "- addresses: [10.244.0.3]\n";
  int n = col_.posts();
  fs::create_directory_symlink("..v2", dir_ / "..data_tmp");
  fs::rename(dir_ / "..data_tmp", dir_ / "..data");
  model::SnapshotPtr s = col_.wait_past(n);
  for (int i = 0; i < 3 && endpoints(s) != 3u; ++i) s = col_.wait_past(col_.posts());
  EXPECT_EQ(endpoints(s), 3u);
}

TEST_F(ManifestSourceTest, MissingDirectoryFailsToStart) {
  ManifestSource src(
      dir_ / "nope", [](model::Event) {}, nullptr);
  auto st = src.start();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().find("nope"), std::string::npos);
}

}  // namespace
}  // namespace endpointd::watcher
