#!/usr/bin/env bash
# The lab's control plane: kubeadm init without kube-proxy, flannel (host-gw) for the pod
# network, then ipvsproxy from deploy/ with the cluster's own pod CIDR, and the checks that it
# works. Run by the Vagrantfile as root on `vagrant up` and `vagrant provision`; a second run
# keeps the cluster and re-applies (and, with a changed image, restarts) what it deployed.
#
# Settings (environment, from the Vagrantfile): NODE_NAME NODE_IP CP_IP NETWORK_PREFIX
# LAB_NODES K8S_VERSION POD_CIDR SERVICE_CIDR FLANNEL_VERSION IMAGE PRIVILEGED
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

require_env NODE_NAME NODE_IP CP_IP POD_CIDR SERVICE_CIDR FLANNEL_VERSION IMAGE NETWORK_PREFIX
[[ $NODE_IP == "$CP_IP" ]] || die "the control plane's NODE_IP ($NODE_IP) must be CP_IP ($CP_IP)"

init_cluster() {
    if [[ -f /etc/kubernetes/admin.conf ]]; then
        log "kubeadm init already ran; keeping the cluster"
        return
    fi
    if [[ -e /etc/kubernetes/manifests/kube-apiserver.yaml ]]; then
        log "an earlier kubeadm init stopped half-way; resetting it"
        kubeadm reset -f
    fi
    # A new cluster: the previous one's join command and kubeconfig would mislead the workers.
    rm -f "$CLUSTER_DIR/join-command" "$CLUSTER_DIR/admin.conf" "$CLUSTER_DIR/ipvsproxy.env"
    log "kubeadm init ($K8S_VERSION), kube-proxy skipped: ipvsproxy replaces it"
    # The addresses are the private network's: kubeadm would otherwise advertise the NAT
    # interface's (the default route), which other machines cannot reach.
    kubeadm init \
        --apiserver-advertise-address="$NODE_IP" \
        --control-plane-endpoint="$CP_IP:6443" \
        --node-name="$NODE_NAME" \
        --pod-network-cidr="$POD_CIDR" \
        --service-cidr="$SERVICE_CIDR" \
        --skip-phases=addon/kube-proxy
}

# kubectl for root and the vagrant user on this machine, and for the host and the workers
# through the shared folder.
export_kubeconfig() {
    install -d -m 0700 /root/.kube "$CLUSTER_DIR"
    install -m 0600 /etc/kubernetes/admin.conf /root/.kube/config
    if id vagrant >/dev/null 2>&1; then
        install -d -m 0700 -o vagrant -g vagrant /home/vagrant/.kube
        install -m 0600 -o vagrant -g vagrant /etc/kubernetes/admin.conf /home/vagrant/.kube/config
    fi
    install -m 0600 /etc/kubernetes/admin.conf "$CLUSTER_DIR/admin.conf"
}

# A fresh token on every provision (tokens expire); the workers poll for this file.
write_join_command() {
    local cmd
    cmd=$(kubeadm token create --ttl 4h --print-join-command)
    [[ $cmd =~ $JOIN_COMMAND_RE ]] || die "unexpected join command from kubeadm: $cmd"
    printf '%s\n' "$cmd" >"$CLUSTER_DIR/join-command.tmp"
    chmod 0600 "$CLUSTER_DIR/join-command.tmp"
    mv -f "$CLUSTER_DIR/join-command.tmp" "$CLUSTER_DIR/join-command"
    log "join command written to vagrant/.cluster/join-command"
}

# The pod CIDR kubeadm actually used, read back from the cluster (not from POD_CIDR: a
# re-provision with another POD_CIDR does not change an existing cluster).
cluster_cluster_cidr() {
    kubectl -n kube-system get configmap kubeadm-config -o jsonpath='{.data.ClusterConfiguration}' |
        python3 "$PROVISION_DIR/overlay.py" pod-subnet
}

# flannel's own manifest through an overlay: host-gw on the pod CIDR, on the private network,
# and KUBERNETES_SERVICE_HOST/PORT pointing at the control plane's real address. flannel
# must not depend on the `kubernetes` Service's cluster IP: that address only works once
# ipvsproxy runs, and pods other than ipvsproxy's (host network) need flannel first.
deploy_flannel() {
    local cidr=$1 manifest="$STATE_DIR/kube-flannel-$FLANNEL_VERSION.yml"
    if [[ ! -s $manifest ]]; then
        log "downloading flannel $FLANNEL_VERSION's manifest"
        curl -fsSL -o "$manifest.tmp" \
            "https://github.com/flannel-io/flannel/releases/download/$FLANNEL_VERSION/kube-flannel.yml"
        mv -f "$manifest.tmp" "$manifest"
    fi
    python3 "$PROVISION_DIR/overlay.py" flannel \
        --manifest "$manifest" --out "$STATE_DIR/flannel-overlay" \
        --pod-cidr "$cidr" --api-server "$CP_IP:6443" --iface-regex "$(private_iface_regex)"
    kubectl apply -k "$STATE_DIR/flannel-overlay"
}

# deploy/ as it is, through an overlay that sets the KubeProxyConfiguration's clusterCIDR to
# the cluster's and the API server address ipvsproxy uses before any Service works.
# PRIVILEGED=1 runs the container privileged (deploy/README.md, "Privileges").
deploy_ipvsproxy() {
    local cidr=$1 overlay="$STATE_DIR/ipvsproxy-overlay"
    local -a extra=()
    if [[ ${PRIVILEGED:-0} == 1 ]]; then
        extra+=(--privileged)
    fi
    python3 "$PROVISION_DIR/overlay.py" ipvsproxy \
        --base "$REPO_DIR/deploy" --out "$overlay" "${extra[@]}" \
        --cluster-cidr "$cidr" --api-server "$CP_IP:6443" --image "$IMAGE" >/dev/null
    log "kubectl apply -k $REPO_DIR/deploy (through $overlay: clusterCIDR $cidr, API server $CP_IP:6443)"
    kubectl apply -k "$overlay"
    install -m 0644 "$overlay/ipvsproxy.env" "$CLUSTER_DIR/ipvsproxy.env"
}

prepare_node
build_and_import_image
init_cluster
export KUBECONFIG=/etc/kubernetes/admin.conf
wait_for 300 "the API server to be ready" kubectl get --raw=/readyz
export_kubeconfig
write_join_command
cluster_cidr=$(cluster_cluster_cidr)
log "cluster pod CIDR (kubeadm's podSubnet): $cluster_cidr"
deploy_flannel "$cluster_cidr"
deploy_ipvsproxy "$cluster_cidr"
wait_ipvsproxy_rollout
kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds --timeout=600s
kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=600s
check_kubernetes_service
# CoreDNS reaches the API server through the `kubernetes` Service's cluster IP from a pod, on
# the pod network: its becoming ready shows flannel and ipvsproxy working together.
log "waiting for CoreDNS (it needs the kubernetes Service's cluster IP from a pod)"
kubectl -n kube-system rollout status deployment/coredns --timeout=600s
log "control plane ready; workers join with vagrant/.cluster/join-command"
