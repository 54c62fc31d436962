# The Kubernetes API client: list/watch over libcurl, kubeconfig and in-cluster auth.
target_sources(endpointd_watcher PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/kube_auth.cc
  ${CMAKE_CURRENT_LIST_DIR}/kube_watch.cc
  ${CMAKE_CURRENT_LIST_DIR}/kube_client.cc)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kube_client.cc PROPERTIES
  COMPILE_DEFINITIONS "ENDPOINTD_VERSION=\"${PROJECT_VERSION}\"")
