#!/bin/sh
# Removes what upstream kube-proxy's IPv6 proxier (IPVS mode) leaves on a node that ipvsproxy,
# which is IPv4 only, has taken over: its jumps and chains in ip6tables' nat and filter tables
# and its KUBE-6-* ipsets, by upstream's names (pkg/proxy/ipvs). Nothing IPv4 is touched, and
# nothing of anyone else. Run as root on the node (or in a debug pod in its network namespace)
# once kube-proxy is stopped there; a second run finds nothing to do.
set -u

ip6t() { ip6tables -w 5 "$@" 2>/dev/null; }

# table, built-in chain, comment, target: upstream's iptablesJumpChain.
while IFS='|' read -r table chain comment target; do
    while ip6t -t "$table" -D "$chain" -m comment --comment "$comment" -j "$target"; do :; done
done <<'JUMPS'
nat|OUTPUT|kubernetes service portals|KUBE-SERVICES
nat|PREROUTING|kubernetes service portals|KUBE-SERVICES
nat|POSTROUTING|kubernetes postrouting rules|KUBE-POSTROUTING
filter|FORWARD|kubernetes forwarding rules|KUBE-FORWARD
filter|INPUT|kubernetes health check rules|KUBE-NODE-PORT
filter|INPUT|kube-proxy firewall rules|KUBE-PROXY-FIREWALL
filter|FORWARD|kube-proxy firewall rules|KUBE-PROXY-FIREWALL
filter|INPUT|kubernetes ipvs access filter|KUBE-IPVS-FILTER
filter|OUTPUT|kubernetes ipvs access filter|KUBE-IPVS-OUT-FILTER
JUMPS

NAT="KUBE-SERVICES KUBE-POSTROUTING KUBE-NODE-PORT KUBE-LOAD-BALANCER KUBE-MARK-MASQ"
FILTER="KUBE-FORWARD KUBE-NODE-PORT KUBE-PROXY-FIREWALL KUBE-SOURCE-RANGES-FIREWALL"
FILTER="$FILTER KUBE-IPVS-FILTER KUBE-IPVS-OUT-FILTER"
for c in $NAT; do ip6t -t nat -F "$c"; done
for c in $NAT; do ip6t -t nat -X "$c"; done
for c in $FILTER; do ip6t -t filter -F "$c"; done
for c in $FILTER; do ip6t -t filter -X "$c"; done

# Upstream's IPv6 set names (KUBE-6-..., cut to ipset's 31 characters), now unreferenced.
for s in LOOP-BACK CLUSTER-IP EXTERNAL-IP EXTERNAL-IP-LOCAL LOAD-BALANCER \
    LOAD-BALANCER-LOCAL LOAD-BALANCER-FW LOAD-BALANCER-SOURCE-CID LOAD-BALANCER-SOURCE-IP \
    NODE-PORT-TCP NODE-PORT-LOCAL-TCP NODE-PORT-UDP NODE-PORT-LOCAL-UDP NODE-PORT-SCTP-HASH \
    NODE-PORT-LOCAL-SCTP-HAS HEALTH-CHECK-NODE-PORT IPVS-IPS; do
    if ipset list -n "KUBE-6-$s" >/dev/null 2>&1; then
        ipset destroy "KUBE-6-$s" || echo "cannot destroy ipset KUBE-6-$s" >&2
    fi
done
