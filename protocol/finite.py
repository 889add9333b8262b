"""Finite targets only: which values of a ``SCORE_OK`` may be non-finite (DESIGN §3).

Every float a teacher sends is a finite number, with one exception: ``tail_logmass``
is ``-inf`` when ``k = V`` (the top-k holds the whole vocabulary, so the mass outside it
is exactly 0). A NaN or an infinity anywhere else would reach the student's loss as a
NaN gradient, so the teacher checks its replies before sending them
(``teacher_server/batcher.py``) and the client checks them again on receipt
(``protocol/client.py``: counted in ``nonfinite_replies``, never trained on).
:func:`nonfinite_report` is that one rule, shared by both sides.

This module only inspects arrays; it does not decode, send or count anything.
"""

from __future__ import annotations

import numpy as np


def nonfinite_report(
    arrays: dict[str, np.ndarray], *, kind: str, k: int, vocab_size: int | None
) -> str | None:
    """``None`` when every float in a reply's ``arrays`` is allowed, else what was not.

    ``vocab_size`` is the teacher's ``V``; ``tail_logmass`` may be ``-inf`` (and only
    ``-inf``) when ``kind == "topk"`` and ``k >= vocab_size``. The report reads like
    ``"logprobs: 3 NaN, 1 +inf; target_logprobs: 2 NaN"``.
    """
    problems = []
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        if arr.dtype.kind != "f":
            continue
        finite = np.isfinite(arr)
        if bool(finite.all()):
            continue
        whole_vocab = kind == "topk" and vocab_size is not None and k >= vocab_size
        if name == "tail_logmass" and whole_vocab and bool(np.all(finite | (arr == -np.inf))):
            continue
        nan = int(np.isnan(arr).sum())
        pos = int((arr == np.inf).sum())
        neg = int((arr == -np.inf).sum())
        counts = [f"{n} {what}" for n, what in ((nan, "NaN"), (pos, "+inf"), (neg, "-inf")) if n]
        problems.append(f"{name}: {', '.join(counts)}")
    return "; ".join(problems) or None
