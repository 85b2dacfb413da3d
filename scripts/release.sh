#!/usr/bin/env bash
# Builds a release: static llmproxy binaries for linux and darwin on amd64
# and arm64 and for windows/amd64, each by scripts/build-static.sh (the
# image's build); SHA256SUMS of them all; and llmproxy.cdx.json, the
# CycloneDX SBOM of the modules they link (scripts/sbom).
#
# Usage: scripts/release.sh VERSION       VERSION must be a tag on HEAD and
#                                         the work tree clean
#        scripts/release.sh --snapshot    any commit (CI): the version is
#                                         v0.0.0-<commit time>-<12 hex digits>,
#                                         the form `go install …@<commit>`
#                                         reports (+dirty with local changes)
# DIST names the output directory (default dist); it must be empty or new.
set -euo pipefail
cd "$(dirname "$0")/.."

unset LLMPROXY_REVISION # the release names the commit it builds
targets="linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64"
dist=${DIST:-dist}

revision=$(git rev-parse HEAD) || { echo "release: git cannot name the commit (is this a clone git trusts?)" >&2; exit 1; }
commit_time=$(TZ=UTC git show -s --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ HEAD)
dirty=$(git status --porcelain)
case "${1:-}" in
--snapshot)
  version=v0.0.0-$(TZ=UTC git show -s --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)-${revision:0:12}
  if [ -n "$dirty" ]; then version=$version+dirty; fi
  ;;
v*)
  version=$1
  if ! git tag --points-at HEAD | grep -qxF "$version"; then
    echo "release: $version is not a tag on HEAD ($revision)" >&2
    exit 1
  fi
  if [ -n "$dirty" ]; then
    echo "release: the work tree has changes; commit or stash them" >&2
    exit 1
  fi
  ;;
*)
  echo "usage: scripts/release.sh VERSION | --snapshot" >&2
  exit 2
  ;;
esac

mkdir -p "$dist"
if [ -n "$(ls -A "$dist")" ]; then
  echo "release: $dist is not empty; remove it first" >&2
  exit 1
fi

bins=()
for target in $targets; do
  goos=${target%/*} goarch=${target#*/}
  bin=$dist/llmproxy-$goos-$goarch
  if [ "$goos" = windows ]; then bin=$bin.exe; fi
  start=$SECONDS
  GOOS=$goos GOARCH=$goarch LLMPROXY_VERSION=$version sh scripts/build-static.sh "$bin"
  echo "release: $target built in $((SECONDS - start)) s"
  bins+=("$bin")
done
go run ./scripts/sbom -version "$version" -time "$commit_time" -o "$dist/llmproxy.cdx.json" "${bins[@]}"
(cd "$dist" && sha256sum -- llmproxy-* llmproxy.cdx.json >SHA256SUMS)
echo "release $version ($revision) in $dist:"
ls -l "$dist"
