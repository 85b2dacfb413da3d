# syntax=docker/dockerfile:1
# Build: a static binary, made by the same script CI runs.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN sh scripts/build-static.sh /out/llmproxy

# Run: distroless static, non-root, nothing but the binary.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/llmproxy /llmproxy
ENV LLMPROXY_ADDR=:8080 \
    LLMPROXY_ADMIN_ADDR=:9090
EXPOSE 8080 9090
USER nonroot:nonroot
HEALTHCHECK --interval=10s --timeout=3s --start-period=2s --retries=3 CMD ["/llmproxy", "healthcheck"]
ENTRYPOINT ["/llmproxy"]
