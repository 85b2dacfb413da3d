#!/usr/bin/env sh
# Builds the static llmproxy binary exactly as the container image does.
# Usage: scripts/build-static.sh OUTPUT
set -eu
out=${1:?usage: build-static.sh OUTPUT}
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$out" ./cmd/llmproxy
