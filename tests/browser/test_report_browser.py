"""The run report in a real browser: headless Chromium renders it, screenshots it, logs nothing.

Needs Debian's ``chromium`` (``apt-get install -y chromium``; ``.ci/run`` installs it);
skipped with a reason when no Chromium binary is found. ``MINIVERL_CHROMIUM`` may
name the binary. The network is mapped to nowhere, so a page that tried to fetch
anything would log a failed load, which the console check catches.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from miniverl.student.report.build import build_report
from tests.student.report import report_runs

pytestmark = pytest.mark.browser

CONSOLE = re.compile(r":CONSOLE[:(]")


def _chromium() -> str | None:
    for name in (
        os.environ.get("MINIVERL_CHROMIUM"),
        "chromium",
        "chromium-browser",
        "google-chrome",
    ):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


CHROMIUM = _chromium()
if CHROMIUM is None:
    pytest.skip(
        "no Chromium binary (install Debian's chromium: apt-get install -y chromium)",
        allow_module_level=True,
    )


def _run(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
    ]
    return subprocess.run(
        [CHROMIUM, *flags, *extra, url], capture_output=True, text=True, timeout=120, check=False
    )


def _decode_png(data: bytes) -> np.ndarray:
    """uint8[H, W, C] pixels of an 8-bit RGB/RGBA PNG (enough for a screenshot)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = depth = colour = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and colour in (2, 6), f"unexpected PNG format depth={depth} colour={colour}"
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(idat)
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]
        cur = bytearray(line)
        if kind == 1:
            for x in range(bpp, stride):
                cur[x] = (cur[x] + cur[x - bpp]) & 0xFF
        elif kind == 2:
            cur = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif kind == 3:
            for x in range(stride):
                left = cur[x - bpp] if x >= bpp else 0
                cur[x] = (cur[x] + ((left + prev[x]) >> 1)) & 0xFF
        elif kind == 4:
            for x in range(stride):
                a = cur[x - bpp] if x >= bpp else 0
                b = prev[x]
                c = prev[x - bpp] if x >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out[y * stride : (y + 1) * stride] = cur
        prev = cur
    return np.frombuffer(bytes(out), dtype=np.uint8).reshape(height, width, bpp)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = report_runs.make_run(tmp_path_factory.mktemp("browser") / "toy-opd", with_targets=True)
    return build_report(run)


def test_console_check_detects_errors(tmp_path: Path) -> None:
    # Guards the check below: a page that does log an error must be caught.
    probe = tmp_path / "probe.html"
    probe.write_text('<!DOCTYPE html><p>x</p><script>console.error("probe-1");nope();</script>')
    result = _run(probe.as_uri(), tmp_path / "profile", "--dump-dom")
    assert CONSOLE.search(result.stderr), result.stderr[-2000:]


def test_report_renders_with_charts_and_no_console_output(report: Path, tmp_path: Path) -> None:
    # The user opens the file offline: it renders, the charts exist, nothing errors or fetches.
    result = _run(report.as_uri(), tmp_path / "profile", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert "<h2>Learning curves</h2>" in dom and "<h2>Per-token divergence</h2>" in dom
    svgs = re.findall(r"<svg\b[^>]*>(.*?)</svg>", dom, flags=re.S)
    assert len(svgs) >= 6
    assert sum("<polyline" in s or "<rect" in s for s in svgs) >= 5
    assert re.search(r'<polyline points="[\d.]+,[\d.]+ [\d.]+,[\d.]+', dom)
    console = [line for line in result.stderr.splitlines() if CONSOLE.search(line)]
    assert console == []


def test_report_screenshot_is_not_blank(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    result = _run(
        report.as_uri(),
        tmp_path / "profile",
        f"--screenshot={shot}",
        "--window-size=1000,1600",
        "--force-device-scale-factor=0.5",
    )
    assert shot.is_file(), result.stderr[-2000:]
    pixels = _decode_png(shot.read_bytes())[..., :3]
    assert pixels.shape[:2] == (800, 500)
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    background = np.all(pixels == pixels[5, 5], axis=-1).mean()
    # Text, table borders and chart lines: many colours, and a real share of non-background.
    assert len(colours) > 30
    assert pixels.std() > 10
    assert background < 0.97
