#!/usr/bin/env bash
# Runs the end-to-end tests (tests/e2e) against the Vagrant cluster.
#
#   vagrant ssh cp -c /vagrant/vagrant/run-e2e.sh [PYTEST ARGS...]   # on the control plane
#   vagrant/run-e2e.sh [PYTEST ARGS...]                               # from the host
#
# It makes a virtual environment of its own (never the repository's .venv, which belongs to
# the machine that made it), installs the repository into it with the `dev` dependency group (which
# brings kubectl, put first on PATH), waits until every node is Ready and ipvsproxy has rolled
# out, then runs `python -m pytest tests/e2e --e2e-kubeconfig KUBECONFIG` from the repository.
#
#   IPVSPROXY_E2E_KUBECONFIG  the cluster's kubeconfig; by default ~/.kube/config on the
#                             control plane, vagrant/.cluster/admin.conf elsewhere (the
#                             host's copy, made by a Vagrant trigger after `cp` is up)
#
# On the control plane it runs the tests of /vagrant as last synced: with the default rsync
# share, `vagrant rsync cp` first copies a changed checkout.
#   IPVSPROXY_E2E_VENV        the virtual environment [~/.cache/ipvsproxy-e2e/venv]
#   PYTHON                    the interpreter that makes it (3.11 or later) [python3]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

die() {
    printf 'run-e2e.sh: %s\n' "$*" >&2
    exit 1
}

kubeconfig=${IPVSPROXY_E2E_KUBECONFIG:-}
if [[ -z $kubeconfig ]]; then
    # On the control plane the provisioning gave the vagrant user its own copy. Anywhere else,
    # never ~/.kube/config: on the host that is some other cluster's.
    if [[ -f /etc/kubernetes/admin.conf && -r $HOME/.kube/config ]]; then
        kubeconfig=$HOME/.kube/config
    else
        kubeconfig=$here/.cluster/admin.conf
    fi
fi
[[ -r $kubeconfig ]] || die "cannot read the kubeconfig $kubeconfig (has 'vagrant up' finished?)"
kubeconfig=$(cd "$(dirname "$kubeconfig")" && pwd)/$(basename "$kubeconfig")

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$python is older than 3.11, which ipvsproxy requires (set PYTHON)"

venv=${IPVSPROXY_E2E_VENV:-$HOME/.cache/ipvsproxy-e2e/venv}
stamp=$venv/.ipvsproxy-installed
want=$(sha256sum "$repo/pyproject.toml" | cut -d' ' -f1)
if [[ ! -x $venv/bin/python ]]; then
    echo "run-e2e.sh: creating $venv" >&2
    "$python" -m venv "$venv"
fi
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "run-e2e.sh: installing the repository with its dev group into $venv" >&2
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e "$repo" --group "$repo/pyproject.toml:dev"
    printf '%s\n' "$want" >"$stamp"
fi
export PATH="$venv/bin:$PATH"
command -v kubectl >/dev/null || die "no kubectl on PATH after installing the dev group"

kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready nodes --all --timeout=300s
# Where ipvsproxy's DaemonSet is: the node's own record (provision/common.sh, PROXY_ENV) on a
# machine of the lab, the copy the host took from the control plane elsewhere.
ns=kube-system ds=ipvsproxy
for env_file in /var/lib/ipvsproxy-lab/ipvsproxy.env "$here/.cluster/ipvsproxy.env"; do
    if [[ -r $env_file ]]; then
        ns=$(sed -n 's/^IPVSPROXY_NAMESPACE=//p' "$env_file")
        ds=$(sed -n 's/^IPVSPROXY_DAEMONSET=//p' "$env_file")
        break
    fi
done
kubectl --kubeconfig "$kubeconfig" -n "$ns" rollout status "daemonset/$ds" --timeout=300s

cd "$repo"
echo "run-e2e.sh: python -m pytest tests/e2e --e2e-kubeconfig $kubeconfig $*" >&2
exec "$venv/bin/python" -m pytest tests/e2e --e2e-kubeconfig "$kubeconfig" "$@"
