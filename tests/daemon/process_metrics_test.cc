// The process_* metrics: the stat line's fields, and the values read from this process.
#include "daemon/process_metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fcntl.h>
#include <chrono>
#include <cstdlib>
#include <string>

namespace endpointd::daemon {
namespace {

// One value of a metric in the text, or -1 when it is not there.
double value(const std::string& text, const std::string& name) {
  auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

TEST(ProcStat, FieldsAreCountedAfterTheCommandName) {
  // A command name with spaces and parentheses must not shift the fields.
  std::string line =
      "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 "
      "250 75 0 0 20 0 9 0 123456 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 "
      "17 1 0 0 0 0 0";
  auto s = parse_proc_stat(line);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->utime_ticks, 250u);
  EXPECT_EQ(s->stime_ticks, 75u);
  EXPECT_EQ(s->start_ticks, 123456u);
  EXPECT_EQ(s->vsize_bytes, 987654321u);
  EXPECT_EQ(s->rss_pages, 2048u);
  EXPECT_FALSE(parse_proc_stat("4242 (cut short) S 1 2 3"));
  EXPECT_FALSE(parse_proc_stat("no parenthesis at all"));
  EXPECT_FALSE(parse_proc_stat("1 (x) S 1 1 1 0 -1 0 0 0 0 0 ten 75 0 0 20 0 9 0 1 1 1"));
}

TEST(ProcessMetrics, ValuesAreThisProcesss) {
  // Some CPU spent, and two descriptors more than before.
  volatile uint64_t spin = 0;
  for (auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(30);
       std::chrono::steady_clock::now() < end;)
    spin = spin + 1;
  const double before = value(process_metrics(), "process_open_fds");
  int a = open("/dev/null", O_RDONLY | O_CLOEXEC), b = open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::string text = process_metrics();
  close(a);
  close(b);
  EXPECT_GT(value(text, "process_cpu_seconds_total"), 0.0) << text;
  EXPECT_GT(value(text, "process_resident_memory_bytes"), 1e6);
  EXPECT_GE(value(text, "process_virtual_memory_bytes"),
            value(text, "process_resident_memory_bytes"));
  EXPECT_EQ(value(text, "process_open_fds"), before + 2);
  EXPECT_GT(value(text, "process_max_fds"), value(text, "process_open_fds"));
  double now = static_cast<double>(time(nullptr));
  double start = value(text, "process_start_time_seconds");
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 3600);  // this test process started within the hour
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos);
  EXPECT_NE(text.find("endpointd_build_info{version=\""), std::string::npos);
}

}  // namespace
}  // namespace endpointd::daemon
