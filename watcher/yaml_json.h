// YAML manifests → JSON text, so that manifests go through the same decoder as API objects.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/json.h"
#include "model/result.h"

namespace endpointd::watcher {

// One JSON document per non-empty YAML document. Plain scalars are typed the way YAML 1.2's
// core schema types them (integers, floats, true/false, null); quoted scalars stay strings.
Result<std::vector<std::string>> yaml_to_json_documents(std::string_view yaml);

using model::append_json_string;

}  // namespace endpointd::watcher
