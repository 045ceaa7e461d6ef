"""The scaling chart: time for one endpoint change against the number of Services, one line
per system (ipvsproxy, kube-proxy in IPVS mode, kube-router), from ``bench.peers``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

SERIES = (
    ("ipvsproxy", "ipvsproxy", "o-"),
    ("kube-proxy", "kube-proxy (IPVS mode)", "s--"),
    ("kube-router", "kube-router (service proxy)", "^:"),
)


def draw(points: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """A log-log PNG of the systems in ``points`` (median seconds by system name) over their
    sizes."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    if not points:
        raise ValueError("no scaling points to draw")
    xs = [p["services"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for key, label, style in SERIES:
        if all(key in p for p in points):
            ax.plot(xs, [p[key] for p in points], style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"{x:,}" for x in xs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the sizes run
    ax.set_xlabel(f"Services ({points[0]['endpoints']} endpoints each)")
    ax.set_ylabel("one endpoint change: API write to kernel, s (log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
