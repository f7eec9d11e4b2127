#!/usr/bin/env bash
# Builds the container images ferry's OCI tests use from this machine's installed Debian
# packages (no registry is reachable in CI) and imports them into an engine.
#
#   scripts/oci-image.sh busybox|glibc|bench ROOTFS_DIR [IMPORT_CMD…]
#
# busybox: a static busybox (busybox-static) with its applets as links: the "static /
#          musl / Go" case, which only the TAP serves.
# glibc:   dash, curl, sha256sum, cat, sleep, true, false, nginx and socat with the libraries
#          they load (found with ldd), and libgcc_s (in every Debian-based image; the
#          shim needs it): the case the shim serves.
# bench:   glibc's programs plus iperf3 and redis-benchmark: the clients and server of
#          `ferry bench`'s container experiment.
# The rootfs is written to ROOTFS_DIR (which must not exist); with IMPORT_CMD, it is
# piped as a tar to IMPORT_CMD (e.g. `docker -H unix:///x.sock import - ferry-glibc`).
set -euo pipefail

die() { printf 'oci-image: error: %s\n' "$*" >&2; exit 1; }

[ $# -ge 2 ] || die "usage: $0 busybox|glibc|bench ROOTFS_DIR [IMPORT_CMD…]"
kind=$1 root=$2
shift 2
[ ! -e "$root" ] || die "$root exists"

mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev,lib,usr/bin}
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

# Copies the programs named into the image's /bin with every library ldd names, at
# the same path inside the image (the loader too), and libgcc_s (in every
# Debian-based image; the shim needs it).
glibc_progs() {
    gcc_s=$(ldconfig -p | grep -o '/[^ ]*/libgcc_s.so.1$' | head -1)
    [ -n "$gcc_s" ] || die "libgcc_s.so.1 not found"
    mkdir -p "$root$(dirname "$gcc_s")"
    cp -L "$gcc_s" "$root$gcc_s"
    for p in "$@"; do
        path=$(type -P "$p") || die "$p is not installed"
        cp -L "$path" "$root/bin/$p"
        ldd "$path" | grep -o '/[^ ]*' | while read -r lib; do
            mkdir -p "$root$(dirname "$lib")"
            [ -e "$root$lib" ] || cp -L "$lib" "$root$lib"
        done
    done
}

case $kind in
busybox)
    bb=$(type -P busybox) || die "busybox is not installed (busybox-static)"
    ! ldd "$bb" >/dev/null 2>&1 || die "$bb is not static (install busybox-static)"
    cp "$bb" "$root/bin/busybox"
    for applet in $("$bb" --list); do
        [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    ;;
glibc)
    glibc_progs sh curl sha256sum cat sleep true false nginx socat
    mkdir -p "$root"/var/{lib,log}/nginx
    ;;
bench)
    glibc_progs sh curl sha256sum cat sleep true false iperf3 redis-benchmark nginx
    printf 'nobody:x:65534:65534:nobody:/:/bin/false\n' >>"$root/etc/passwd"
    printf 'nogroup:x:65534:\n' >>"$root/etc/group"
    mkdir -p "$root"/var/log/nginx "$root"/var/lib/nginx
    ;;
*) die "unknown image kind $kind (busybox, glibc or bench)" ;;
esac

if [ $# -gt 0 ]; then
    tar -C "$root" -c . | "$@"
fi
