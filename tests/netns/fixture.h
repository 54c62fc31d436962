// A gtest fixture for tests that make namespaces: skips when not root, and sweeps namespaces
// left behind by killed runs once per process before the first test.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "tests/netns/netns.h"

namespace endpointd::netns {

class NetnsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (running_as_root()) sweep_stale_namespaces();
  }
  void SetUp() override {
    if (!running_as_root()) GTEST_SKIP() << "needs root to make network namespaces";
  }
};

// Polls `done` until it returns true or `timeout` passes: for state that only a file or the
// kernel can show (a log line, a conntrack entry), where there is nothing to block on.
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace endpointd::netns
