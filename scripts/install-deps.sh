#!/usr/bin/env bash
# Installs what ferry's tests and benchmarks use, on Debian/Ubuntu, as root.
# Idempotent: packages already present are not reinstalled (set FERRY_APT_UPDATE=1 to
# run apt-get anyway), services are stopped again, the user and device are only
# created when missing.
#
#   scripts/install-deps.sh
#
# Does: apt-get update + install (no recommends, no auto-started services); installs
# cargo-fuzz (pinned; scripts/fuzz.sh) unless that version is there; stops and
# disables redis-server, nginx and iperf3 so they hold no ports; creates the
# unprivileged user `ferrytest` (for running ferry as an ordinary user); makes
# /dev/net/tun usable (mode 0666); lets every group make ICMP echo ("ping") sockets
# (net.ipv4.ping_group_range, as systemd's defaults do: nic mode relays the sandbox's
# ping through them); reports whether unprivileged user namespaces work.
set -euo pipefail

PACKAGES=(
    iperf3 sockperf nginx-light redis-server redis-tools slirp4netns passt wrk hyperfine
    uidmap curl iproute2 procps fonts-dejavu-core python3 gzip g++ iputils-ping
    bind9-dnsutils socat netcat-openbsd nodejs golang-go busybox-static git openssh-client
    libpython3.11-testsuite linux-perf make docker.io podman qemu-system-x86 cpio
    postgresql
)
SERVICES=(redis-server nginx iperf3 docker containerd postgresql)
# postgresql (its server and pgbench): `ferry bench R2` runs pgbench against a
# cluster of its own (the package's cluster and service are left stopped).
# linux-perf: `ferry bench R2` counts system calls per request with perf record; make:
# scripts/build-peers.sh builds the newest pasta from a source tree.
# docker.io (with containerd, runc) and podman: `ferry oci`'s tests start their own
# dockerd (no service is started here) and run podman with their own storage.
# libpython3.11-testsuite: CPython's own regression tests for Debian's python3
# (scripts/cpython-suites.py runs its network suites natively and through ferry).
# qemu-system-x86, cpio: `ferry vm`'s tests boot a guest (scripts/guest-image.sh builds
# it from Debian's cloud kernel package and busybox-static) under QEMU's TCG.
# The fuzz targets' runner (scripts/fuzz.sh); libfuzzer-sys builds with g++.
CARGO_FUZZ_VERSION=0.13.1
TEST_USER=ferrytest
# Where the script adds Debian's backports when a package from there needs its kin.
FERRY_BACKPORTS_SOURCES=/etc/apt/sources.list.d/ferry-backports.sources

say() { printf 'install-deps: %s\n' "$*"; }
die() { printf 'install-deps: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v apt-get >/dev/null || die "apt-get not found (Debian/Ubuntu only)"

# --- packages -----------------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ] && [ "${FERRY_APT_UPDATE:-0}" != 1 ]; then
    say "all packages already installed: ${PACKAGES[*]}"
else
    say "missing packages: ${missing[*]:-(none; FERRY_APT_UPDATE=1)}"
    # Keep maintainer scripts from starting daemons during the install (policy-rc.d
    # exit 101 = "action forbidden"). Only if the admin has no policy of their own.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        own_policy=1
        trap '[ "$own_policy" = 1 ] && rm -f "$policy"' EXIT
        say "installed temporary $policy (no service starts during install)"
    fi
    export DEBIAN_FRONTEND=noninteractive
    say "apt-get update"
    apt-get update
    # QEMU's packages must be of one version: where qemu-utils came from backports
    # (as on machines with a newer qemu-img), the system emulator comes from there too,
    # or apt would pick the release's and refuse the pair ("Breaks").
    wanted=() later=()
    utils=$(dpkg-query -W -f='${Status} ${Version}' qemu-utils 2>/dev/null \
        | sed -n 's/^install ok installed //p')
    for p in "${PACKAGES[@]}"; do
        case "$p:$utils" in
            qemu-system-x86:*bpo*) later+=("$p") ;;
            *) wanted+=("$p") ;;
        esac
    done
    say "apt-get install -y --no-install-recommends ${wanted[*]}"
    apt-get install -y --no-install-recommends "${wanted[@]}"
    if [ "${#later[@]}" -gt 0 ]; then
        suite="$(. /etc/os-release && echo "$VERSION_CODENAME")-backports"
        if ! apt-cache policy | grep -q "a=$suite,\|n=$suite,"; then
            # A machine can carry a package from backports without the suite in its
            # sources: add Debian's (the release's own keyring signs it).
            say "adding $suite to apt's sources ($FERRY_BACKPORTS_SOURCES)"
            printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                "$suite" >"$FERRY_BACKPORTS_SOURCES"
            apt-get update
        fi
        say "apt-get install -t $suite ${later[*]} (qemu-utils $utils is from there)"
        apt-get install -y --no-install-recommends -t "$suite" "${later[@]}"
    fi
    if [ "$own_policy" = 1 ]; then
        rm -f "$policy"
        own_policy=0
        say "removed temporary $policy"
    fi
fi

for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' \
        || die "package $p is not installed"
done

# --- cargo-fuzz ------------------------------------------------------------------------
if cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
    say "cargo-fuzz $CARGO_FUZZ_VERSION already installed"
else
    command -v cargo >/dev/null || die "cargo not found (install Rust first)"
    say "cargo install --locked cargo-fuzz@$CARGO_FUZZ_VERSION"
    cargo install --locked "cargo-fuzz@$CARGO_FUZZ_VERSION"
fi

# --- services: stopped and disabled, so they hold no ports ---------------------------
systemd_running=0
[ -d /run/systemd/system ] && systemd_running=1
for s in "${SERVICES[@]}"; do
    [ -e "/etc/init.d/$s" ] || [ -e "/lib/systemd/system/$s.service" ] || continue
    if [ "$systemd_running" = 1 ]; then
        systemctl stop "$s" >/dev/null 2>&1 || true
        systemctl disable "$s" >/dev/null 2>&1 || true
    else
        service "$s" stop >/dev/null 2>&1 || true
        update-rc.d "$s" disable >/dev/null 2>&1 || true
    fi
    say "service $s stopped and disabled"
done
# A system dockerd would change the firewall (FORWARD DROP) and make docker0 under the
# other tests: its socket activation is off too.
if [ "$systemd_running" = 1 ] && [ -e /lib/systemd/system/docker.socket ]; then
    systemctl disable --now docker.socket >/dev/null 2>&1 || true
fi
# A daemon the packages started that the service command did not stop is killed by
# the pid in its pidfile (never by name: hand-started instances are left alone).
for pidfile in /run/redis/redis-server.pid /run/nginx.pid /run/iperf3.pid; do
    [ -r "$pidfile" ] || continue
    pid=$(cat "$pidfile" 2>/dev/null || true)
    case "$pid" in '' | *[!0-9]*) continue ;; esac
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        sleep 0.5
        kill -KILL "$pid" 2>/dev/null || true
        say "killed daemon $pid from $pidfile"
    fi
done

# --- unprivileged test user -----------------------------------------------------------
if id "$TEST_USER" >/dev/null 2>&1; then
    say "user $TEST_USER exists (uid $(id -u "$TEST_USER"))"
else
    useradd --create-home --shell /bin/bash --comment "ferry tests" "$TEST_USER" \
        || die "useradd $TEST_USER failed"
    say "created user $TEST_USER (uid $(id -u "$TEST_USER"))"
fi

# --- /dev/net/tun ---------------------------------------------------------------------
if [ ! -e /dev/net/tun ]; then
    mkdir -p /dev/net
    mknod /dev/net/tun c 10 200 || die "cannot create /dev/net/tun"
    say "created /dev/net/tun"
fi
[ -c /dev/net/tun ] || die "/dev/net/tun exists but is not a character device"
chmod 0666 /dev/net/tun || die "cannot chmod /dev/net/tun"
say "/dev/net/tun is mode 0666"

# --- ping sockets ----------------------------------------------------------------------
# nic mode answers the sandbox's echo requests through unprivileged ICMP sockets; most
# distributions allow them to every group (systemd's 50-default.conf), a bare container
# allows none.
ping_knob=/proc/sys/net/ipv4/ping_group_range
if [ -w "$ping_knob" ]; then
    echo "0 2147483647" >"$ping_knob" || say "warning: cannot set $ping_knob"
    say "ping sockets allowed to every group ($ping_knob: $(cat "$ping_knob" | tr '\t' ' '))"
fi

# --- report: unprivileged user namespaces ---------------------------------------------
clone_knob=/proc/sys/kernel/unprivileged_userns_clone
if [ -r "$clone_knob" ] && [ "$(cat "$clone_knob")" = 0 ]; then
    say "warning: $clone_knob is 0; enable with: sysctl -w kernel.unprivileged_userns_clone=1"
fi
if command -v setpriv >/dev/null \
    && setpriv --reuid="$TEST_USER" --regid="$TEST_USER" --clear-groups \
        unshare --user --map-root-user --net true 2>/dev/null; then
    say "unprivileged user and network namespaces work for $TEST_USER"
else
    say "warning: $TEST_USER cannot create user+network namespaces (rootless tests will skip)"
fi
say "done"
