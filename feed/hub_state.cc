// The feed hub's state file (HubOptions::state_file, --feed-state-file): the named subscribers
// it knows written out, atomically and at most every kStateWriteInterval, and loaded back as
// ghosts by the next process (see hub.h).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "feed/hub.h"
#include "feed/metrics.h"

namespace endpointd::feed {

namespace {

uint64_t generation(const model::SnapshotPtr& s) {
  return s ? s->generation : 0;
}

}  // namespace

// The state file: a header line, then one line per named subscriber:
//   endpointd-feed-subscribers 1
//   <revision> <caught up: 0|1> <identity, percent-encoded>
// The identity's bytes up to ' ', '%' and from 0x7f on are written %XX.
namespace {

constexpr std::string_view kStateHeader = "endpointd-feed-subscribers 1";

void escape_to(std::string& out, std::string_view name) {
  static const char kHex[] = "0123456789ABCDEF";
  for (unsigned char c : name) {
    if (c <= ' ' || c >= 0x7f || c == '%') {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<std::string> unescape(std::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(in[i]);
    if (c <= ' ' || c >= 0x7f) return std::nullopt;
    if (c != '%') {
      out += static_cast<char>(c);
      continue;
    }
    const int hi = i + 1 < in.size() ? hex_digit(in[i + 1]) : -1;
    const int lo = i + 2 < in.size() ? hex_digit(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

struct Remembered {
  uint64_t revision = 0;
  bool caught_up = false;
};

// The file's names, or why it is not taken.
std::variant<std::map<std::string, Remembered>, std::string> parse_state(std::string_view text) {
  std::map<std::string, Remembered> out;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return "line " + std::to_string(line_no + 1) + " is cut off";
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    ++line_no;
    if (line_no == 1) {
      if (line != kStateHeader)
        return std::string("no \"") + std::string(kStateHeader) + "\" header";
      continue;
    }
    const std::string where = "line " + std::to_string(line_no);
    const size_t a = line.find(' ');
    const size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
    if (b == std::string_view::npos) return where + ": not <revision> <0|1> <name>";
    const std::string_view rev = line.substr(0, a), caught = line.substr(a + 1, b - a - 1);
    uint64_t revision = 0;
    auto [end, ec] = std::from_chars(rev.data(), rev.data() + rev.size(), revision);
    if (rev.empty() || ec != std::errc() || end != rev.data() + rev.size())
      return where + ": bad revision";
    if (caught != "0" && caught != "1") return where + ": bad caught-up flag";
    auto name = unescape(line.substr(b + 1));
    if (!name || name->empty() || name->size() > kMaxIdentityBytes) return where + ": bad name";
    if (out.size() >= kMaxGhosts && !out.contains(*name))
      return "more than " + std::to_string(kMaxGhosts) + " names";
    auto [it, fresh] = out.try_emplace(std::move(*name), Remembered{revision, caught == "1"});
    if (!fresh) {
      it->second.revision = std::min(it->second.revision, revision);
      it->second.caught_up = it->second.caught_up && caught == "1";
    }
  }
  if (line_no == 0) return "empty";
  return out;
}

}  // namespace

void Hub::load_state() {
  auto fail = [&](Metrics::StateLoad why, const std::string& what) {
    if (metrics_) metrics_->state_load_error(why);
    spdlog::warn("feed: ignoring the subscriber state file {}: {}; no subscriber is remembered",
                 state_file_, what);
  };
  const int fd = ::open(state_file_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      spdlog::info("feed: 0 subscribers remembered from {} (no such file yet)", state_file_);
      return;
    }
    return fail(Metrics::StateLoad::kUnreadable, std::strerror(errno));
  }
  std::string text;
  char buf[65536];
  bool too_large = false, read_error = false;
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      read_error = true;
      err = errno;
      break;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxStateFileBytes) {
      too_large = true;
      break;
    }
  }
  ::close(fd);
  if (read_error) return fail(Metrics::StateLoad::kUnreadable, std::strerror(err));
  if (too_large) {
    return fail(Metrics::StateLoad::kTooLarge,
                "larger than " + std::to_string(kMaxStateFileBytes) + " bytes");
  }
  auto parsed = parse_state(text);
  if (auto* why = std::get_if<std::string>(&parsed))
    return fail(Metrics::StateLoad::kMalformed, *why);
  auto& names = std::get<0>(parsed);

  std::lock_guard acks(acks_mu_);
  const Clock::time_point t = now();
  for (auto& [name, r] : names) {
    // A subscriber caught up then is taken the same as one behind: this process does not have
    // the state it acknowledged either way.
    Ghost g;
    g.revision = r.revision;
    g.waiting_since = t;
    g.gone_at = t;
    g.row.client = name;
    g.row.connected = false;
    g.row.acked_version = 0;
    ghosts_.emplace(name, std::move(g));
    ++nothing_holding_;
    ++ghosts_holding_;
  }
  remembered_ = names.size();
  if (metrics_) {
    metrics_->remembered(names.size());
    metrics_->ghosts_holding(ghosts_holding_);
  }
  spdlog::info(
      "feed: {} subscribers remembered from {}; each holds the feed's applied generation until "
      "it reconnects and acknowledges, for {} ms at most",
      names.size(), state_file_, grace_.count());
}

void Hub::mark_state_dirty() {
  if (state_file_.empty() || state_dirty_.exchange(true)) return;
  { std::lock_guard lock(state_mu_); }  // the writer is waiting or will see the flag
  state_cv_.notify_one();
}

void Hub::run_state_writer() {
  std::unique_lock lock(state_mu_);
  for (;;) {
    state_cv_.wait(lock, [&] { return state_stop_ || state_dirty_.load(); });
    if (state_stop_) return;
    lock.unlock();
    write_state();
    lock.lock();
    // At most every kStateWriteInterval: changes meanwhile are written together.
    state_cv_.wait_for(lock, kStateWriteInterval, [&] { return state_stop_; });
  }
}

bool Hub::write_state() {
  if (state_file_.empty()) return false;
  std::lock_guard order(write_mu_);
  state_dirty_ = false;
  std::map<std::string, Remembered> rows;
  {
    std::lock_guard acks(acks_mu_);
    const uint64_t current = generation(acks_current_);
    auto add = [&](const std::string& name, uint64_t revision, bool caught_up) {
      auto [it, fresh] = rows.try_emplace(name, Remembered{revision, caught_up});
      if (!fresh) {
        it->second.revision = std::min(it->second.revision, revision);
        it->second.caught_up = it->second.caught_up && caught_up;
      }
    };
    // Connected streams first, then ghosts, at most kMaxGhosts names.
    for (const auto& [s, e] : recorded_) {
      if (e.identity.empty() || (!e.recorded && !e.at_nothing)) continue;
      if (rows.size() >= kMaxGhosts && !rows.contains(e.identity)) continue;
      if (e.at_nothing) {
        add(e.identity, e.revision, false);
      } else {
        add(e.identity, e.recorded->slice_revision, !e.lapsed && e.recorded->generation >= current);
      }
    }
    for (const auto& [name, g] : ghosts_) {
      if (rows.size() >= kMaxGhosts && !rows.contains(name)) continue;
      if (g.snapshot) {
        add(name, g.snapshot->slice_revision, g.snapshot->generation >= current);
      } else {
        add(name, g.revision, false);
      }
    }
  }
  std::string text(kStateHeader);
  text += '\n';
  for (const auto& [name, r] : rows) {
    std::string line = std::to_string(r.revision);
    line += r.caught_up ? " 1 " : " 0 ";
    escape_to(line, name);
    line += '\n';
    if (text.size() + line.size() > kMaxStateFileBytes) break;
    text += line;
  }
  if (text == last_written_) return true;  // nothing changed since the last write

  auto fail = [&](Metrics::StateWrite why, const char* what, int err) {
    if (metrics_) metrics_->state_write_error(why);
    if (uint64_t k = ++state_write_failures_; (k & (k - 1)) == 0) {
      spdlog::warn("feed: cannot write the subscriber state file {}: {}: {} ({} failures so far)",
                   state_file_, what, std::strerror(err), k);
    }
    return false;
  };
  const std::string tmp = state_file_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(Metrics::StateWrite::kOpen, "open", errno);
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fail(Metrics::StateWrite::kWrite, "write", err);
    }
    off += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  int err = synced ? 0 : errno;
  if (::close(fd) != 0 && synced) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return fail(Metrics::StateWrite::kWrite, "write", err);
  }
  if (::rename(tmp.c_str(), state_file_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return fail(Metrics::StateWrite::kRename, "rename", err);
  }
  last_written_ = std::move(text);
  return true;
}

}  // namespace endpointd::feed
