"""What a measurement is tied to: the torch build, the libraries, the CPU and its kernels.

``behaviour_hashes.py`` reads it (a hash compares only on the same machine), and so do
``distill_bench.py`` (its cells spend a budget in seconds and train models whose
numerics depend on these, so a run in parts resumes only where it started) and
``distill_pilot_v3.py`` (each N's student names the machine it trained on).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what platform reports)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_record() -> dict[str, Any]:
    """The torch build, the CPU, the kernels torch picked and the libraries around it."""
    import tokenizers
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": os.cpu_count(),
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
    }
