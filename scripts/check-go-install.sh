#!/usr/bin/env bash
# Checks `go install github.com/llmproxy/llmproxy/cmd/llmproxy@<commit>`
# from an empty module cache, as far as a machine that cannot reach the
# published repository can: HEAD is served the way a module proxy serves
# a commit of github.com/llmproxy/llmproxy (its pseudo-version's .info,
# go.mod and a zip of the committed tree, `git archive`), from a file://
# GOPROXY placed before the configured one; every dependency comes from the
# configured proxy into a new, empty GOMODCACHE, checked against go.sum's
# checksum database as usual (only this module, which the database cannot
# know, is exempt). The go command itself refuses a module whose go.mod
# names another path or has replace directives. The installed binary must
# name the commit. What this cannot check: that the repository is public
# at that path (see docs/install.md).
# Usage: scripts/check-go-install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
module=github.com/llmproxy/llmproxy
revision=$(git rev-parse HEAD)
stamp=$(TZ=UTC git show -s --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)
commit_time=$(TZ=UTC git show -s --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ HEAD)
pseudo=v0.0.0-$stamp-${revision:0:12}
upstream_proxy=$(go env GOPROXY)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

at=$work/proxy/$module/@v
mkdir -p "$at"
printf '{"Version":"%s","Time":"%s"}\n' "$pseudo" "$commit_time" >"$at/$pseudo.info"
cp "$at/$pseudo.info" "$at/$revision.info" # what the proxy answers for @<commit>
git show HEAD:go.mod >"$at/$pseudo.mod"
git archive --format=zip --prefix="$module@$pseudo/" -o "$at/$pseudo.zip" HEAD
echo "$pseudo" >"$at/list"

mkdir "$work/home" && cd "$work/home" # outside the repository: no go.mod, no go.work
GOFLAGS="${GOFLAGS:-} -modcacherw" GOMODCACHE="$work/modcache" GOWORK=off \
  GOPROXY="file://$work/proxy,$upstream_proxy" GONOSUMDB=$module GOBIN="$work/bin" \
  go install -trimpath "$module/cmd/llmproxy@$revision"
"$work/bin/llmproxy" version >"$work/version"
cat "$work/version"
grep -qx "llmproxy $pseudo" "$work/version"
grep -qx "revision  ${revision:0:12}" "$work/version"
echo "go install $module/cmd/llmproxy@$revision: ok ($(find "$work/modcache/cache/download" -name '*.zip' | wc -l) module zips fetched)"
