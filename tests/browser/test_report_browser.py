"""The run report in a real browser: headless Chromium renders it, screenshots it, logs nothing.

Needs Debian's ``chromium`` (``apt-get install -y chromium``; ``.ci/run`` installs it);
skipped with a reason when no Chromium binary is found. ``MINIVERL_CHROMIUM`` may
name the binary. The network is mapped to nowhere, so a page that tried to fetch
anything would log a failed load, which the console check catches.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from miniverl.student.report.build import build_report
from tests.browser.chromium import CHROMIUM, CONSOLE, SKIP_REASON
from tests.browser.chromium import decode_png as _decode_png
from tests.browser.chromium import run_chromium as _run
from tests.student.report import report_runs

pytestmark = pytest.mark.browser

if CHROMIUM is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)


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
