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
