#!/usr/bin/env bash
# A worker of the lab: the same node preparation and image build as the control plane, then
# kubeadm join with the bootstrap token the host made (vagrant/.cluster/bootstrap-token),
# pinning the cluster CA's public key (vagrant/.cluster/ca.crt), and the check that ipvsproxy
# programs this node. Nothing is read from the control plane but what kubeadm fetches: the
# worker needs no share the control plane writes to. Run by the Vagrantfile as root; a second
# run finds the node joined and only rebuilds the image and re-checks.
#
# Settings (environment, from the Vagrantfile): NODE_NAME NODE_IP CP_IP NETWORK_PREFIX
# LAB_NODES K8S_VERSION IMAGE JOIN_TIMEOUT
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

require_env NODE_NAME NODE_IP CP_IP IMAGE
JOIN_TIMEOUT=${JOIN_TIMEOUT:-2400}

# Where deploy/ puts ipvsproxy (namespace, DaemonSet, container), read from deploy/ itself:
# the names the control plane deploys under.
write_proxy_target() {
    local target
    target=$(python3 "$PROVISION_DIR/overlay.py" target --base "$REPO_DIR/deploy" --image "$IMAGE") ||
        die "overlay.py found no ipvsproxy container in $REPO_DIR/deploy"
    install_file 0644 "$PROXY_ENV" <<<"$target" || true
}

# With `vagrant up` on libvirt the machines come up in parallel, so the control plane's API
# server may not answer yet (or the token may have expired: `vagrant provision cp` renews
# it): retry until the join succeeds.
join_cluster() {
    if [[ -f /etc/kubernetes/kubelet.conf ]]; then
        log "already joined; keeping the node"
        return
    fi
    local token hash deadline=$((SECONDS + JOIN_TIMEOUT))
    token=$(read_bootstrap_token)
    hash=$(ca_cert_hash "$CLUSTER_DIR/ca.crt")
    log "joining $CP_IP:6443 (CA public key sha256:$hash)"
    until kubeadm join "$CP_IP:6443" --token "$token" \
        --discovery-token-ca-cert-hash "sha256:$hash" --node-name="$NODE_NAME"; do
        ((SECONDS < deadline)) ||
            die "could not join within ${JOIN_TIMEOUT}s (is 'cp' up and provisioned? \`vagrant provision cp\` renews an expired token)"
        log "kubeadm join failed; resetting and retrying"
        kubeadm reset -f >/dev/null 2>&1 || true
        sleep 15
    done
}

prepare_node
write_proxy_target
build_and_import_image
join_cluster
# The node's own credentials: enough to read its Node and the Services (Node authorization).
export KUBECONFIG=/etc/kubernetes/kubelet.conf
wait_for 120 "node $NODE_NAME to register" kubectl get node "$NODE_NAME"
kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=600s
log "waiting for this node's ipvsproxy container (the control plane deploys the DaemonSet)"
wait_for 1800 "the ipvsproxy container to run on $NODE_NAME" local_ipvsproxy_running
check_kubernetes_service
log "worker $NODE_NAME ready"
