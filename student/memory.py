"""Choosing how student and teacher share one device (DESIGN §4).

``resident`` keeps the teacher's weights on the device; ``swap`` asks the teacher to
``PARK`` (weights off the device) before each update and ``WAKE`` before scoring;
``auto`` picks from measured free memory and says why. On CPU there is no device
memory to share, so ``auto`` is ``resident`` there.
"""

from __future__ import annotations

from typing import Any

# The student's update needs roughly this many times its weight bytes free
# (weights + grads + AdamW moments + activations) to keep the teacher resident.
UPDATE_HEADROOM = 4.0


def choose_memory(wanted: str, device: Any, client: Any) -> tuple[str, str]:
    """``(strategy, reason)`` for the recipe's ``teacher.memory``."""
    if wanted != "auto":
        return wanted, f"set by the recipe (teacher.memory: {wanted})"
    if getattr(device, "type", "cpu") != "cuda":
        return "resident", "student on CPU: no accelerator memory to share"
    import torch

    free, total = torch.cuda.mem_get_info(device)
    used_by_student = torch.cuda.memory_allocated(device)
    needed = UPDATE_HEADROOM * used_by_student
    if free >= needed:
        return "resident", (
            f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB covers the update's "
            f"~{needed / 2**30:.1f} GiB with the teacher resident"
        )
    return "swap", (
        f"only {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB; the update needs "
        f"~{needed / 2**30:.1f} GiB, so the teacher parks during updates"
    )
