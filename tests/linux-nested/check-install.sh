#!/usr/bin/env bash
# Proves that run.sh installs what it needs on a fresh Debian 12: debootstraps a minimal
# bookworm from this machine's own Debian archive into DIR, runs run.sh's package stage there
# (LLFREE_NESTED_PACKAGES_ONLY=1: QEMU 10 from backports and the rest) and checks that QEMU 10
# is what got installed.
#
# Usage (as root on Debian 12): tests/linux-nested/check-install.sh [DIR]
#   DIR  the root to install into (default: a new directory under /var/tmp, removed at the end);
#        one that holds a system already is used as it is
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/linux-nested/apt.sh
. "$HERE/apt.sh"

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (debootstrap, chroot)" >&2; exit 1; }
if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
root=${1:-}
if [ -z "$root" ]; then
    root=$(mktemp -d /var/tmp/llfree-clean-root.XXXXXX)
    trap 'umount "$root/proc" 2>/dev/null || true; rm -rf "$root"' EXIT
else
    trap 'umount "$root/proc" 2>/dev/null || true' EXIT
fi
if [ ! -x "$root/usr/bin/apt-get" ]; then
    mirror=$(debian_mirror)
    echo "== debootstrap bookworm from $mirror into $root"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/check"
cp "$HERE/run.sh" "$HERE/apt.sh" "$root/check/"
mount -t proc proc "$root/proc"
echo "== run.sh's package stage in the fresh root"
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LLFREE_NESTED_PACKAGES_ONLY=1 bash /check/run.sh
version=$(chroot "$root" dpkg-query -W -f='${Version}' qemu-system-x86)
chroot "$root" qemu-system-x86_64 --version | head -n 1
if ! chroot "$root" dpkg --compare-versions "$version" ge 1:10; then
    echo "error: qemu-system-x86 $version installed, 1:10 or later expected" >&2
    exit 1
fi
echo "check-install: ok (qemu-system-x86 $version in a fresh bookworm)"
