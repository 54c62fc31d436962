# endpointd image: multi-stage on Debian 12.
#   docker build -t endpointd:0.1.0 .
# The build stage installs the build dependencies with scripts/setup and builds Release; the
# runtime stage installs only the shared libraries the binary links (found with ldd and
# dpkg -S in the build stage) and copies the binary. Nothing is fetched at run time.

FROM debian:12 AS build
WORKDIR /src
COPY scripts/setup scripts/setup
# Helm is only for the chart's tests.
RUN ENDPOINTD_SKIP_HELM=1 scripts/setup \
 && apt-get install -y -qq --no-install-recommends patchelf >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DENDPOINTD_TESTS=OFF -DENDPOINTD_BENCH=OFF -DENDPOINTD_FUZZ=OFF \
 && ninja -C /build endpointd \
 && strip /build/daemon/endpointd \
 && install -D -m 0755 /build/daemon/endpointd /out/usr/local/bin/endpointd
# The Debian packages that hold the libraries the binary needs at run time.
RUN set -e; : > /out/runtime-packages; \
    for lib in $(ldd /out/usr/local/bin/endpointd | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do \
      pkg=""; \
      for p in "$lib" "$(realpath "$lib")" "/usr$lib" "${lib#/usr}"; do \
        pkg=$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$pkg" ] && break; \
      done; \
      [ -n "$pkg" ] || { echo "no package holds $lib" >&2; exit 1; }; \
      echo "$pkg" >> /out/runtime-packages; \
    done; \
    sort -u -o /out/runtime-packages /out/runtime-packages; cat /out/runtime-packages
# The prestop bundle that workloads' init containers copy into an emptyDir mounted at
# /endpointd: the binary with its libraries and loader, so that `/endpointd/endpointd prestop`
# runs in any application image (glibc or not, with or without a shell). DT_RPATH
# (--force-rpath), not RUNPATH: it also applies to the libraries' own dependencies.
RUN set -e; b=/out/opt/endpointd/prestop; mkdir -p "$b/lib"; \
    cp /out/usr/local/bin/endpointd "$b/endpointd"; \
    for lib in $(ldd "$b/endpointd" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do cp -L "$lib" "$b/lib/"; done; \
    interp=$(patchelf --print-interpreter "$b/endpointd"); cp -L "$interp" "$b/lib/"; \
    patchelf --set-interpreter "/endpointd/lib/$(basename "$interp")" --force-rpath --set-rpath '$ORIGIN/lib' "$b/endpointd"; \
    chmod -R a+rX "$b"

FROM debian:12-slim AS runtime
COPY --from=build /out/runtime-packages /tmp/runtime-packages
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      ca-certificates $(cat /tmp/runtime-packages) >/dev/null \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages
COPY --from=build /out/usr/local/bin/endpointd /usr/local/bin/endpointd
COPY --from=build /out/opt/endpointd/prestop /opt/endpointd/prestop
# Workloads' init containers: cp -a /opt/endpointd/prestop/. /endpointd/
ENTRYPOINT ["/usr/local/bin/endpointd"]
CMD ["run", "--config", "/etc/endpointd/config.yaml"]
