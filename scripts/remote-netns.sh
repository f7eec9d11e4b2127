#!/usr/bin/env bash
# A "remote host" for manual tests and benchmarks: network namespace NAME joined to the
# host by a veth pair (the shell twin of ferry_sandbox::testbed::Remote). Root only.
#
#   scripts/remote-netns.sh up     [NAME] [HOST_IP] [REMOTE_IP]
#   scripts/remote-netns.sh down   [NAME]
#   scripts/remote-netns.sh status [NAME]
#
# Defaults: NAME=ferry-remote HOST_IP=10.77.0.1 REMOTE_IP=10.77.0.2, PREFIX=24 (env).
# Then e.g.:  ip netns exec ferry-remote iperf3 -s -1 &  iperf3 -c 10.77.0.2
# Interfaces: fsh<hash> on the host, fsr<hash> in NAME (hash: 8 hex of cksum(NAME)).
# `up` on an existing namespace and `down` on a missing one do nothing and succeed.
set -euo pipefail

usage() {
    sed -n '5,7p' "$0" | sed 's/^#   /usage: /' >&2
    exit 2
}
say() { printf 'remote-netns: %s\n' "$*"; }
die() { printf 'remote-netns: error: %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || usage
action=$1
name=${2:-ferry-remote}
host_ip=${3:-10.77.0.1}
remote_ip=${4:-10.77.0.2}
prefix=${PREFIX:-24}

[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v ip >/dev/null || PATH=$PATH:/usr/sbin:/sbin
command -v ip >/dev/null || die "ip (iproute2) not found"
case "$name" in '' | */* | .*) die "invalid namespace name '$name'" ;; esac

hash=$(printf '%s' "$name" | cksum | awk '{ printf "%08x", $1 }')
host_if=fsh$hash
remote_if=fsr$hash

up() {
    if [ -e "/run/netns/$name" ]; then
        say "namespace $name already exists; nothing to do"
        status
        return
    fi
    # Undo whatever was created if a step fails.
    trap 'say "failed; cleaning up"; down >/dev/null 2>&1 || true' ERR
    ip netns add "$name"
    ip -n "$name" link set lo up
    ip link add "$host_if" type veth peer name "$remote_if" netns "$name"
    ip addr add "$host_ip/$prefix" dev "$host_if"
    ip link set "$host_if" up
    ip -n "$name" addr add "$remote_ip/$prefix" dev "$remote_if"
    ip -n "$name" link set "$remote_if" up
    trap - ERR
    say "up: $name; host $host_if $host_ip/$prefix <-> $remote_if $remote_ip/$prefix"
}

down() {
    if ip link show "$host_if" >/dev/null 2>&1; then
        ip link del "$host_if"
        say "deleted $host_if"
    fi
    if [ -e "/run/netns/$name" ]; then
        ip netns del "$name"
        say "deleted namespace $name"
    else
        say "namespace $name does not exist"
    fi
}

status() {
    if [ ! -e "/run/netns/$name" ]; then
        say "namespace $name does not exist"
        return 1
    fi
    ip -br addr show dev "$host_if" 2>/dev/null || say "host side $host_if missing"
    ip -n "$name" -br addr show
}

case "$action" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) usage ;;
esac
