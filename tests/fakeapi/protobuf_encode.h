// The fake API server's protobuf encoding of EndpointSlice lists, as kube-apiserver writes
// them for a client that accepts application/vnd.kubernetes.protobuf: what the agent's
// protobuf decoder is tested and measured against. Field numbers are k8s.io/api's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace endpointd::fakeapi {

// One EndpointSlice (its JSON, as stored) as protobuf message bytes; nullopt when the JSON
// holds a value protobuf cannot carry (a port that is no number, a condition that is no bool).
std::optional<std::string> endpoint_slice_protobuf(std::string_view json);

// A list page: "k8s\0", then runtime.Unknown {typeMeta {apiVersion, kind}, raw = the list
// (metadata {resourceVersion, continue}, items)}.
std::string protobuf_list_page(std::string_view api_version, std::string_view list_kind,
                               uint64_t resource_version, std::string_view continue_token,
                               const std::vector<std::string_view>& items);

// A Status, as the API server answers an error to a client that prefers protobuf.
std::string protobuf_status(int code, std::string_view reason, std::string_view message);

}  // namespace endpointd::fakeapi
