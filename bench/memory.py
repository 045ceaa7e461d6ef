"""Peak memory of ``ipvsproxy run`` holding a synthetic cluster, inside the lab guest.

A read-only API server (``bench.snapshot_api``: why not the real kube-apiserver is said there)
runs in this process, in the benchmark's node namespace, serving the cluster
(``lab.cluster.synthetic``) and its Node. ``ipvsproxy run`` lists and watches it over HTTP with the
official client, as on a real node, and programs the kernel; its first sync shows in its sync
timestamp metric. Its peak resident set (VmHWM) is read then, and again after a few more
periodic syncs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.snapshot_api import SnapshotAPI
from lab.cluster import synthetic
from lab.net import netns

HEALTHZ = "127.0.0.1:10256"
METRICS = "127.0.0.1:10249"
SYNC_PERIOD_S = 5.0


def snapshot(services: int, endpoints: int, node: str, node_ip: str) -> SnapshotAPI:
    """The cluster's Services and EndpointSlices, and the Node ipvsproxy runs as."""
    svcs: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    for _key_name, svc, svc_slices in synthetic.cluster(services, endpoints):
        svcs.append(svc)
        slices.extend(svc_slices)
    node_obj = {
        "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
        "status": {"addresses": [{"type": "InternalIP", "address": node_ip}]},
    }
    return SnapshotAPI(svcs, slices, [node_obj])


def _synced() -> bool:
    """The first sync ran to its end (/healthz is 200 while starting, as upstream's)."""
    try:
        return _metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 0
    except (OSError, urllib.error.HTTPError):
        return False


def _metric(name: str) -> float:
    """The unlabelled series ``name``, or its IPv4 one (upstream's per-family series)."""
    with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith((f"{name} ", f'{name}{{ip_family="IPv4"}} ')):
                return float(line.split()[-1])
    return 0.0


def _sync_count() -> float:
    return _metric("kubeproxy_sync_proxy_rules_duration_seconds_count")


def _failed(proc: subprocess.Popen[bytes]) -> str | None:
    """Why the daemon cannot get there: it exited, or a sync failed (say, a set was full)."""
    if proc.poll() is not None:
        killed = " (killed: out of memory?)" if proc.returncode == -9 else ""
        return f"ipvsproxy run exited with {proc.returncode}{killed}"
    try:
        if _metric("ipvsproxy_sync_errors_total") > 0:
            return "a sync of ipvsproxy run failed (see its log)"
    except OSError:
        pass  # not serving metrics yet
    return None


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def peak_rss(
    services: int, endpoints: int, ns: str, node: str, node_ip: str, workdir: Path
) -> dict[str, Any]:
    """Start ``ipvsproxy run`` over the cluster; its peak RSS after the first sync and later."""
    with netns.entered(ns):
        server = snapshot(services, endpoints, node, node_ip).start()
    kubeconfig = server.write_kubeconfig(workdir / "kubeconfig")
    log_path = workdir / f"ipvsproxy-{services}.log"
    log = log_path.open("wb")
    try:
        start = time.monotonic()
        proc = subprocess.Popen(
            [
                *("ip", "netns", "exec", ns, sys.executable, "-m", "ipvsproxy", "run"),
                *("--kubeconfig", str(kubeconfig), "--hostname-override", node),
                *("--cluster-cidr", "10.244.0.0/16"),
                *("--state-file", str(workdir / f"state-{services}.json")),
                *("--ipvs-sync-period", f"{SYNC_PERIOD_S:g}s", "--ipvs-min-sync-period", "1s"),
                *("--healthz-bind-address", HEALTHZ, "--metrics-bind-address", METRICS),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            return _watch(proc, ns, start, services, endpoints)
        except (RuntimeError, OSError) as exc:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{exc}; the end of its log:\n{tail}") from None
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    finally:
        log.close()
        server.stop()


def _watch(
    proc: subprocess.Popen[bytes], ns: str, start: float, services: int, endpoints: int
) -> dict[str, Any]:
    with netns.entered(ns):
        while not _synced():
            failed = _failed(proc)
            if failed:
                raise RuntimeError(failed)
            if time.monotonic() - start > 1800:
                raise RuntimeError("ipvsproxy run did not finish its first sync in 30 minutes")
            time.sleep(0.5)
        first_sync_s = time.monotonic() - start
        after_first = _kib(proc.pid, "VmHWM")
        table = subprocess.run(["ipvsadm", "-Sn"], capture_output=True, text=True, check=True)
        programmed = sum(line.startswith("-A ") for line in table.stdout.splitlines())
        syncs: float | None = None
        count = -1.0
        while syncs is None or count < syncs + 3:  # three more full syncs
            failed = _failed(proc)
            if failed:
                raise RuntimeError(failed)
            with contextlib.suppress(OSError):  # metrics not served (yet, or any more)
                count = _sync_count()
                syncs = count if syncs is None else syncs
            time.sleep(1.0)
    return {
        "services": services,
        "endpoints": endpoints,
        "first_sync_s": first_sync_s,
        "virtual_servers": programmed,
        "peak_rss_mib_first_sync": after_first / 1024,
        "peak_rss_mib": _kib(proc.pid, "VmHWM") / 1024,
        "rss_mib": _kib(proc.pid, "VmRSS") / 1024,
    }
