#!/bin/sh
# ipvsproxy's container entrypoint: /usr/local/bin/ipvsproxy-entrypoint COMMAND [ARGS...]
#
# 1. Points iptables, iptables-save and iptables-restore (and the ip6tables ones) at the
#    backend the host uses, legacy or nft. Rules written through the other backend would land
#    in a separate ruleset the host's packets never meet. The choice is made as upstream's
#    images make it (kubernetes-sigs/iptables-wrappers): the kubelet's hint chains
#    (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY in the mangle table) decide if present;
#    otherwise the backend holding more rules wins, nft on a tie.
#    IPVSPROXY_IPTABLES_MODE=legacy|nft skips the detection.
#    Nothing in the image is written: the plain names are symbolic links in
#    $IPVSPROXY_RUN_DIR/bin (default /run/ipvsproxy/bin, an emptyDir in the DaemonSet), which
#    comes first in PATH (the image's PATH has it too, so `kubectl exec` finds the same
#    backend). ipvsproxy runs iptables-restore, iptables-save and iptables by name through
#    PATH. The root filesystem can be read-only.
#    Not as root (the image's default user, for `ipvsproxy version` and the like) there is no
#    kernel to program and nothing is linked.
# 2. For `ipvsproxy run ...`: writes the kernel settings ipvsproxy needs (net.ipv4.vs.*,
#    ip_forward, the conntrack limits) through the host's /proc/sys/net mounted at
#    $IPVSPROXY_HOST_PROC_SYS/net (default /host/proc/sys/net), because an unprivileged
#    container's own /proc/sys is read-only. prepare_sysctls.py computes them from the same
#    arguments, with ipvsproxy's own code. Without that mount (a privileged pod), ipvsproxy
#    writes them itself.
# 3. Execs COMMAND.
#
# POSIX sh only: the image's /bin/sh is dash.

set -eu

log() {
    echo "ipvsproxy-entrypoint: $*" >&2
}

# Lines of stdin matching the extended regular expression $1 (0 when none: grep -c then exits 1).
count_lines() {
    grep -c -E -e "$1" || true
}

hint_chains='^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) '

# Prints "legacy" or "nft": the backend the host's iptables rules live in.
detect_mode() {
    nft_hints=$({ iptables-nft-save -t mangle || true; ip6tables-nft-save -t mangle || true; } 2>/dev/null | count_lines "$hint_chains")
    if [ "$nft_hints" -gt 0 ]; then
        echo nft
        return
    fi
    # Not `-t mangle` here: iptables-legacy-save would create the table in the kernel.
    legacy_rules=$({ iptables-legacy-save || true; ip6tables-legacy-save || true; } 2>/dev/null)
    legacy_hints=$(printf '%s\n' "$legacy_rules" | count_lines "$hint_chains")
    if [ "$legacy_hints" -gt 0 ]; then
        echo legacy
        return
    fi
    legacy_count=$(printf '%s\n' "$legacy_rules" | count_lines '^-')
    nft_count=$({ iptables-nft-save || true; ip6tables-nft-save || true; } 2>/dev/null | count_lines '^-')
    if [ "$legacy_count" -gt "$nft_count" ]; then
        echo legacy
    else
        echo nft
    fi
}

run_dir=${IPVSPROXY_RUN_DIR:-/run/ipvsproxy}
bin_dir=$run_dir/bin

# Links the plain names to $mode's binaries (Debian's iptables package installs all of them).
link_backend() {
    mkdir -p "$bin_dir" || return 1
    for family in iptables ip6tables; do
        for suffix in "" -save -restore; do
            ln -sfn "/usr/sbin/$family-$mode$suffix" "$bin_dir/$family$suffix" || return 1
        done
    done
}

mode=${IPVSPROXY_IPTABLES_MODE:-}
case "$mode" in
    "" | legacy | nft) ;;
    *)
        log "IPVSPROXY_IPTABLES_MODE must be legacy or nft, not '$mode'"
        exit 1
        ;;
esac
if [ "$(id -u)" -ne 0 ]; then
    log "not root: no iptables backend chosen (commands that program the kernel need root)"
else
    if [ -z "$mode" ]; then
        mode=$(detect_mode)
        why="detected from the host's rules"
    else
        why="set by IPVSPROXY_IPTABLES_MODE"
    fi
    if ! link_backend; then
        log "cannot link the $mode backend's iptables commands in $bin_dir (is $run_dir writable?)"
        exit 1
    fi
    case ":$PATH:" in
        *":$bin_dir:"*) ;;
        *) PATH="$bin_dir:$PATH" ;;
    esac
    export PATH
    log "iptables backend: $mode ($why)"
fi

if [ "$#" -eq 0 ]; then
    set -- ipvsproxy run
fi

host_proc_sys=${IPVSPROXY_HOST_PROC_SYS:-/host/proc/sys}
if [ "$1" = ipvsproxy ] && [ "${2:-}" = run ] && [ -d "$host_proc_sys/net" ]; then
    # A failure here is reported, not fatal: ipvsproxy then tries the writes itself and names
    # what it could not set.
    (
        shift 2
        python3 /usr/local/lib/ipvsproxy/prepare_sysctls.py "$host_proc_sys" "$@"
    ) || log "could not prepare the kernel settings through $host_proc_sys/net"
fi

exec "$@"
