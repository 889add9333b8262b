"""Headless Chromium for the browser tests: find the binary, run it offline, read its PNG.

Needs Debian's ``chromium`` (``apt-get install -y chromium``; ``.ci/run`` installs it);
``MINIVERL_CHROMIUM`` may name the binary; ``CHROMIUM`` is None when none is found (the
tests skip with that reason). The network is mapped to nowhere, so a page that tried to
fetch anything would log a failed load, which ``CONSOLE`` catches in Chromium's log.
Not a test module: imported by the tests in this folder.
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

SKIP_REASON = "no Chromium binary (install Debian's chromium: apt-get install -y chromium)"
CONSOLE = re.compile(r":CONSOLE[:(]")


def find_chromium() -> str | None:
    for name in (
        os.environ.get("MINIVERL_CHROMIUM"),
        "chromium",
        "chromium-browser",
        "google-chrome",
    ):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


CHROMIUM = find_chromium()


def run_chromium(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
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


def decode_png(data: bytes) -> np.ndarray:
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
