// YAML → JSON: scalar typing follows YAML's core schema, quoted values stay strings.
#include "watcher/yaml_json.h"

#include <gtest/gtest.h>

namespace endpointd::watcher {
namespace {

TEST(YamlToJson, TypesPlainScalarsAndKeepsQuotedOnes) {
  auto r = yaml_to_json_documents("a: 80\nb: \"80\"\nc: true\nd: ~\ne: 1.5\nf: web\ng: [1, x]\n");
  ASSERT_TRUE(r) << r.error();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0], R"({"a":80,"b":"80","c":true,"d":null,"e":1.5,"f":"web","g":[1,"x"]})");
}

TEST(YamlToJson, MultiDocumentSkipsEmptyOnes) {
  auto r = yaml_to_json_documents("---\na: 1\n---\n---\nb: \"q\\\"\"\n");
  ASSERT_TRUE(r) << r.error();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[1], R"({"b":"q\""})");
}

TEST(YamlToJson, SyntaxErrorNamesTheLine) {
  auto r = yaml_to_json_documents("a: 1\nb: [unclosed\nc: 2\n");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("line"), std::string::npos);
}

}  // namespace
}  // namespace endpointd::watcher

namespace endpointd::watcher {
namespace {

TEST(YamlToJson, StrayCommaIsAnErrorNotAHang) {
  for (const char* bad : {",", ", a: 1}", "# c\n,", "---\n,", "\"a\"\n,", "&a ,", "...\n,"}) {
    auto r = yaml_to_json_documents(bad);
    EXPECT_FALSE(r) << bad;
  }
}

TEST(YamlToJson, AliasesExpandAndAliasBombsStop) {
  auto r = yaml_to_json_documents("a: &x {p: 1}\nb: *x\n");
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ((*r)[0], R"({"a":{"p":1},"b":{"p":1}})");
  std::string bomb = "a: &a [x,x,x,x,x,x,x,x,x,x]\n";
  for (char c = 'b'; c <= 'k'; ++c)
    bomb += std::string(1, c) + ": &" + c + " [*" + char(c - 1) + ",*" + char(c - 1) + ",*" +
            char(c - 1) + ",*" + char(c - 1) + ",*" + char(c - 1) + ",*" + char(c - 1) + ",*" +
            char(c - 1) + ",*" + char(c - 1) + ",*" + char(c - 1) + ",*" + char(c - 1) + "]\n";
  auto b = yaml_to_json_documents(bomb);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().find("expands"), std::string::npos) << b.error();
}

TEST(YamlToJson, EmptyAndNullDocumentsAreSkipped) {
  auto r = yaml_to_json_documents("---\n---\n~\n---\na: 1\n");
  ASSERT_TRUE(r) << r.error();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0], R"({"a":1})");
}

}  // namespace
}  // namespace endpointd::watcher
