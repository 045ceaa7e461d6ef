"""Upstream components for the kernel lab, built from their Go modules: etcd, kube-apiserver,
kube-controller-manager and kube-proxy (the real control plane and the reference proxy), and
kube-router (a comparison peer). Test infrastructure only: nothing here is shipped.

Each component's Go module (go.mod and go.sum, no upstream source) sits next to this file; the
binaries go to a cache outside the repository under a key of the component's version, the Go
version and the module files, so a second build builds nothing. ``python -m lab.cluster.upstream``
builds whatever is missing and points ``<cache>/bin/<program>`` at the build of the current key;
:func:`binary` finds it there (in the lab guest too, where Go is not on PATH).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
KUBE_ROUTER_VERSION = "v2.1.0"


class NotBuilt(RuntimeError):
    """An upstream binary the lab needs has not been built: `make setup` builds it."""


@dataclass(frozen=True)
class Component:
    """One Go module of ours that builds upstream programs (``packages``, named by their last
    path element) at ``version``."""

    module: str
    version: str
    packages: tuple[str, ...]
    tags: str = ""
    ldflags: tuple[str, ...] = field(default=())

    @property
    def directory(self) -> Path:
        return HERE / self.module

    @property
    def programs(self) -> tuple[str, ...]:
        return tuple(_program_name(p) for p in self.packages)


def _go_output_name(package: str) -> str:
    """The file `go build -o DIR/` writes for ``package``: its last path element, or the one
    before a major-version suffix (go.etcd.io/etcd/server/v3 -> "server")."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and parts[-1][:1] == "v" and parts[-1][1:].isdigit():
        return parts[-2]
    return parts[-1]


def _program_name(package: str) -> str:
    return "etcd" if package.startswith("go.etcd.io/etcd/server") else _go_output_name(package)


def _k8s_ldflags(version: str) -> tuple[str, ...]:
    major, minor = version.lstrip("v").split(".")[:2]
    base = "k8s.io/component-base/version"
    return (
        f"-X {base}.gitVersion={version}",
        f"-X {base}.gitMajor={major}",
        f"-X {base}.gitMinor={minor}",
        f"-X {base}.gitTreeState=clean",
        f"-X k8s.io/client-go/pkg/version.gitVersion={version}",
    )


_KUBE_ROUTER_VERSION_VAR = "github.com/cloudnativelabs/kube-router/v2/pkg/version.Version"

COMPONENTS: tuple[Component, ...] = (
    Component(
        "etcd",
        ETCD_VERSION,
        ("go.etcd.io/etcd/server/v3",),
        ldflags=(f"-X go.etcd.io/etcd/api/v3/version.GitSHA={ETCD_VERSION}",),
    ),
    Component(
        "kubernetes",
        KUBERNETES_VERSION,
        (
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-proxy",
        ),
        # upstream's hack/lib/golang.sh
        tags="selinux,notest",
        ldflags=_k8s_ldflags(KUBERNETES_VERSION),
    ),
    Component(
        "kube-router",
        KUBE_ROUTER_VERSION,
        ("github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",),
        ldflags=(f"-X {_KUBE_ROUTER_VERSION_VAR}={KUBE_ROUTER_VERSION}",),
    ),
)


def cache_root() -> Path:
    """Outside the repository, kept between runs: $IPVSPROXY_LAB_CACHE, else
    $XDG_CACHE_HOME/ipvsproxy-lab, else ~/.cache/ipvsproxy-lab."""
    if env := os.environ.get("IPVSPROXY_LAB_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "ipvsproxy-lab"


def go_version() -> str:
    out = subprocess.run(
        ["go", "env", "GOVERSION"], env=_go_env(), capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def cache_key(component: Component, go: str) -> str:
    """Version, Go version and the module files: any change to one is a new build."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((component.directory / name).read_bytes())
    digest.update(repr((component.packages, component.tags, component.ldflags)).encode())
    return f"{component.module}-{component.version}-{go}-{digest.hexdigest()[:12]}"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Nothing changes silently: the machine's Go, go.sum as committed, static binaries.
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false")
    return env


def _bin_dir(component: Component, go: str) -> Path:
    return cache_root() / cache_key(component, go) / "bin"


def binary(program: str) -> Path:
    """The built upstream ``program`` (e.g. "kube-apiserver"); NotBuilt if it is not built."""
    if not any(program in c.programs for c in COMPONENTS):
        raise KeyError(program)
    path = cache_root() / "bin" / program
    if not path.is_file():
        raise NotBuilt(f"{program} is not built ({path}): run `make setup`")
    return path


def _link(component: Component, go: str) -> None:
    """``<cache>/bin/<program>`` -> this key's build (replaced atomically)."""
    links = _ensure_dir(cache_root() / "bin")
    for program in component.programs:
        tmp = links / f".{program}.new"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(_bin_dir(component, go) / program)
        tmp.replace(links / program)


def build(component: Component, go: str, say: Callable[[str], None] = print) -> float:
    """Build ``component`` unless its cache entry is complete; the seconds it took (0 if not)."""
    bin_dir = _bin_dir(component, go)
    if all((bin_dir / p).is_file() for p in component.programs):
        return 0.0
    staging = bin_dir.with_name("bin.partial")
    staging.mkdir(parents=True, exist_ok=True)
    argv = ["go", "build", "-v", "-trimpath", "-o", f"{staging}/"]
    if component.tags:
        argv += ["-tags", component.tags]
    argv += ["-ldflags", " ".join(("-s", "-w", "-buildid=", *component.ldflags))]
    argv += list(component.packages)
    programs = ", ".join(component.programs)
    say(f"upstream: building {component.module} {component.version} ({programs})")
    started = time.monotonic()
    _run_with_progress(argv, component, started, say)
    for package in component.packages:
        made = staging / _go_output_name(package)
        made.replace(_ensure_dir(bin_dir) / _program_name(package))
    staging.rmdir()
    took = time.monotonic() - started
    say(f"upstream: built {component.module} in {took:.0f} s -> {bin_dir}")
    return took


def _ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run_with_progress(
    argv: list[str], component: Component, started: float, say: Callable[[str], None]
) -> None:
    """Run ``go build -v``: a line of progress every 30 s (packages compiled, time so far);
    its whole output on failure."""
    proc = subprocess.Popen(
        argv,
        cwd=component.directory,
        env=_go_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    done = threading.Event()

    def report() -> None:
        while not done.wait(30.0):
            say(
                f"upstream: {component.module}: {len(lines)} packages compiled, "
                f"{time.monotonic() - started:.0f} s"
            )

    ticker = threading.Thread(target=report, daemon=True)
    ticker.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
    rc = proc.wait()
    done.set()
    if rc != 0:
        tail = "\n".join(lines[-60:])
        raise SystemExit(f"upstream: building {component.module} failed (exit {rc}):\n{tail}")


def build_all(say: Callable[[str], None] = print) -> float:
    go = go_version()
    started = time.monotonic()
    built = 0.0
    for component in COMPONENTS:
        built += build(component, go, say)
        _link(component, go)
    if built:
        say(f"upstream: all built in {time.monotonic() - started:.0f} s")
    return built


def main() -> int:
    if shutil.which("go") is None:
        print("upstream: Go is needed to build the lab's upstream components", file=sys.stderr)
        return 2
    build_all(lambda line: print(line, flush=True))
    return 0
