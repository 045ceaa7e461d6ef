"""The `kubernetes` floor pyproject.toml declares is a release the product works with: that
exact release (installed once, outside the repository) runs the tests of everything that
calls the client: the API calls, the informers and watches, the events, the kubeconfig's
token file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ipvsproxy-floors"
CLIENT_TESTS = (
    "tests/unit/test_kube_client.py",
    "tests/unit/test_informer.py",
    "tests/unit/test_informer_retries.py",
    "tests/unit/test_events.py",
    "tests/unit/test_token_file.py",
    "tests/unit/test_list_json.py",
)


def floor(package: str) -> str:
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(rf'"{package}>=([0-9][0-9.]*)"', text)
    assert found, f"pyproject.toml declares no floor for {package}"
    return found.group(1)


def installed(package: str, version: str) -> Path:
    """``package==version`` alone (its dependencies are the venv's) in a folder of its own."""
    target = CACHE / f"{package}-{version}"
    if not (target / package).is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
             f"{package}=={version}"],
            check=True,
        )  # fmt: skip
    return target


def test_the_kubernetes_floor_runs_the_client_tests() -> None:
    version = floor("kubernetes")
    target = installed("kubernetes", version)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO)])}
    probe = "import kubernetes; print(kubernetes.__version__)"
    seen = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert seen == version  # the floor, not the venv's newer release, is what runs
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CLIENT_TESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
