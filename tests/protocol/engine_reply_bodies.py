"""Generated engine replies for the engine-teacher client (hypothesis strategies).

Shared by ``tests/testing/test_hostile_engine.py`` (a few dozen) and
``benchmarks/http_fuzz.py`` (10,000+). :func:`engine_replies` takes the honest answer
to one scoring request (``HostileEngine.honest``) and returns ``(status, body)``: the
honest answer with one node replaced, dropped or perturbed (a log-prob shifted, scaled
or flipped in sign, an id moved), any JSON, raw or truncated bytes, or another status.

Not a test module.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

from tests.teacher_server.openai_bodies import json_values


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``node`` (keys and indices), the root's ``()`` included."""
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += paths(value, (*prefix, i))
    return out


def _parent(root: Any, path: tuple) -> tuple[Any, Any]:
    node = root
    for step in path[:-1]:
        node = node[step]
    return node, path[-1]


@st.composite
def engine_replies(draw, honest: Any) -> tuple[int, bytes]:
    how = draw(st.sampled_from(["replace", "drop", "number", "rename", "any_json", "bytes",
                                "truncate", "status", "honest"]))
    body = copy.deepcopy(honest)
    where = [p for p in paths(body) if p]
    if how == "honest":
        return 200, json.dumps(body).encode()
    if how == "any_json":
        return 200, json.dumps(draw(json_values)).encode()
    if how == "bytes":
        return 200, draw(st.binary(max_size=300))
    if how == "truncate":
        data = json.dumps(body).encode()
        return 200, data[:draw(st.integers(0, max(len(data) - 1, 0)))]
    if how == "status":
        status = draw(st.sampled_from([201, 204, 301, 302, 400, 401, 403, 404, 418, 422]))
        return status, json.dumps(draw(json_values)).encode()
    numbers = [p for p in where if isinstance(_get(body, p), float)]
    if how == "number" and numbers:
        parent, key = _parent(body, draw(st.sampled_from(numbers)))
        value = parent[key]
        parent[key] = draw(st.sampled_from([
            -value, value + 10.0, value * 1e6, value - 1e-4, value - 0.7, 0.0, 1e-5, float("nan"),
            float("inf"), -float("inf"), 1e308, -1e308, "0.5", None]))
        return 200, json.dumps(body).encode()
    path = draw(st.sampled_from(where))
    parent, key = _parent(body, path)
    if how == "drop":
        del parent[key]
    elif how == "rename" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["0", "-1", "99999999", "1e3", "x", str(key) + "0"]))] = \
            parent.pop(key)
    else:
        parent[key] = draw(json_values)
    return 200, json.dumps(body).encode()


def _get(root: Any, path: tuple) -> Any:
    node = root
    for step in path:
        node = node[step]
    return node


def judge(outcome: Any, *, url: str, vocab: int, k: int, actual_P: Any = None) -> str:
    """``accepted`` (targets a loss may use), ``refused`` (one line naming ``url``), or
    what broke the rules. ``actual_P`` (the token each scored position predicts) also
    holds accepted targets to the one rule of both engine shapes: the actual token's
    log-prob is the one its top-k row gives it, and the position's distinct tokens, the
    actual one included, hold at most all the probability."""
    import numpy as np

    from miniverl.common.errors import TeacherError, TeacherUnavailable

    if isinstance(outcome, BaseException):
        text = str(outcome)
        if isinstance(outcome, (TeacherError, TeacherUnavailable)) and "\n" not in text \
                and url in text:
            return "refused"
        return f"bad refusal: {type(outcome).__name__}: {text[:300]}"
    a = outcome.arrays
    problems = []
    if a["ids"].size and not (a["ids"].min() >= 0 and a["ids"].max() < vocab):
        problems.append("an id outside the vocabulary")
    for name in ("logprobs", "target_logprobs"):
        if not (np.isfinite(a[name]).all() and (a[name] <= 0).all()):
            problems.append(f"{name} not finite and <= 0")
    if k < vocab and not np.isfinite(a["tail_logmass"]).all():
        problems.append("a non-finite tail")
    if (np.exp(a["logprobs"].astype(np.float64)).sum(axis=1) > 1 + 1e-3).any():
        problems.append("a top-k mass above 1")
    if actual_P is not None and not problems:
        lps, target = a["logprobs"].astype(np.float64), a["target_logprobs"].astype(np.float64)
        for p, token in enumerate(actual_P):
            hit = a["ids"][p] == token
            if hit.any() and abs(lps[p][hit][0] - target[p]) > 1e-3:
                problems.append(f"position {p}: the actual token's two log-probs differ")
            mass = np.exp(lps[p]).sum() + (0.0 if hit.any() else np.exp(target[p]))
            if mass > 1 + 1e-3:
                problems.append(f"position {p}: a mass above 1 with the actual token")
    return "accepted" if not problems else "accepted bad targets: " + ", ".join(problems)
