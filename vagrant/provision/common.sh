# shellcheck shell=bash
# Shared functions of the Vagrant lab's provisioning: sourced by control-plane.sh and worker.sh,
# never run on its own. Everything here is safe to run again on a provisioned machine
# (`vagrant provision`): files are rewritten only when their content changes, and services are
# restarted only then.
#
# The Vagrantfile passes the settings as environment variables; require_env names any that is
# missing instead of letting `set -u` fail on the first use.

REPO_DIR=${REPO_DIR:-/vagrant}
# shellcheck disable=SC2034 # used by the scripts that source this file
PROVISION_DIR="$REPO_DIR/vagrant/provision"
# Made on the host before any machine comes up, and synced host to guest with the rest of the
# repository: the cluster's bootstrap token and CA (ignored by git through vagrant/.gitignore).
# Nothing on a machine writes here: a one-way (rsync) share is enough.
CLUSTER_DIR="$REPO_DIR/vagrant/.cluster"
# Machine-local state of the lab (overlays, the staged build context, downloads).
STATE_DIR=/var/lib/ipvsproxy-lab
# Where ipvsproxy's DaemonSet and container are (IPVSPROXY_NAMESPACE=..., written by
# overlay.py from deploy/ on every node; the host copies the control plane's).
PROXY_ENV="$STATE_DIR/ipvsproxy.env"

# The modules IPVS mode needs, loaded now and at every boot; br_netfilter for bridged pod
# traffic to traverse iptables, overlay for containerd's snapshotter.
KERNEL_MODULES=(overlay br_netfilter ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack)

log() {
    printf '==> [%s] %s\n' "$(hostname)" "$*" >&2
}

die() {
    printf '==> [%s] ERROR: %s\n' "$(hostname)" "$*" >&2
    exit 1
}

require_env() {
    local name
    for name in "$@"; do
        [[ -n ${!name:-} ]] || die "$name is not set (the Vagrantfile passes it to the provisioner)"
    done
}

# wait_for SECONDS WHAT COMMAND...: run COMMAND every 5 s until it succeeds; fail naming WHAT.
wait_for() {
    local timeout=$1 what=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "last attempt at: $*"
            "$@" || true
            die "timed out after ${timeout}s waiting for $what"
        fi
        sleep 5
    done
}

# install_file MODE PATH: stdin becomes PATH unless PATH already has that content.
# Exit status 0 when the file changed, 1 when it was already so (callers restart on change).
install_file() {
    local mode=$1 path=$2 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        return 1
    fi
    # Explicit checks: a caller's `||` or `&&` switches `set -e` off in here.
    mkdir -p "$(dirname "$path")" || die "cannot create the directory of $path"
    install -m "$mode" "$tmp" "$path" || die "cannot write $path"
    rm -f "$tmp"
    return 0
}

apt_update() {
    DEBIAN_FRONTEND=noninteractive apt-get update -q
}

# apt_ensure [APT OPTIONS] PACKAGE...: install the packages that are not installed yet, and
# only those: a re-provision must not upgrade containerd or the kubelet under a running node.
apt_ensure() {
    local -a options=() missing=()
    local pkg
    for pkg in "$@"; do
        if [[ $pkg == -* ]]; then
            options+=("$pkg")
        elif ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    ((${#missing[@]} > 0)) || return 0
    log "installing ${missing[*]}"
    apt_update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confold \
        "${options[@]}" "${missing[@]}"
}

# Every node's name and private address, so the nodes find each other by name.
configure_hosts() {
    require_env LAB_NODES
    local entry name ip
    for entry in $LAB_NODES; do
        name=${entry%%=*}
        ip=${entry#*=}
        sed -i "/[[:space:]]${name}\$/{/^${ip//./\\.}[[:space:]]/!d}" /etc/hosts
        grep -qE "^${ip//./\\.}[[:space:]]+${name}\$" /etc/hosts ||
            printf '%s %s\n' "$ip" "$name" >>/etc/hosts
    done
}

# The kubelet refuses to start with swap on (failSwapOn, kubeadm's default).
disable_swap() {
    swapoff -a
    sed -i -E 's/^([^#].*[[:space:]]swap[[:space:]].*)$/# \1  # disabled by the ipvsproxy lab/' /etc/fstab
    local unit
    while read -r unit _; do
        if [[ -n $unit ]]; then
            systemctl mask --now "$unit" >/dev/null 2>&1 || true
        fi
    done < <(systemctl list-units --type=swap --all --plain --no-legend 2>/dev/null)
}

load_kernel_modules() {
    printf '%s\n' "# ipvsproxy lab: kubeadm prerequisites and IPVS" "${KERNEL_MODULES[@]}" |
        install_file 0644 /etc/modules-load.d/ipvsproxy-lab.conf || true
    local module
    for module in "${KERNEL_MODULES[@]}"; do
        modprobe "$module" || die "cannot load kernel module $module"
    done
}

configure_sysctls() {
    install_file 0644 /etc/sysctl.d/90-ipvsproxy-lab.conf <<'EOF' || true
# ipvsproxy lab: what kubeadm's preflight checks and pod networking need.
net.ipv4.ip_forward = 1
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
EOF
    sysctl -q -p /etc/sysctl.d/90-ipvsproxy-lab.conf
    [[ $(sysctl -n net.ipv4.ip_forward) == 1 ]] || die "net.ipv4.ip_forward did not turn on"
    [[ $(sysctl -n net.bridge.bridge-nf-call-iptables) == 1 ]] ||
        die "net.bridge.bridge-nf-call-iptables did not turn on (is br_netfilter loaded?)"
}

install_base_packages() {
    apt_ensure ca-certificates curl gpg rsync ipvsadm ipset iptables conntrack socat \
        python3 python3-yaml python3-venv
}

# buildah builds the image (no daemon, nothing left running). Without its recommendations:
# they ask for an OCI runtime package, and containerd.io already brings runc (and conflicts
# with Debian's).
install_builder() {
    apt_ensure --no-install-recommends buildah
}

# containerd from Docker's apt repository (package containerd.io): Kubernetes after 1.35
# needs containerd 2, which the distributions' own packages may not have yet.
install_containerd() {
    # shellcheck source=/dev/null
    . /etc/os-release
    local distro=${ID:?} codename=${VERSION_CODENAME:?} changed=0
    case $distro in
        debian | ubuntu) ;;
        *) die "the lab provisions Debian or Ubuntu boxes, not $distro" ;;
    esac
    install -d -m 0755 /etc/apt/keyrings
    if [[ ! -s /etc/apt/keyrings/docker.asc ]]; then
        curl -fsSL "https://download.docker.com/linux/$distro/gpg" -o /etc/apt/keyrings/docker.asc
    fi
    if printf 'deb [arch=%s signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/%s %s stable\n' \
        "$(dpkg --print-architecture)" "$distro" "$codename" |
        install_file 0644 /etc/apt/sources.list.d/docker.list; then
        apt_update
    fi
    apt_ensure containerd.io

    # containerd.io ships a config with the CRI plugin disabled: start from the full default,
    # with the systemd cgroup driver the kubelet uses (kubeadm's default).
    local config
    config=$(containerd config default | sed -E 's/^([[:space:]]*SystemdCgroup = )false/\1true/')
    grep -q 'SystemdCgroup = true' <<<"$config" ||
        die "could not set SystemdCgroup = true in containerd's default configuration"
    install_file 0644 /etc/containerd/config.toml <<<"$config" && changed=1
    install_file 0644 /etc/crictl.yaml <<'EOF' || true
runtime-endpoint: unix:///run/containerd/containerd.sock
image-endpoint: unix:///run/containerd/containerd.sock
EOF
    systemctl enable containerd >/dev/null
    if ((changed)); then
        systemctl restart containerd
    else
        systemctl start containerd
    fi
    wait_for 60 "containerd to answer" ctr version
    check_containerd_version
}

# Kubernetes 1.36 and later need containerd 2.x; say so instead of a kubelet that will not run.
check_containerd_version() {
    local version major k8s_minor=${K8S_VERSION#v1.}
    version=$(containerd --version | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1)
    major=${version%%.*}
    log "containerd $version"
    if ((k8s_minor >= 36 && major < 2)); then
        die "Kubernetes $K8S_VERSION needs containerd 2.x, the box has containerd $version"
    fi
}

# kubelet, kubeadm and kubectl of one minor release from pkgs.k8s.io, held at it.
install_kubernetes() {
    require_env K8S_VERSION NODE_IP
    local keyring=/etc/apt/keyrings/kubernetes-$K8S_VERSION.gpg
    install -d -m 0755 /etc/apt/keyrings
    if [[ ! -s $keyring ]]; then
        curl -fsSL "https://pkgs.k8s.io/core:/stable:/$K8S_VERSION/deb/Release.key" |
            gpg --batch --yes --dearmor -o "$keyring"
    fi
    if printf 'deb [signed-by=%s] https://pkgs.k8s.io/core:/stable:/%s/deb/ /\n' "$keyring" "$K8S_VERSION" |
        install_file 0644 /etc/apt/sources.list.d/kubernetes.list; then
        apt_update
    fi
    apt_ensure kubelet kubeadm kubectl
    apt-mark hold kubelet kubeadm kubectl >/dev/null

    # The node's address is the private-network one, not the provider's NAT address (the same
    # 10.0.2.15 on every VirtualBox machine). The packages' kubelet unit reads this file.
    if printf 'KUBELET_EXTRA_ARGS=--node-ip=%s\n' "$NODE_IP" |
        install_file 0644 /etc/default/kubelet; then
        if systemctl is-active --quiet kubelet; then
            systemctl restart kubelet
        fi
    fi
    systemctl enable kubelet >/dev/null
}

# Everything a node needs before kubeadm init or join.
prepare_node() {
    require_env NODE_NAME NODE_IP K8S_VERSION IMAGE
    [[ $K8S_VERSION =~ ^v1\.[0-9]+$ ]] || die "K8S_VERSION must look like v1.37, not $K8S_VERSION"
    [[ $(hostname) == "$NODE_NAME" ]] || hostnamectl set-hostname "$NODE_NAME"
    ip -4 -o addr show | grep -qF " $NODE_IP/" || die "no interface has the node address $NODE_IP"
    configure_hosts
    disable_swap
    load_kernel_modules
    configure_sysctls
    install_base_packages
    install_containerd
    install_builder
    install_kubernetes
    install -d -m 0755 "$STATE_DIR"
}

# The name the container runtime gives IMAGE (ipvsproxy:TAG is docker.io/library/ipvsproxy:TAG).
runtime_image_ref() {
    local ref=$1 first=${1%%/*}
    if [[ $ref != */* ]]; then
        echo "docker.io/library/$ref"
    elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
        echo "docker.io/$ref"
    else
        echo "$ref"
    fi
}

image_digest() {
    ctr -n k8s.io images ls "name==$(runtime_image_ref "$IMAGE")" 2>/dev/null | awk 'NR > 1 { print $3 }'
}

# Build ipvsproxy's image from the repository with deploy/Containerfile and import it into
# containerd's k8s.io namespace, where the kubelet finds it (the DaemonSet never pulls it).
# The build context is a copy of the repository without the host's virtual environment,
# caches and Git objects: they are large, useless in the image, and slow over the shared
# folder.
build_and_import_image() {
    require_env IMAGE
    local containerfile="$REPO_DIR/deploy/Containerfile"
    local context="$STATE_DIR/build-context" archive="$STATE_DIR/ipvsproxy-image.tar"
    [[ -f $containerfile ]] || die "$containerfile is missing: the repository is not synced to $REPO_DIR"
    # Short names in a FROM line resolve on Docker Hub, without a prompt.
    install_file 0644 /etc/containers/registries.conf.d/50-ipvsproxy-lab.conf <<'EOF' || true
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
EOF
    log "staging the build context in $context"
    mkdir -p "$context"
    rsync -a --delete \
        --exclude=/.git/ --exclude=/.venv/ --exclude=/.lab/ --exclude=/build/ --exclude=/dist/ \
        --exclude=/bench-results/ --exclude=.vagrant/ --exclude=.cluster/ \
        --exclude=.hypothesis/ --exclude=.pytest_cache/ --exclude=.mypy_cache/ \
        --exclude=.ruff_cache/ --exclude=.import_linter_cache/ --exclude='*.egg-info/' \
        --exclude=__pycache__/ \
        "$REPO_DIR/" "$context/"
    log "building $IMAGE with buildah from deploy/Containerfile"
    # chroot isolation and the host's network: no OCI runtime or CNI setup of buildah's own
    # is needed inside the VM, and nothing of buildah's lands in the node's iptables.
    buildah build --isolation chroot --network host --layers \
        -f "$context/deploy/Containerfile" -t "localhost/ipvsproxy-lab:build" "$context"
    rm -f "$archive"
    buildah push --quiet "localhost/ipvsproxy-lab:build" "docker-archive:$archive:$IMAGE"
    local before after
    before=$(image_digest)
    ctr -n k8s.io images import "$archive"
    rm -f "$archive"
    after=$(image_digest)
    [[ -n $after ]] || die "$(runtime_image_ref "$IMAGE") is not in containerd's k8s.io namespace after the import"
    log "imported $(runtime_image_ref "$IMAGE") ($after)"
    if [[ -n $before && $before != "$after" ]]; then
        restart_local_ipvsproxy
    fi
}

# After a re-provision built a new image under the same tag: stop this node's ipvsproxy
# container, and the kubelet starts it again from the new image (SIGTERM leaves the dataplane
# in place; the new process adopts it).
restart_local_ipvsproxy() {
    local container
    container=$(env_file_get "$PROXY_ENV" IPVSPROXY_CONTAINER) || return 0
    local ids
    ids=$(crictl ps -q --name "^$container\$" 2>/dev/null || true)
    if [[ -n $ids ]]; then
        log "new image: restarting the local $container container"
        # shellcheck disable=SC2086 # one container ID per word
        crictl stop $ids >/dev/null
    fi
}

# env_file_get FILE KEY: the value of KEY=VALUE in FILE (written by overlay.py), checked to be
# a Kubernetes name; the file is never sourced or evaluated.
env_file_get() {
    local file=$1 key=$2 value
    [[ -f $file ]] || return 1
    value=$(sed -n "s/^$key=//p" "$file" | head -n 1)
    [[ $value =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || return 1
    printf '%s\n' "$value"
}

# The ipvsproxy DaemonSet rolled out on every node that has joined so far.
wait_ipvsproxy_rollout() {
    local ns ds
    ns=$(env_file_get "$PROXY_ENV" IPVSPROXY_NAMESPACE) || die "$PROXY_ENV names no namespace"
    ds=$(env_file_get "$PROXY_ENV" IPVSPROXY_DAEMONSET) || die "$PROXY_ENV names no DaemonSet"
    log "waiting for DaemonSet $ns/$ds to roll out"
    kubectl -n "$ns" rollout status "daemonset/$ds" --timeout=600s ||
        die "DaemonSet $ns/$ds did not roll out (kubectl -n $ns describe daemonset $ds)"
}

# The proof on this node that ipvsproxy programs it: IPVS has the `kubernetes` Service's
# cluster IP with the control plane as real server, and the API server answers through it.
check_kubernetes_service() {
    require_env CP_IP
    local ip
    ip=$(kubectl -n default get service kubernetes -o jsonpath='{.spec.clusterIP}')
    [[ -n $ip ]] || die "the kubernetes Service has no cluster IP"
    wait_for 300 "IPVS to forward $ip:443 to $CP_IP:6443" \
        sh -c "ipvsadm -Ln -t '$ip:443' | grep -qF '$CP_IP:6443'"
    wait_for 120 "the API server to answer through $ip:443" \
        curl -skf --max-time 5 "https://$ip:443/version"
    log "IPVS on $(hostname) forwards the kubernetes Service $ip:443 to $CP_IP:6443"
}

# A kubeadm bootstrap token (what the Vagrantfile writes to vagrant/.cluster/bootstrap-token).
BOOTSTRAP_TOKEN_RE='^[a-z0-9]{6}\.[a-z0-9]{16}$'

# The cluster's bootstrap token from vagrant/.cluster, checked to have a token's shape.
read_bootstrap_token() {
    local file="$CLUSTER_DIR/bootstrap-token" token
    [[ -s $file ]] || die "$file is missing: the Vagrantfile makes it before \`vagrant up\`; with rsync, \`vagrant rsync $(hostname)\` copies it"
    token=$(head -n 1 "$file")
    [[ $token =~ $BOOTSTRAP_TOKEN_RE ]] || die "$file does not hold a kubeadm bootstrap token"
    printf '%s\n' "$token"
}

# ca_cert_hash CERT: what `kubeadm join --discovery-token-ca-cert-hash` pins, the sha256 of the
# certificate's public key (DER SubjectPublicKeyInfo), as hex.
ca_cert_hash() {
    local hash
    hash=$(openssl x509 -pubkey -noout -in "$1" | openssl pkey -pubin -outform der | sha256sum) ||
        die "cannot read the public key of $1"
    printf '%s\n' "${hash%% *}"
}

# This node's ipvsproxy container is running (the kubelet started the DaemonSet's pod here).
local_ipvsproxy_running() {
    local container
    container=$(env_file_get "$PROXY_ENV" IPVSPROXY_CONTAINER) || return 1
    [[ -n $(crictl ps -q --state Running --name "^$container\$" 2>/dev/null) ]]
}

# The regular expression flannel matches the private-network address with (flanneld's
# --iface-regex matches interface addresses as well as names): ^192\.168\.56\.[0-9]+$
private_iface_regex() {
    require_env NETWORK_PREFIX
    printf '^%s\\.[0-9]+$\n' "${NETWORK_PREFIX//./\\.}"
}
