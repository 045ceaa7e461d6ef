#!/usr/bin/env bash
# A worker of the lab: the same node preparation and image build as the control plane, then
# kubeadm join with the command the control plane wrote to the shared folder, and the check
# that ipvsproxy programs this node. Run by the Vagrantfile as root; a second run finds the
# node joined and only rebuilds the image and re-checks.
#
# Settings (environment, from the Vagrantfile): NODE_NAME NODE_IP CP_IP NETWORK_PREFIX
# LAB_NODES K8S_VERSION IMAGE JOIN_TIMEOUT
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

require_env NODE_NAME NODE_IP CP_IP IMAGE
JOIN_TIMEOUT=${JOIN_TIMEOUT:-2400}

# The join command from the control plane, if it is there and has the expected shape.
read_join_command() {
    local file="$CLUSTER_DIR/join-command" cmd
    [[ -f $file ]] || return 1
    cmd=$(head -n 1 "$file")
    [[ $cmd =~ $JOIN_COMMAND_RE ]] || {
        log "ignoring $file: not a kubeadm join command"
        return 1
    }
    printf '%s\n' "$cmd"
}

# With `vagrant up` on libvirt the machines come up in parallel, so the control plane may not
# be ready yet, and a join command left from an earlier cluster fails: retry until the
# control plane has written a current one.
join_cluster() {
    if [[ -f /etc/kubernetes/kubelet.conf ]]; then
        log "already joined; keeping the node"
        return
    fi
    local deadline=$((SECONDS + JOIN_TIMEOUT)) cmd
    local -a join
    log "waiting for the control plane's join command in vagrant/.cluster/join-command"
    while :; do
        if cmd=$(read_join_command); then
            read -ra join <<<"$cmd"
            log "kubeadm join ${join[2]}"
            if "${join[@]}" --node-name="$NODE_NAME"; then
                return
            fi
            log "kubeadm join failed; resetting and retrying"
            kubeadm reset -f >/dev/null 2>&1 || true
        fi
        ((SECONDS < deadline)) || die "could not join within ${JOIN_TIMEOUT}s (is the control plane 'cp' up and provisioned?)"
        sleep 15
    done
}

prepare_node
build_and_import_image
join_cluster
export KUBECONFIG="$CLUSTER_DIR/admin.conf"
wait_for 120 "the admin kubeconfig in vagrant/.cluster" test -s "$KUBECONFIG"
wait_for 120 "node $NODE_NAME to register" kubectl get node "$NODE_NAME"
kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=600s
wait_for 1800 "the control plane to deploy ipvsproxy (vagrant/.cluster/ipvsproxy.env)" \
    test -s "$CLUSTER_DIR/ipvsproxy.env"
wait_ipvsproxy_rollout
check_kubernetes_service
log "worker $NODE_NAME ready"
