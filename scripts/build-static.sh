#!/usr/bin/env sh
# Builds the static llmproxy binary exactly as the container image does.
# Usage: scripts/build-static.sh OUTPUT
# GOOS and GOARCH pick the target (scripts/release.sh builds each one).
#
# The binary names its commit (`llmproxy version`) even where Go does not
# stamp it (GOFLAGS=-buildvcs=false, or no .git as in the Dockerfile's
# build): the commit, its time and whether the tree had changes go to the
# linker, from git when this is a work tree, or from LLMPROXY_REVISION
# (the Dockerfile's build argument). LLMPROXY_VERSION names a release.
set -eu
out=${1:?usage: build-static.sh OUTPUT}
pkg=github.com/llmproxy/llmproxy/internal/buildinfo
revision=${LLMPROXY_REVISION:-}
revision_time=
modified=
if [ -z "$revision" ] && revision=$(git rev-parse HEAD 2>/dev/null); then
  revision_time=$(TZ=UTC git show -s --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ HEAD)
  if [ -n "$(git status --porcelain)" ]; then modified=true; fi
fi
# grpcnotrace: gRPC (which the OTLP exporters bring, traces or not)
# leaves out golang.org/x/net/trace, whose html/template would make the
# linker keep every exported method of the binary: 25 MB instead of 17.
CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags="-s -w \
  -X $pkg.version=${LLMPROXY_VERSION:-} -X $pkg.revision=$revision \
  -X $pkg.revisionTime=$revision_time -X $pkg.modified=$modified" \
  -o "$out" ./cmd/llmproxy
