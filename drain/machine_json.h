// The drain machine's state as /debug/state shows it: each drain's stage and timeline (ms since
// its start, and wall-clock times), peers, consumers, notes.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "drain/machine.h"

namespace endpointd::drain {

// A JSON array of every drain, finished ones first. `now` is the machine's steady time and
// `wall_now` the wall clock at the same moment: together they turn steady times into
// readable ones.
// `extra`: more members for a drain's object (",\"late\":{…}"), or empty.
std::string drains_json(const Machine& m, TimePoint now,
                        std::chrono::system_clock::time_point wall_now,
                        const std::function<std::string(const Drain&)>& extra = {});

}  // namespace endpointd::drain
