# endpointd image: multi-stage on Debian 12. Build it with scripts/image (podman; it makes the
# debian:12 bases with debootstrap when no registry is reachable), or:
#   podman build --network host --build-arg BINARIES=compile -t endpointd:0.1.0 .
# (podman 4.3 needs BINARIES given: it picks the stages to build from the arguments given only.)
# The compile stage installs the build dependencies with scripts/setup and builds Release;
# `scripts/image --collect` then lists the Debian packages holding the libraries the binaries
# load (ldd, dpkg -S) and makes the prestop bundle. The runtime stage installs only those
# packages and copies the binaries: nothing to compile with, nothing fetched at run time.
#
# BINARIES=prebuilt (scripts/image --prebuilt BUILD_DIR) takes /out from the build context
# instead, made by the same --collect from binaries built on a Debian 12 machine.
ARG BINARIES=compile

FROM debian:12 AS compile
WORKDIR /src
COPY scripts/setup scripts/setup
# Helm is only for the chart's tests.
RUN ENDPOINTD_SKIP_HELM=1 scripts/setup \
 && apt-get install -y -qq --no-install-recommends patchelf >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DENDPOINTD_TESTS=OFF -DENDPOINTD_BENCH=OFF -DENDPOINTD_FUZZ=OFF \
 && ninja -C /build -j"$(nproc)" endpointd endpointd-haproxy \
 && scripts/image --collect /out /build/daemon/endpointd /build/adapters/haproxy/endpointd-haproxy \
 && cat /out/runtime-packages

FROM debian:12 AS prebuilt
COPY out/ /out/

FROM ${BINARIES} AS binaries

FROM debian:12-slim AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title=endpointd org.opencontainers.image.version=${VERSION}
COPY --from=binaries /out/runtime-packages /tmp/runtime-packages
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      ca-certificates $(cat /tmp/runtime-packages) >/dev/null \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log /tmp/runtime-packages
COPY --from=binaries /out/usr/local/bin/ /usr/local/bin/
COPY --from=binaries /out/opt/endpointd/prestop /opt/endpointd/prestop
# Workloads' init containers: cp -a /opt/endpointd/prestop/. /endpointd/
ENTRYPOINT ["/usr/local/bin/endpointd"]
CMD ["run", "--config", "/etc/endpointd/config.yaml"]
