# Include this from any component that uses endpointd_proto; the first include defines it.
include_guard(GLOBAL)
if(NOT TARGET endpointd_proto)
  add_subdirectory(${CMAKE_SOURCE_DIR}/proto ${CMAKE_BINARY_DIR}/proto)
endif()
