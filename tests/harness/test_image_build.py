"""deploy/Containerfile builds, and the image runs what it should, as its own user.

No container registry is reachable where the tests run, so the base is not the pinned
debian:bookworm-slim but the same release made locally: ``debootstrap --variant=minbase
bookworm``, imported once into a buildah store cached outside the repository
(~/.cache/ipvsproxy-image-build) and passed as ``--build-arg BASE``. Everything after FROM is
the Containerfile as shipped: Debian's packages from the archive, the Python dependencies from
PyPI with ``--require-hashes``. buildah builds with chroot isolation and the host's network
(no daemon, no OCI runtime). The host's CA bundle is offered to pip in the build containers
(/host-ca.crt and an /etc/pip.conf naming it, mounted for the RUN steps only, not in the
image): where an intercepting proxy signs PyPI's certificate that is the only way through.

In the built image, as its default user: the uid is not root, ``ipvsproxy version`` prints the
package's version, ``ip``, both iptables backends and python3 (3.11, the lock's) run, ipset,
ipvsadm, conntrack and modinfo are there (those ask the kernel even for --version), the
package's bytecode is compiled. As root through the entrypoint, with a tmpfs on the run
directory as the DaemonSet's emptyDir: the iptables names resolve to the chosen backend's
binaries in /run/ipvsproxy/bin.

A run takes two to three minutes (the build; debootstrap once more the first time).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ipvsproxy-image-build"
BASE = "localhost/ipvsproxy-test-base:bookworm"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/ipvsproxy:{VERSION}"


def run(*argv: str | Path, check: bool = True, timeout: int = 1800) -> str:
    proc = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert proc.returncode == 0, f"{argv}: {proc.stdout[-4000:]}{proc.stderr[-4000:]}"
    return proc.stdout


def buildah(*args: str | Path, check: bool = True) -> str:
    """buildah on a store of its own under CACHE (vfs: no overlay mounts needed)."""
    store = ("--root", CACHE / "storage", "--runroot", CACHE / "run", "--storage-driver", "vfs")
    return run("buildah", *store, *args, check=check)


def base_image() -> str:
    """BASE, made once: a minbase bookworm from debootstrap, imported as an image."""
    if buildah("images", "--quiet", BASE, check=False).strip():
        return BASE
    rootfs = CACHE / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    run("debootstrap", "--variant=minbase", "bookworm", rootfs, "http://deb.debian.org/debian")
    container = buildah("from", "scratch").strip()
    try:
        mountpoint = buildah("mount", container).strip()
        run("cp", "-a", f"{rootfs}/.", mountpoint)
        buildah("umount", container)
        buildah("commit", "--quiet", container, BASE)
    finally:
        buildah("rm", container)
    shutil.rmtree(rootfs)
    return BASE


def in_image(*command: str, user: str | None = None, run_dir: bool = False) -> str:
    container = buildah("from", "--quiet", IMAGE).strip()
    try:
        options: list[str] = ["--isolation", "chroot"]
        if user is not None:
            options += ["--user", user]
        if run_dir:  # the DaemonSet's emptyDir
            options += ["--mount", "type=tmpfs,destination=/run/ipvsproxy"]
        return buildah("run", *options, container, "--", *command)
    finally:
        buildah("rm", container)


def test_the_image_builds_and_runs_its_tools_as_its_user(tmp_path: Path) -> None:
    for tool in ("buildah", "debootstrap"):
        assert shutil.which(tool), f"{tool} is missing (lab/install-host-packages.sh installs it)"
    assert os.geteuid() == 0, "buildah's chroot builds and debootstrap need root"
    base = base_image()
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\ncert = /host-ca.crt\n")
    # No layer cache: with the vfs driver every cached step is a full copy of the root
    # filesystem, and the store would grow by gigabytes a change. The store keeps the base and
    # the last image only.
    buildah("rmi", "--force", IMAGE, check=False)
    buildah(
        "build", "--layers=false", "--isolation", "chroot", "--network", "host",
        "--build-arg", f"BASE={base}",
        "--volume", f"{HOST_CA}:/host-ca.crt:ro", "--volume", f"{pip_conf}:/etc/pip.conf:ro",
        "--file", REPO / "deploy" / "Containerfile",
        "--ignorefile", REPO / "deploy" / "Containerfile.dockerignore",
        "--tag", IMAGE, REPO,
    )  # fmt: skip
    buildah("rmi", "--prune", check=False)

    script = (
        "id -u; ipvsproxy version; ip -V; iptables-legacy --version; iptables-nft --version; "
        "python3 -c 'import sys; print(sys.version_info[:2])'; "
        "for tool in ipset ipvsadm conntrack modinfo; do command -v $tool; done; "
        "ls /opt/ipvsproxy/lib/python3.11/site-packages/ipvsproxy/__pycache__/cli.*.pyc"
    )
    lines = in_image("sh", "-c", script).splitlines()
    assert lines[0] == "65532"  # the image's own user: not root
    assert lines[1] == f"ipvsproxy v{VERSION}"
    assert lines[2].startswith("ip utility, iproute2")
    assert lines[3].endswith("(legacy)") and lines[4].endswith("(nf_tables)")
    assert lines[5] == "(3, 11)"
    assert lines[6:10] == [
        "/usr/sbin/ipset", "/usr/sbin/ipvsadm", "/usr/sbin/conntrack", "/usr/sbin/modinfo",
    ]  # fmt: skip
    assert lines[10].endswith(".pyc")

    # As the DaemonSet runs it: root, the entrypoint first, the run directory an emptyDir.
    linked = in_image(
        "env", "IPVSPROXY_IPTABLES_MODE=legacy", "/usr/local/bin/ipvsproxy-entrypoint",
        "sh", "-c", "command -v iptables-restore; readlink /run/ipvsproxy/bin/ip6tables-save",
        user="0", run_dir=True,
    ).splitlines()  # fmt: skip
    assert linked == ["/run/ipvsproxy/bin/iptables-restore", "/usr/sbin/ip6tables-legacy-save"]
