#!/bin/sh
# Install the Debian packages the kernel lab needs, only those that are missing, so that a
# second `make test` does no apt work at all. The Vagrant lab's checks
# (tests/harness/test_vagrant.py) need shellcheck, ruby, openssl, and vagrant with the
# vagrant-libvirt plugin and rsync for `vagrant validate`, which boots nothing and downloads
# no box (no hypervisor is installed: recommendations are left out). The image's build test
# (tests/harness/test_image_build.py) needs buildah and debootstrap.
set -eu
PKGS="user-mode-linux ipvsadm ipset iptables conntrack kmod iproute2 shellcheck ruby"
PKGS="$PKGS openssl rsync vagrant vagrant-libvirt buildah debootstrap"
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
