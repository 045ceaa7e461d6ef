"""The layers hold: every import-linter contract in pyproject.toml is kept."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONTRACTS = {
    "ipvsproxy's layers": "layers",
    "The pure core does no I/O": "forbidden",
    "The kernel layer knows nothing of Kubernetes": "forbidden",
    "The product imports no development tooling": "forbidden",
    "The lab and the benchmarks import no tests": "forbidden",
    "Product tests import no benchmarks": "forbidden",
}


def declared() -> dict[str, str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {c["name"]: c["type"] for c in data["tool"]["importlinter"]["contracts"]}


def test_the_contracts_are_the_ones_the_architecture_names() -> None:
    assert declared() == CONTRACTS


def test_every_contract_is_kept() -> None:
    exe = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(exe)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = dict(re.findall(r"^(.+?) (KEPT|BROKEN)$", proc.stdout, re.M))
    assert verdicts == dict.fromkeys(CONTRACTS, "KEPT"), proc.stdout


def test_the_layers_cover_every_subpackage() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    (layers,) = [c for c in data["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    named = {p.strip() for layer in layers["layers"] for p in re.split(r"[|:]", layer)}
    package = REPO / "ipvsproxy"
    present = {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    present |= {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    assert present == named
