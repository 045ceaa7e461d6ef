"""make bench-scaling's chart is drawn from the scaling run's points."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from bench import chart


def points() -> list[dict[str, float]]:
    return [
        {
            "services": s,
            "endpoints": 10,
            "ipvsproxy": 0.004 + s * 1e-7,
            "kube-proxy": s * 1e-3,
            "kube-router": s * 5e-2,
        }
        for s in (500, 1000, 2000, 5000)
    ]


def test_a_png_of_the_three_systems(tmp_path: Path) -> None:
    out = chart.draw(points(), tmp_path / "sub" / "scaling.png", "test")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (770, 495)  # 7 x 4.5 inches at 110 dpi


def test_no_points_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no scaling points"):
        chart.draw([], tmp_path / "x.png", "test")
