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

# The cluster's CA is the one the host made (vagrant/.cluster/ca.crt, ca.key): the workers pin
# its public key when they join, without asking this machine for anything.
install_cluster_ca() {
    local pki=/etc/kubernetes/pki
    [[ -s $CLUSTER_DIR/ca.crt && -s $CLUSTER_DIR/ca.key ]] ||
        die "$CLUSTER_DIR/ca.crt or ca.key is missing (the Vagrantfile makes them before \`vagrant up\`)"
    if [[ -f $pki/ca.crt ]]; then
        cmp -s "$pki/ca.crt" "$CLUSTER_DIR/ca.crt" ||
            die "this cluster's CA is not vagrant/.cluster/ca.crt (made for another cluster?): \`vagrant destroy -f\` and \`vagrant up\` start afresh"
        return
    fi
    install -d -m 0755 "$pki"
    install -m 0644 "$CLUSTER_DIR/ca.crt" "$pki/ca.crt"
    install -m 0600 "$CLUSTER_DIR/ca.key" "$pki/ca.key"
}

init_cluster() {
    local token=$1
    if [[ -f /etc/kubernetes/admin.conf ]]; then
        log "kubeadm init already ran; keeping the cluster"
        install_cluster_ca
        return
    fi
    if [[ -e /etc/kubernetes/manifests/kube-apiserver.yaml ]]; then
        log "an earlier kubeadm init stopped half-way; resetting it"
        kubeadm reset -f
    fi
    install_cluster_ca
    log "kubeadm init ($K8S_VERSION), kube-proxy skipped: ipvsproxy replaces it"
    # The addresses are the private network's: kubeadm would otherwise advertise the NAT
    # interface's (the default route), which other machines cannot reach.
    kubeadm init \
        --apiserver-advertise-address="$NODE_IP" \
        --control-plane-endpoint="$CP_IP:6443" \
        --node-name="$NODE_NAME" \
        --pod-network-cidr="$POD_CIDR" \
        --service-cidr="$SERVICE_CIDR" \
        --token="$token" --token-ttl=4h \
        --skip-phases=addon/kube-proxy
}

# kubectl for root and the vagrant user on this machine (the host copies the admin kubeconfig
# out over SSH: a Vagrant trigger).
export_kubeconfig() {
    install -d -m 0700 /root/.kube
    install -m 0600 /etc/kubernetes/admin.conf /root/.kube/config
    if id vagrant >/dev/null 2>&1; then
        install -d -m 0700 -o vagrant -g vagrant /home/vagrant/.kube
        install -m 0600 -o vagrant -g vagrant /etc/kubernetes/admin.conf /home/vagrant/.kube/config
    fi
}

# The lab's bootstrap token valid for 4 h from now (tokens expire; a worker made later joins
# after a `vagrant provision cp`).
refresh_bootstrap_token() {
    local token=$1
    kubeadm token delete "${token%%.*}" >/dev/null 2>&1 || true
    kubeadm token create "$token" --ttl 4h >/dev/null
    log "bootstrap token from vagrant/.cluster valid for 4 h"
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
    install -m 0644 "$overlay/ipvsproxy.env" "$PROXY_ENV"
}

token=$(read_bootstrap_token)
prepare_node
build_and_import_image
init_cluster "$token"
export KUBECONFIG=/etc/kubernetes/admin.conf
wait_for 300 "the API server to be ready" kubectl get --raw=/readyz
export_kubeconfig
refresh_bootstrap_token "$token"
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
log "control plane ready; workers join with the bootstrap token in vagrant/.cluster"
