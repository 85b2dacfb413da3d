#!/usr/bin/env sh
# Lays out the container image's whole file system in DIR: the static
# binary as /llmproxy, Debian's CA certificates, a non-root user (65532,
# "nonroot"), /etc/nsswitch.conf so /etc/hosts is read before DNS, and a
# /tmp anyone may write (large request bodies are spooled there). The
# Dockerfile's last stage copies DIR in; CI builds that same stage with
# buildah from this script's output.
#
# The certificates are the ones Debian's ca-certificates package ships
# (dpkg -L), joined in the order update-ca-certificates joins them, not the
# machine's /etc/ssl/certs/ca-certificates.crt: that file also holds
# whatever CAs the machine's owner added (a proxy's, a company's), which
# an image must not carry.
# Usage: scripts/image-rootfs.sh BINARY DIR
set -eu
bin=${1:?usage: image-rootfs.sh BINARY DIR}
dir=${2:?usage: image-rootfs.sh BINARY DIR}
if [ -e "$dir" ]; then
  echo "image-rootfs: $dir exists; give a new directory" >&2
  exit 1
fi
certs=$(dpkg -L ca-certificates | grep '^/usr/share/ca-certificates/.*\.crt$' | LC_ALL=C sort)
if [ -z "$certs" ]; then
  echo "image-rootfs: Debian's ca-certificates package is not installed (apt-get install -y ca-certificates)" >&2
  exit 1
fi
umask 022
mkdir -p "$dir/etc/ssl/certs" "$dir/tmp"
chmod 1777 "$dir/tmp"
cp "$bin" "$dir/llmproxy"
chmod 0755 "$dir/llmproxy"
for c in $certs; do cat "$c"; done >"$dir/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' >"$dir/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$dir/etc/group"
printf 'hosts: files dns\n' >"$dir/etc/nsswitch.conf"
