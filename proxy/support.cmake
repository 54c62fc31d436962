# endpointd_proxy_support: the proxy's conntrack (libnl-nf) and healthCheckNodePort servers.
# Included from proxy/CMakeLists.txt (and, until then, from tests/proxy_support); guarded so
# it can be included from both.
if(NOT TARGET endpointd_proxy_support)
  pkg_check_modules(LIBNL_NF REQUIRED IMPORTED_TARGET libnl-3.0 libnl-nf-3.0)
  add_library(endpointd_proxy_support STATIC
    ${CMAKE_SOURCE_DIR}/proxy/conntrack.cc
    ${CMAKE_SOURCE_DIR}/proxy/healthcheck.cc)
  target_include_directories(endpointd_proxy_support PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(endpointd_proxy_support
    PUBLIC endpointd_model PkgConfig::LIBNL_NF
    PRIVATE PkgConfig::HTTPLIB spdlog::spdlog Threads::Threads)
endif()
