# syntax=docker/dockerfile:1
# The image is one file system, laid out by scripts/image-rootfs.sh (the
# static binary, Debian's CA certificates, a non-root user), and the
# settings of the last stage. CI builds that last stage with buildah from
# the script's output (--build-context rootfs=DIR), which skips the first.
#   docker build --build-arg LLMPROXY_REVISION=$(git rev-parse HEAD) -t llmproxy .
# (the build context has no .git, so the commit comes in as an argument;
# without it `llmproxy version` says the revision is unknown).

# Build: the static binary, made by the same script CI and the releases run.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG LLMPROXY_REVISION
RUN sh scripts/build-static.sh /out/llmproxy && sh scripts/image-rootfs.sh /out/llmproxy /out/rootfs
FROM scratch AS rootfs
COPY --from=build /out/rootfs/ /rootfs/

# Run: nothing but that file system; uid 65532, no shell.
FROM scratch
COPY --from=rootfs /rootfs/ /
ARG LLMPROXY_REVISION
LABEL org.opencontainers.image.source="https://github.com/llmproxy/llmproxy" \
      org.opencontainers.image.revision="${LLMPROXY_REVISION}"
# Both listeners on every interface of the container. The admin listener
# is then not on loopback: without LLMPROXY_ADMIN_TOKEN (or _TOKEN_FILE, a
# mounted secret) it answers only requests addressed to localhost or a
# loopback address, takes no changes and serves no profiles, and logs a
# warning at start; /healthz and /readyz (the HEALTHCHECK's) answer any.
ENV LLMPROXY_ADDR=:8080 \
    LLMPROXY_ADMIN_ADDR=:9090
EXPOSE 8080 9090
USER 65532:65532
HEALTHCHECK --interval=10s --timeout=3s --start-period=2s --retries=3 CMD ["/llmproxy", "healthcheck"]
ENTRYPOINT ["/llmproxy"]
