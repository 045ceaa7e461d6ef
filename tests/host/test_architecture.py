"""The pure layers stay pure: import-linter's contract from pyproject.toml holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_functional_core_imports_no_shell() -> None:
    exe = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(exe)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout
