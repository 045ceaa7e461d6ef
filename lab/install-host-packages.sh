#!/bin/sh
# Install the Debian packages the kernel lab needs, only those that are missing, so that a
# second `make test` does no apt work at all.
set -eu
PKGS="user-mode-linux ipvsadm ipset iptables conntrack kmod iproute2 shellcheck ruby buildah debootstrap"
missing=""
for p in $PKGS; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$status" in
        *"ok installed") ;;
        *) missing="$missing $p" ;;
    esac
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages:$missing (run as root, or install them yourself)" >&2
    exit 1
fi
echo "installing Debian packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
