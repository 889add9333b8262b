"""A user's client code: score one update's episodes, all by one teacher generation.

``score_update`` is what a training loop built on ``SyncTeacherClient`` might do at
each update: tag the requests with the policy version, bind the update to the teacher
connected now, pipeline one ``SCORE`` per episode and wait for all of them. When the
teacher reloads or restarts meanwhile, the whole update is scored again, so the loss
never mixes two teachers. ``test_my_client.py`` tests it against
``miniverl.testing``'s fake teacher.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from miniverl.protocol.client import TeacherChanged


def score_update(client: Any, episodes: list[np.ndarray], *, version: int, k: int = 8,
                 attempts: int = 3) -> tuple[tuple[str, int], list[Any]]:
    """Targets for every position of every episode (one ``ScoreResult`` per episode, in
    order) and the teacher ``(instance, gen)`` that computed all of them."""
    client.set_version(version)
    for _ in range(attempts):
        teacher = client.bind()
        ids = [client.submit(tokens, [0, len(tokens)], np.arange(len(tokens) - 1), k=k)
               for tokens in episodes]
        try:
            results = client.wait(ids)
        except TeacherChanged:
            continue  # a reload or a restart: score the whole update again
        return teacher, [results[rid] for rid in ids]
    raise RuntimeError(f"the teacher changed {attempts} times during one update")
