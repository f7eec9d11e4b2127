#!/usr/bin/env bash
# Builds the small VM guest ferry's VM tests and benchmarks boot (`ferry vm`): a Debian
# cloud kernel taken from its Debian package, and a busybox-static initramfs whose init
# loads virtio-net (a module in that kernel, with what it depends on), configures eth0
# and runs the commands the kernel command line carries, on the serial console. The
# host's iperf3 and sockperf (`ferry bench` E8's clients) are copied in with the shared
# libraries they load, when the host has them.
#
#   scripts/guest-image.sh OUTDIR
#
# Writes OUTDIR/vmlinuz, OUTDIR/initrd.img and OUTDIR/stamp (the script's own checksum:
# the image is reused while it matches, rebuilt when this script changed). Needs:
# apt-get (the kernel package is downloaded from the configured Debian mirror, a package
# registry), dpkg-deb, cpio, gzip, busybox-static (scripts/install-deps.sh).
#
# The guest's init reads from the kernel command line:
#   ferry.ip=ADDR/PREFIX ferry.gw=GATEWAY ferry.mtu=MTU  eth0's address, route, MTU
#   ferry.run=BASE64                                      a shell script (base64) to run
# and prints `FERRY-GUEST-READY` once eth0 is up, the script's output, then
# `FERRY-GUEST-EXIT <status>`, and powers the guest off.
set -euo pipefail

say() { printf 'guest-image: %s\n' "$*" >&2; }
die() { printf 'guest-image: error: %s\n' "$*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
out=$1
mkdir -p "$out"
out=$(cd "$out" && pwd)
stamp=$(sha256sum "$0" | cut -d' ' -f1)
if [ -s "$out/vmlinuz" ] && [ -s "$out/initrd.img" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
    say "reusing $out/vmlinuz and $out/initrd.img"
    exit 0
fi
for p in apt-get dpkg-deb cpio gzip sha256sum; do
    command -v "$p" >/dev/null || die "$p not found (run scripts/install-deps.sh)"
done
busybox=/bin/busybox
[ -x "$busybox" ] && file_is_static=$(ldd "$busybox" 2>&1 | grep -c 'not a dynamic' || true)
[ "${file_is_static:-0}" -ge 1 ] || die "a static busybox is needed at $busybox (busybox-static)"

work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

# The newest versioned cloud kernel the metapackage points to.
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n1)
[ -n "$pkg" ] || die "no linux-image-*-cloud-amd64 package known to apt (apt-get update?)"
say "kernel package $pkg"
(cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || die "apt-get download $pkg failed"
dpkg-deb -x "$work"/"$pkg"_*.deb "$work/kernel"
kver=$(ls "$work/kernel/lib/modules")
mods="$work/kernel/lib/modules/$kver"

# virtio-net and what it needs, in load order: a module's needs are in its .modinfo
# (`depends=a,b`; the package leaves modules.dep to the installing system's depmod).
root="$work/root"
mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,mods}
order=()
module_path() { (cd "$mods" && find kernel -name "$1.ko*" | head -n1); }
add_module() {
    local name=$1 rel dep have
    for have in "${order[@]:-}"; do [ "$have" = "$name" ] && return 0; done
    rel=$(module_path "$name")
    [ -n "$rel" ] || die "module $name not found in $kver"
    for dep in $(tr '\0' '\n' <"$mods/$rel" | sed -n 's/^depends=//p' | tr ',' ' '); do
        add_module "$dep"
    done
    order+=("$name")
}
add_module virtio_pci
add_module virtio_net
: >"$root/mods/order"
for mod in "${order[@]}"; do
    [ -n "$mod" ] || continue
    rel=$(module_path "$mod")
    name=$(basename "$rel")
    case "$name" in
        *.xz) xz -dc "$mods/$rel" >"$root/mods/${name%.xz}"; name=${name%.xz} ;;
        *.zst) zstd -qdc "$mods/$rel" >"$root/mods/${name%.zst}"; name=${name%.zst} ;;
        *) cp "$mods/$rel" "$root/mods/$name" ;;
    esac
    echo "$name" >>"$root/mods/order"
done
say "modules: $(tr '\n' ' ' <"$root/mods/order")"

cp "$busybox" "$root/bin/busybox"

# A dynamically linked host program and every shared library it loads (ldd's paths,
# the loader's included), at the same paths in the guest.
add_program() {
    local bin lib
    bin=$(command -v "$1") || { say "no $1 on this host: the guest has none"; return 0; }
    cp "$bin" "$root/bin/$1"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*' | sort -u); do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
    say "added $1 and $(ldd "$bin" | grep -c '/') libraries"
}
add_program iperf3
add_program sockperf
cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
for m in $(cat /mods/order); do insmod /mods/$m || echo "FERRY-GUEST-ERROR insmod $m"; done
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p" | tail -n1; }
ip link set lo up
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
mtu=$(arg ferry.mtu)
[ -n "$mtu" ] && ip link set eth0 mtu "$mtu"
ip link set eth0 up
[ -n "$(arg ferry.ip)" ] && ip addr add "$(arg ferry.ip)" dev eth0
[ -n "$(arg ferry.gw)" ] && ip route add default via "$(arg ferry.gw)"
echo FERRY-GUEST-READY
arg ferry.run | base64 -d >/run.sh 2>/dev/null
sh /run.sh
echo "FERRY-GUEST-EXIT $?"
poweroff -f
EOF
chmod 0755 "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.img"
cp "$work/kernel/boot/vmlinuz-$kver" "$work/vmlinuz"
mv "$work/initrd.img" "$out/initrd.img"
mv "$work/vmlinuz" "$out/vmlinuz"
echo "$stamp" >"$out/stamp"
say "wrote $out/vmlinuz ($kver) and $out/initrd.img"
