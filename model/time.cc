#include "model/time.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string_view>

namespace endpointd::model {

// "2006-01-02T15:04:05Z" (what the API writes; fractions and offsets accepted).
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(const std::string& s) {
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6)
    return std::nullopt;
  if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
      tm.tm_min > 59 || tm.tm_sec > 60)
    return std::nullopt;
  // The system clock counts nanoseconds in 64 bits: 1677 to 2262 around 1970. A year outside
  // would overflow it; none of the API's timestamps is before 1970.
  if (tm.tm_year < 1970 || tm.tm_year > 2261) return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  std::string_view rest = std::string_view(s).substr(static_cast<size_t>(consumed));
  double frac = 0;
  if (!rest.empty() && rest.front() == '.') {
    size_t n = 1;
    double scale = 0.1;
    while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9') {
      frac += (rest[n] - '0') * scale;
      scale /= 10;
      ++n;
    }
    rest.remove_prefix(n);
  }
  int offset_s = 0;
  if (rest == "Z" || rest == "z") {
  } else if (rest.size() == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':') {
    int h = 0, m = 0;
    if (std::sscanf(std::string(rest.substr(1)).c_str(), "%2d:%2d", &h, &m) != 2)
      return std::nullopt;
    offset_s = (rest[0] == '+' ? 1 : -1) * (h * 3600 + m * 60);
  } else {
    return std::nullopt;
  }
  time_t t = timegm(&tm);
  if (t == static_cast<time_t>(-1)) return std::nullopt;
  return std::chrono::system_clock::from_time_t(t - offset_s) +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(frac));
}

std::optional<std::chrono::seconds> parse_go_duration(const std::string& s) {
  if (s.empty()) return std::nullopt;
  if (s.find_first_not_of("0123456789") == std::string::npos) {
    if (s.size() > 12) return std::nullopt;
    return std::chrono::seconds(std::stoll(s));
  }
  double total = 0;
  size_t i = 0;
  while (i < s.size()) {
    size_t digits = i;
    while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) ++i;
    std::string num = s.substr(digits, i - digits);
    if (num.empty() || num.size() > 15 || num == "." || std::count(num.begin(), num.end(), '.') > 1)
      return std::nullopt;
    double v = std::stod(num);
    size_t unit = i;
    while (i < s.size() && !((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) ++i;
    std::string u = s.substr(unit, i - unit);
    double scale = u == "h"                 ? 3600
                   : u == "m"               ? 60
                   : u == "s"               ? 1
                   : u == "ms"              ? 1e-3
                   : u == "us" || u == "µs" ? 1e-6
                   : u == "ns"              ? 1e-9
                                            : -1;
    if (scale < 0) return std::nullopt;
    total += v * scale;
  }
  if (total > 1e12) return std::nullopt;
  return std::chrono::seconds(static_cast<int64_t>(total));
}

std::string go_time_string(std::chrono::system_clock::time_point t) {
  auto secs = std::chrono::floor<std::chrono::seconds>(t);
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t - secs).count();
  time_t tt = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char head[32];
  std::strftime(head, sizeof(head), "%Y-%m-%d %H:%M:%S", &tm);
  std::string out = head;
  if (ns != 0) {
    // Go prints the fraction with trailing zeros trimmed.
    char frac[16];
    std::snprintf(frac, sizeof(frac), ".%09lld", static_cast<long long>(ns));
    std::string f = frac;
    while (f.back() == '0') f.pop_back();
    out += f;
  }
  return out + " +0000 UTC";
}

}  // namespace endpointd::model
