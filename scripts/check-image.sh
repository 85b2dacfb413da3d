#!/usr/bin/env bash
# Builds the container image as the Dockerfile's last stage with buildah,
# from BINARY (the static linux/amd64 binary), and checks it without a
# container runtime (none can run on the CI machines: setrlimit is denied):
#   - podman image inspect: user 65532:65532, entrypoint /llmproxy, ports
#     8080 and 9090, the LLMPROXY_ADDR and LLMPROXY_ADMIN_ADDR defaults, the
#     healthcheck `/llmproxy healthcheck`, the revision label, size under
#     25 MB; skopeo inspect: linux/amd64, one layer;
#   - the file system, mounted: /llmproxy is BINARY byte for byte, the CA
#     bundle is Debian's, /tmp is writable by all, uid 65532 is in
#     /etc/passwd, nothing else is there;
#   - in that file system (chroot) as uid 65532: `llmproxy version` names
#     the commit, the proxy starts, and the healthcheck command passes
#     against it. A chroot is not a container (no namespaces or cgroups),
#     but it is the image's own files and user.
# Storage is a new directory (vfs driver) removed at the end. Needs root
# (buildah mount and chroot), and Debian's buildah, podman and skopeo.
# Usage: scripts/check-image.sh BINARY
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:?usage: check-image.sh BINARY}")
if [ "$(id -u)" != 0 ]; then
  echo "check-image: run as root (buildah mount, chroot)" >&2
  exit 1
fi
revision=$(git rev-parse HEAD)
tmp=$(mktemp -d)
store=(--root "$tmp/storage" --runroot "$tmp/run" --storage-driver vfs)
ctr=
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
  [ -n "$ctr" ] && buildah "${store[@]}" rm "$ctr" >/dev/null 2>&1
  buildah "${store[@]}" rmi -a -f >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "image: $*" >&2
  exit 1
}

sh scripts/image-rootfs.sh "$bin" "$tmp/context/rootfs"
mkdir "$tmp/empty"
image=localhost/llmproxy:check
buildah "${store[@]}" bud --quiet --format docker --timestamp "$(git show -s --format=%ct HEAD)" \
  --build-context rootfs="$tmp/context" --build-arg LLMPROXY_REVISION="$revision" \
  -f Dockerfile -t "$image" "$tmp/empty" >/dev/null

inspect() { podman "${store[@]}" image inspect --format "$1" "$image"; }
expect() { # what, got, want
  if [ "$2" != "$3" ]; then fail "$1 is $2, want $3"; fi
  echo "image: $1 $2"
}
expect user "$(inspect '{{.Config.User}}')" 65532:65532
expect entrypoint "$(inspect '{{json .Config.Entrypoint}}')" '["/llmproxy"]'
expect cmd "$(inspect '{{json .Config.Cmd}}')" null
expect ports "$(inspect '{{json .Config.ExposedPorts}}')" '{"8080/tcp":{},"9090/tcp":{}}'
expect env "$(inspect '{{json .Config.Env}}')" \
  '["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","LLMPROXY_ADDR=:8080","LLMPROXY_ADMIN_ADDR=:9090"]'
expect healthcheck "$(inspect '{{json .HealthCheck.Test}} every {{.HealthCheck.Interval}}')" '["CMD","/llmproxy","healthcheck"] every 10s'
expect revision "$(inspect '{{index .Labels "org.opencontainers.image.revision"}}')" "$revision"
size=$(inspect '{{.Size}}')
if [ "$size" -ge 25000000 ]; then fail "size $size bytes, want under 25 MB"; fi
echo "image: size $size bytes"
expect platform "$(skopeo inspect --format '{{.Os}}/{{.Architecture}} {{len .Layers}} layer' "containers-storage:[vfs@$tmp/storage+$tmp/run]$image")" "linux/amd64 1 layer"

ctr=$(buildah "${store[@]}" from "$image")
root=$(buildah "${store[@]}" mount "$ctr")
cmp "$root/llmproxy" "$bin" || fail "/llmproxy is not $bin"
expect files "$(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | tr '\n' ' ')" \
  './etc ./etc/group ./etc/nsswitch.conf ./etc/passwd ./etc/ssl ./etc/ssl/certs ./etc/ssl/certs/ca-certificates.crt ./llmproxy ./tmp '
expect /tmp "$(stat -c %a "$root/tmp")" 1777
expect "uid 65532" "$(grep -c '^nonroot:x:65532:65532:' "$root/etc/passwd")" 1
cmp "$root/etc/ssl/certs/ca-certificates.crt" <(dpkg -L ca-certificates | grep '^/usr/share/ca-certificates/.*\.crt$' | LC_ALL=C sort | xargs cat) ||
  fail "the CA bundle is not Debian's"
echo "image: CA bundle of $(grep -c 'BEGIN CERTIFICATE' "$root/etc/ssl/certs/ca-certificates.crt") certificates, ca-certificates $(dpkg-query -W -f '${Version}' ca-certificates)"

# in_image ADMIN_ADDR ARG...: /llmproxy as the image's user in its files,
# its listeners on loopback (env and chroot exec, so $! is the proxy).
chroot=$(command -v chroot)
in_image() {
  local admin=$1
  shift
  env -i LLMPROXY_ADDR=127.0.0.1:0 LLMPROXY_ADMIN_ADDR="$admin" "$chroot" --userspec=65532:65532 "$root" /llmproxy "$@"
}
in_image "" version >"$tmp/version"
grep -q "^revision  $revision" "$tmp/version" || fail "llmproxy version in the image: $(cat "$tmp/version")"
echo "image: llmproxy version names $revision"
env -i LLMPROXY_ADDR=127.0.0.1:0 LLMPROXY_ADMIN_ADDR=127.0.0.1:0 "$chroot" --userspec=65532:65532 "$root" /llmproxy 2>"$tmp/log" &
pid=$!
for _ in $(seq 100); do grep -q 'llmproxy listening' "$tmp/log" && break; sleep 0.1; done
admin=$(sed -n 's/.*admin=\([0-9.:]*\).*/\1/p;T;q' "$tmp/log")
[ -n "$admin" ] || fail "the proxy did not start in the image's file system: $(cat "$tmp/log")"
in_image "$admin" healthcheck ||
  fail "the healthcheck failed"
echo "image: the proxy runs as uid 65532 in the image's file system and passes its healthcheck"
kill -TERM "$pid"
wait "$pid"
pid=
