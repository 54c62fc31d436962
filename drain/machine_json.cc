// /debug/state's drains: the machine's state rendered, with the wall clock given by the caller
// (the machine itself keeps steady time only).
#include "drain/machine_json.h"

#include <string>

#include "drain/machine_internal.h"
#include "model/json.h"

namespace endpointd::drain {

using internal::ms_since;
using std::chrono::milliseconds;

std::string drains_json(const Machine& m, TimePoint now,
                        std::chrono::system_clock::time_point wall_now,
                        const std::function<std::string(const Drain&)>& extra) {
  auto wall = [&](TimePoint t) {
    auto sys = wall_now + std::chrono::duration_cast<std::chrono::system_clock::duration>(t - now);
    return std::to_string(std::chrono::duration_cast<milliseconds>(sys.time_since_epoch()).count());
  };
  auto one = [&](const Drain& d) {
    std::string j = "{\"address\":" + model::json_string(d.ip.str()) +
                    ",\"pod\":" + model::json_string(d.pod.str()) +
                    ",\"pod_uid\":" + model::json_string(d.pod_uid) +
                    (d.shared_address ? ",\"shared_address\":true" : "") +
                    ",\"stage\":" + model::json_string(std::string(to_string(d.stage))) +
                    ",\"release_after\":" +
                    model::json_string(d.release_after == ReleaseAfter::kRemoved  ? "removed"
                                       : d.release_after == ReleaseAfter::kSilent ? "silent"
                                                                                  : "drained") +
                    ",\"start_unix_ms\":" + wall(d.start) + ",\"timeline_ms\":{";
    std::string t;
    auto add = [&](const char* k, const std::optional<TimePoint>& v) {
      if (!v) return;
      t += (t.empty() ? "" : ",") + std::string("\"") + k + "\":" + ms_since(d.start, *v);
    };
    add("stop_accepting", d.stop_accepting);
    add("removed", d.removed);
    add("drained", d.drained);
    add("released", d.released);
    add("removal_deadline", d.removal_deadline);
    add("budget_end", d.budget_end);
    j += t + "},\"timeline_unix_ms\":{";
    std::string u;
    auto add_wall = [&](const char* k, const std::optional<TimePoint>& v) {
      if (!v) return;
      u += (u.empty() ? "" : ",") + std::string("\"") + k + "\":" + wall(*v);
    };
    add_wall("stop_accepting", d.stop_accepting);
    add_wall("removed", d.removed);
    add_wall("drained", d.drained);
    add_wall("released", d.released);
    add_wall("last_confirmation", d.last_confirmation);
    add_wall("prestop_called", d.prestop_called);
    add_wall("budget_end", d.budget_end);
    add_wall("drain_action", d.action_started);
    add_wall("drain_action_done", d.action_done);
    j += u + "},\"budget_from_api\":" + (d.budget_from_api ? "true" : "false") +
         ",\"drain_action\":" + model::json_string(d.action) + ",\"consumers_confirmed_ms\":{";
    std::string c;
    for (const auto& [name, at] : d.consumers_confirmed)
      c += (c.empty() ? "" : ",") + model::json_string(name) + ":" + ms_since(d.start, at);
    j += c + "},\"revision\":" + std::to_string(d.revision) +
         ",\"confirmRevision\":" + std::to_string(d.confirm_at()) + ",\"peers\":[";
    std::string p;
    for (const auto& [node, ps] : d.peers) {
      const char* st = ps.state == PeerState::State::kConfirmed ? "confirmed"
                       : ps.state == PeerState::State::kFailed  ? "failed"
                                                                : "pending";
      p += (p.empty() ? "" : ",") + std::string("{\"node\":") + model::json_string(node) +
           ",\"state\":\"" + st + "\",\"error\":" + model::json_string(ps.last_error) +
           (ps.answered ? ",\"answered_ms\":" + ms_since(d.start, *ps.answered) : std::string()) +
           "}";
    }
    j += p +
         "],\"live_flows\":" + (d.flows ? std::to_string(d.flows->live()) : std::string("null")) +
         ",\"removal_forced\":" + (d.removal_forced ? "true" : "false") +
         ",\"drain_forced\":" + (d.drain_forced ? "true" : "false") + ",\"outcome\":" +
         (d.stage == Stage::kReleased ? model::json_string(d.outcome()) : "null") +
         ",\"needs_dns\":" + (d.needs_dns ? "true" : "false") + ",\"unconfirmed\":[";
    std::string un;
    for (const auto& u : d.unconfirmed)
      un += (un.empty() ? "" : ",") + std::string("{\"node\":") + model::json_string(u.node) +
            ",\"consumer\":" + model::json_string(u.consumer) +
            ",\"reason\":" + model::json_string(u.reason) + "}";
    j += un + "],\"notes\":[";
    std::string n;
    for (const auto& s : d.notes) n += (n.empty() ? "" : ",") + model::json_string(s);
    return j + n + "]" + (extra ? extra(d) : std::string()) + "}";
  };
  std::string out = "[";
  bool first = true;
  for (const auto& d : m.finished()) {
    out += (first ? "" : ",") + one(d);
    first = false;
  }
  for (const auto& [ip, d] : m.drains()) {
    out += (first ? "" : ",") + one(d);
    first = false;
  }
  return out + "]";
}

}  // namespace endpointd::drain
