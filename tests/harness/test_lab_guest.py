"""The lab itself: a guest's failure, crash or hang never passes for success.

These boot real guests (a few seconds each); they are host tests because they drive the lab
from the outside.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lab.uml import guest

REPO = Path(__file__).resolve().parents[2]


def lab_run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lab", "run", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def sample_pytest(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"lab/uml/samples/{name}",
            *extra,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_run_streams_output_and_returns_the_exit_status() -> None:
    proc = lab_run("--", "sh", "-c", "echo to-stdout; echo to-stderr >&2; pwd; exit 7")
    assert proc.returncode == 7, proc.stderr
    lines = proc.stdout.splitlines()
    assert "to-stdout" in lines
    assert "to-stderr" in lines
    assert str(REPO) in lines  # the command runs in the repository
    assert "@@LAB" not in proc.stdout  # markers are not the command's output


def test_run_uses_the_venv_and_the_lab_kernel() -> None:
    proc = lab_run("--", "sh", "-c", "command -v python; uname -r; cat /proc/net/ip_vs")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == str(Path(sys.prefix) / "bin" / "python")
    assert lines[1] == guest.kernel_release()
    assert "IP Virtual Server" in proc.stdout


def test_a_guest_panic_is_a_failure() -> None:
    proc = lab_run("--", "sh", "-c", "echo c > /proc/sysrq-trigger; exit 0")
    assert proc.returncode == 3
    assert "panicked" in proc.stderr
    assert "guest console" in proc.stderr


def test_a_hung_guest_is_a_failure() -> None:
    proc = lab_run("--timeout", "20", "--", "sleep", "600")
    assert proc.returncode == 3
    assert "did not finish within 20 s" in proc.stderr


def test_a_failed_setup_is_a_failure() -> None:
    result = guest.boot(["true"], modules=["no_such_module_anywhere"], on_output=lambda _: None)
    assert result.rc is None
    assert not result.ok
    assert "set-up failed" in result.reason
    assert any("no_such_module_anywhere" in line for line in result.console_tail)


def test_a_failing_kernel_test_turns_the_run_red() -> None:
    proc = sample_pytest("kernel_pass_fail.py", "-v")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout
    assert "kernel_pass_fail.py::test_passes_in_guest PASSED" in proc.stdout
    assert "kernel_pass_fail.py::test_fails_in_guest FAILED" in proc.stdout
    # The guest's own assertion detail reaches the host's report.
    assert "seen-inside-the-guest" in proc.stdout


def test_a_guest_crash_during_kernel_tests_turns_the_run_red() -> None:
    proc = sample_pytest("kernel_crash.py")
    assert proc.returncode == 1, proc.stdout
    assert "panicked" in proc.stdout
    assert "passed" not in proc.stdout.splitlines()[-1]
    assert "1 failed, 1 error" in proc.stdout.splitlines()[-1]


def test_a_skip_fails_the_run_under_no_skips() -> None:
    assert sample_pytest("skips.py").returncode == 0
    proc = sample_pytest("skips.py", "--lab-no-skips")
    assert proc.returncode == 1
    assert "SKIPPED is a failure here" in proc.stdout


class _Sink:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def test_console_parser_separates_output_from_kernel_noise() -> None:
    sink = _Sink()
    console = guest._Console(sink)
    for raw in [
        b"SELinux: noise\r\n",
        b"@@LAB-BEGIN@@\r\n",
        b"hello\r\n",
        b"partial@@LAB-END rc=4@@\r\n",
        b"reboot: System halted\r\n",
    ]:
        console.feed(raw)
    assert sink.lines == ["hello", "partial"]
    assert console.rc == 4
    assert console.panic is None


def test_console_parser_notices_a_panic() -> None:
    console = guest._Console(_Sink())
    console.feed(b"@@LAB-BEGIN@@\n")
    console.feed(b"Kernel panic - not syncing: sysrq triggered crash\n")
    assert console.rc is None
    assert console.panic is not None and "sysrq" in console.panic


def test_cluster_command_builds_a_working_topology() -> None:
    proc = lab_run("--", "python", "-m", "lab", "cluster", "--nodes", "2", "--pods", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pod-1-1 -> 10.244.2.11:8080 answered by pod-2-1" in proc.stdout
    assert "connectivity ok" in proc.stdout


def test_cluster_command_refuses_to_run_outside_the_guest() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "cluster"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "python -m lab run" in proc.stderr


def test_apiserver_command_serves_and_writes_a_kubeconfig(tmp_path: Path) -> None:
    """`python -m lab apiserver` runs the real control plane until SIGTERM (binaries from
    `make setup`: without them it exits 1 and this fails)."""
    from kubernetes import client, config

    from lab.cluster.controlplane import free_port

    new_client: Any = config.new_client_from_config

    kubeconfig = tmp_path / "kubeconfig"
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "lab", "apiserver"),
            *("--listen", f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig)),
            *("--workdir", str(tmp_path / "controlplane")),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"lab apiserver: https://127.0.0.1:{port} ready"), line
        api: Any = client.CoreV1Api(new_client(config_file=str(kubeconfig)))
        api.create_namespaced_service(
            "default", {"metadata": {"name": "a"}, "spec": {"ports": [{"port": 80}]}}
        )
        # kube-apiserver creates its own "kubernetes" Service shortly after /readyz, not
        # before it: wait for both.
        deadline = time.monotonic() + 30
        while True:
            names = [s.metadata.name for s in api.list_namespaced_service("default").items]
            if sorted(names) == ["a", "kubernetes"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sorted(names) == ["a", "kubernetes"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_the_map_count_is_raised_only_upwards(tmp_path: Path) -> None:
    from lab.uml.guest import raise_map_count

    f = tmp_path / "max_map_count"
    f.write_text("65530\n")
    raise_map_count(f, 1 << 20)
    assert f.read_text() == str(1 << 20)
    f.write_text("4000000\n")
    raise_map_count(f, 1 << 20)
    assert f.read_text() == "4000000\n"
    raise_map_count(tmp_path / "absent", 1 << 20)  # not ours to create: nothing happens
    assert not (tmp_path / "absent").exists()
