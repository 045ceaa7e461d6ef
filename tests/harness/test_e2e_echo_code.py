"""The echo pods of the real-cluster end-to-end run (tests/e2e/real.py) get lab code that
imports as mounted: the ConfigMap's files land in lab/'s own layout under /opt/lab."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.real import echo_code_volume


def test_the_echo_pods_code_imports_as_mounted(tmp_path: Path) -> None:
    data, items = echo_code_volume()
    assert sorted(data) == sorted(item["key"] for item in items)
    mount = tmp_path / "lab"  # the pod's /opt/lab; POD_ECHO puts /opt on sys.path
    for item in items:
        path = mount / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data[item["key"]])
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from lab.net import echo; "
        "assert callable(echo.serve) and callable(echo._listen); print(echo.__file__)"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(mount / "net" / "echo.py")
    assert "from lab.net import echo" in data[_key_of(items, "pod_echo.py")]


def _key_of(items: list[dict[str, str]], path: str) -> str:
    (key,) = [item["key"] for item in items if item["path"] == path]
    return key
