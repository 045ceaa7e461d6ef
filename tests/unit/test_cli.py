"""The ipvsproxy command line: help and version work; bad input fails with a clear message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ipvsproxy import __version__, cli
from ipvsproxy.kernel.fakes.ipvs import FakeIPVS


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """As `kube-proxy --version` prints `Kubernetes v1.37.2`: one line, the name and v-version."""
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out == f"ipvsproxy v{__version__}\n"
    assert __version__ != "0.0.0+unknown"  # the package is installed, metadata is found


@pytest.mark.parametrize("argv", [["--version"], ["run", "--version"], ["cleanup", "--version"]])
def test_version_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--version` anywhere kube-proxy's flags are taken prints the version and exits 0, before
    any configuration is read (kube-proxy's verflag does so too)."""
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == f"ipvsproxy v{__version__}\n"


def test_version_flag_after_other_flags_of_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--config", "/nonexistent.yaml", "--version"]) == 0
    assert capsys.readouterr().out == f"ipvsproxy v{__version__}\n"


def test_version_without_package_metadata_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tree that was never installed has no metadata: the version says so."""
    import importlib
    import importlib.metadata

    import ipvsproxy

    def missing(_name: str) -> str:
        raise importlib.metadata.PackageNotFoundError("ipvsproxy")

    monkeypatch.setattr(importlib.metadata, "version", missing)
    try:
        assert importlib.reload(ipvsproxy).__version__ == "0.0.0+unknown"
    finally:
        monkeypatch.undo()
        importlib.reload(ipvsproxy)
    assert ipvsproxy.__version__ == __version__


def test_help_lists_every_subcommand() -> None:
    exe = shutil.which("ipvsproxy", path=str(Path(sys.executable).parent))
    assert exe, "console script ipvsproxy is not installed in the venv"
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    for name in ("run", "status", "cleanup", "version"):
        assert name in proc.stdout


def test_status_without_ipvs_in_the_kernel_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """This host's kernel has no IPVS: status names that, rather than printing an empty table."""
    assert cli.main(["status", "--state-file", "/nonexistent/state.json"]) == 1
    assert "ipvsproxy status: cannot read IPVS from the kernel" in capsys.readouterr().err


def test_status_rejects_a_malformed_service_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--service", "just-a-name"]) == 2
    assert "--service wants NAMESPACE/NAME" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["-t", "-u", "--sctp-service", "--tcp-service"])
def test_status_rejects_a_malformed_virtual_service(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", flag, "10.96.0.10"]) == 2
    assert "illegal virtual server" in capsys.readouterr().err


def test_status_takes_one_virtual_service_at_most() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["status", "-t", "10.96.0.10:80", "-u", "10.96.0.10:53"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("output", "want"),
    [
        ("table", "Timeout (tcp tcpfin udp): 7200 30 60\n"),
        ("json", '{\n  "schemaVersion": 1,\n  "timeouts": {\n    "tcp": 7200,\n'),
    ],
)
def test_status_timeout_prints_the_kernel_timeouts_as_ipvsadm(
    output: str, want: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeIPVS()
    fake.set_timeouts(7200, 30, 60)
    monkeypatch.setattr("ipvsproxy.kernel.ipvs.IPVS", lambda: fake)
    assert cli.main(["status", "--timeout", "-o", output]) == 0
    out = capsys.readouterr().out
    assert out.startswith(want)
    if output == "json":
        assert json.loads(out)["timeouts"] == {"tcp": 7200, "tcpFin": 30, "udp": 60}
    assert fake.calls["read_timeouts"] == 1 and fake.calls["close"] == 1


def test_status_timeout_without_ipvs_in_the_kernel_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["status", "--timeout"]) == 1
    assert "ipvsproxy status: cannot read IPVS from the kernel" in capsys.readouterr().err


def test_status_timeout_takes_no_value_the_daemon_wait_is_daemon_timeout() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["status", "--timeout", "5"])
    assert exc.value.code == 2
    args = cli.build_parser().parse_args(["status", "--daemon-timeout", "0.5"])
    assert (args.daemon_timeout, args.timeout) == (0.5, False)


def test_status_stats_and_rate_exclude_each_other() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["status", "--stats", "--rate"])
    assert exc.value.code == 2


@pytest.mark.parametrize("command", ["run", "cleanup"])
def test_an_invalid_configuration_fails_before_anything_runs(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([command, "--proxy-mode", "iptables"]) == 1
    err = capsys.readouterr().err
    assert f"ipvsproxy {command}: invalid configuration" in err
    assert "ipvs" in err


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["frobnicate"])
    assert exc.value.code == 2
