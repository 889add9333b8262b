"""The comparison page (``miniverl report RUN_A RUN_B``) in headless Chromium.

Like the run report's browser test: the page renders offline with both runs' curves in
shared charts, logs nothing to the console, fetches nothing, and its screenshot is a
real page, not a blank one. Skipped with the reason when no Chromium binary is found.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from miniverl.student.report.compare import build_comparison
from tests.browser.chromium import CHROMIUM, CONSOLE, SKIP_REASON, decode_png, run_chromium
from tests.student.report.report_runs import make_pair

pytestmark = pytest.mark.browser

if CHROMIUM is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compare")
    out, _ = build_comparison(list(make_pair(root)), root / "compare.html")
    return out


def test_comparison_renders_overlaid_charts_and_no_console_output(page: Path, tmp_path: Path):
    result = run_chromium(page.as_uri(), tmp_path / "profile", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    for heading in ("Learning curves", "Summaries side by side", "Recipe differences"):
        assert f"<h2>{heading}</h2>" in dom
    svgs = re.findall(r"<svg\b[^>]*>(.*?)</svg>", dom, flags=re.S)
    assert len(svgs) == 5
    assert sum(s.count("<polyline") == 2 for s in svgs) >= 4  # both runs in each chart
    console = [line for line in result.stderr.splitlines() if CONSOLE.search(line)]
    assert console == []


def test_comparison_screenshot_is_not_blank(page: Path, tmp_path: Path):
    shot = tmp_path / "shot.png"
    result = run_chromium(page.as_uri(), tmp_path / "profile", f"--screenshot={shot}",
                          "--window-size=1100,1400", "--force-device-scale-factor=0.5")
    assert shot.is_file(), result.stderr[-2000:]
    pixels = decode_png(shot.read_bytes())[..., :3]
    assert pixels.shape[:2] == (700, 550)
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    background = np.all(pixels == pixels[5, 5], axis=-1).mean()
    assert len(colours) > 30 and pixels.std() > 10 and background < 0.97
    # Both runs' colours (blue A, red B) are on screen, not just one.
    blue = np.all(np.abs(pixels.astype(int) - (37, 99, 235)) < 40, axis=-1).sum()
    red = np.all(np.abs(pixels.astype(int) - (220, 38, 38)) < 40, axis=-1).sum()
    assert blue > 50 and red > 50
