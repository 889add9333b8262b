"""Process-level runtime settings applied once at process start.

On a small CPU machine two OpenMP threads made tiny-model steps 10-40x slower than
one (threads fight over two cores shared with the other process), so every miniverl
process sets its thread count from ``runtime.cpu_threads`` before doing work.
This module does not import torch unless it is installed; it never installs it.
"""

from __future__ import annotations

import contextlib
import os

from .errors import ConfigError

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def apply_cpu_threads(n: int) -> int:
    """Use ``n`` CPU threads in this process (and children via the environment)."""
    if not isinstance(n, int) or n < 1:
        raise ConfigError(
            f"cpu_threads must be an integer >= 1 (got {n!r}); set runtime.cpu_threads"
        )
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(n)
    try:
        import torch
    except ImportError:
        return n
    torch.set_num_threads(n)
    # Interop threads can only be set before the first parallel op; the intra-op
    # setting above is the one that matters for small models.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(n)
    return n


# cuBLAS refuses deterministic algorithms without a fixed workspace (torch raises at
# the first matmul of a run with run.deterministic: true); ":4096:8" is the setting
# torch's documentation names (8 workspaces of 4 MiB).
CUBLAS_WORKSPACE = ":4096:8"
# Lets the caching allocator grow and shrink segments, so memory one phase frees (the
# student's update, a parked teacher) is whole again for the next (teacher.memory: swap).
CUDA_ALLOC_CONF = "expandable_segments:True"


def cuda_process_env(*, deterministic: bool) -> dict[str, str]:
    """Set the CUDA environment of a miniverl process, where the user left it unset; call
    it at process start, before CUDA is first used (both are read when CUDA starts). Returns
    what it set. ``PYTORCH_CUDA_ALLOC_CONF`` always; ``CUBLAS_WORKSPACE_CONFIG`` with
    ``run.deterministic``. Touches nothing else and imports nothing."""
    wanted = {"PYTORCH_CUDA_ALLOC_CONF": CUDA_ALLOC_CONF}
    if deterministic:
        wanted["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    applied = {k: v for k, v in wanted.items() if not os.environ.get(k)}
    os.environ.update(applied)
    return applied
