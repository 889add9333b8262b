"""Read a run directory into :class:`~miniverl.student.report.data.ReportData`.

``load_run(run_dir)`` reads ``recipe.yaml``, ``recipe.resolved.yaml``,
``manifest.json``, ``status.json``, ``events.jsonl``, ``metrics.jsonl``,
``trajectories.jsonl``, ``eval/*.json`` and (when readable) the targets cache. Every
file may be missing or partly corrupted: the reader records what it could not use in
``ReportData.problems``; it never raises on a bad run directory, only on an absent one.

This module is torch-free (it works on the core install), never writes to the run
directory and renders nothing (that is :mod:`~miniverl.student.report.build`). It does
not compute student log-probabilities: the per-token divergence comes from what the
targets cache recorded.
"""

from __future__ import annotations

import json
import re
from collections import deque
from pathlib import Path
from typing import Any

import yaml

from miniverl.common.errors import MiniverlError, ProvenanceError
from miniverl.common.hashing import SEAL_FIELD
from miniverl.common.manifest import manifest_seal_status
from miniverl.common.trajectory import Trajectory, parse_trajectory_line, unsigned_warning
from miniverl.student.report.data import ReportData, as_number
from miniverl.student.report.targets import load_strip_targets

STRIP_TRAJECTORIES = 4


# -- readers (never raise on bad files) --------------------------------------------------


def _read_text(path: Path, data: ReportData, what: str) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        data.problems.append(f"{path.name} is missing: {what} is not shown")
    except OSError as exc:
        data.problems.append(f"{path.name} is unreadable ({exc.strerror}): {what} is not shown")
    return None


def _read_json(path: Path, data: ReportData, what: str) -> dict[str, Any]:
    text = _read_text(path, data, what)
    if text is None:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        data.problems.append(
            f"{path.name} is not valid JSON (line {exc.lineno}): {what} is not shown"
        )
        return {}
    if not isinstance(obj, dict):
        data.problems.append(f"{path.name} is not a JSON object: {what} is not shown")
        return {}
    return obj


def _read_jsonl(path: Path, data: ReportData, what: str) -> list[dict[str, Any]]:
    text = _read_text(path, data, what)
    if text is None:
        return []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    # "\n" only: str.splitlines would also cut a row at a raw U+2028 inside a string.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            bad.append(lineno)
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            bad.append(lineno)
    if bad:
        data.problems.append(
            f"{path.name}: {len(bad)} corrupted line(s) skipped (line {_lines(bad)})"
        )
    return rows


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:5])
    return shown + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")


def _read_manifest(path: Path, data: ReportData) -> dict[str, Any]:
    """The manifest without its digest; a mismatch is listed (it is still shown).

    A manifest that exists but is not a JSON object counts as tampered too: the run
    wrote a valid one, so anything else is damage.
    """
    known = len(data.problems)
    manifest = _read_json(path, data, "the manifest")
    if not manifest:
        if path.is_file() and len(data.problems) > known:
            data.tampered.append(
                f"{data.problems[-1]}; the manifest was modified or corrupted after the run "
                "wrote it; restore it from a copy or rerun"
            )
        return manifest
    status = manifest_seal_status(manifest)
    if status == "mismatch":
        problem = (
            f"manifest.json does not match its {SEAL_FIELD} (sha256 of its content): it was "
            "modified or corrupted after the run wrote it; restore it from a copy or rerun"
        )
        data.problems.append(problem)
        data.tampered.append(problem)
    elif status == "unsigned":
        data.problems.append(
            f"manifest.json has no {SEAL_FIELD} (written before manifests were sealed): "
            "changes to it cannot be detected"
        )
    return {k: v for k, v in manifest.items() if k != SEAL_FIELD}


def _read_yaml(text: str | None, data: ReportData, name: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        data.problems.append(f"{name} is not valid YAML ({str(exc).splitlines()[0]})")
        return {}
    return obj if isinstance(obj, dict) else {}


def _read_evals(data: ReportData) -> None:
    rows: dict[tuple[Any, Any], dict[str, Any]] = {}
    for event in data.events:
        if event.get("event") == "eval" and as_number(event.get("success")) is not None:
            rows[(event.get("version"), event.get("split", "eval"))] = dict(event)
    eval_dir = data.run_dir / "eval"
    files = sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else []
    for path in files:
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data.problems.append(f"eval/{path.name} is not valid JSON and was skipped")
            continue
        if not isinstance(obj, dict) or as_number(obj.get("success")) is None:
            data.problems.append(f"eval/{path.name} has no numeric 'success' and was skipped")
            continue
        if not isinstance(obj.get("version"), int):
            found = re.search(r"(\d+)", path.stem)
            obj["version"] = int(found.group(1)) if found else None
        rows[(obj.get("version"), obj.get("split", "eval"))] = obj
    if not eval_dir.is_dir() and not rows:
        data.problems.append("eval/ is missing and no eval events were logged: no success curve")
    data.evals = sorted(
        rows.values(), key=lambda e: e.get("version") if isinstance(e.get("version"), int) else -1
    )


def _normalise_reason(reason: str) -> str:
    """Group verifier reasons that differ only in numbers or quoted values."""
    reason = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", reason.strip())
    reason = re.sub(r"-?\d+(\.\d+)?", "N", reason)
    return reason[:120] or "(no reason given)"


def _latest_eval_trajectories(run_dir: Path) -> Path | None:
    def version(path: Path) -> int:
        found = re.search(r"(\d+)", path.name)
        return int(found.group(1)) if found else -1

    files = sorted((run_dir / "eval").glob("*.jsonl"), key=version)
    return files[-1] if files else None


def _read_trajectories(data: ReportData) -> None:
    path = data.run_dir / "trajectories.jsonl"
    if not path.exists():
        fallback = _latest_eval_trajectories(data.run_dir)
        if fallback is None:
            data.problems.append(
                "trajectories.jsonl is missing: no provenance table, strip or taxonomy"
            )
            return
        data.problems.append(
            "trajectories.jsonl is missing (an sft run logs no rollouts): provenance, strip "
            f"and taxonomy show eval/{fallback.name} instead"
        )
        path = fallback
    first: Trajectory | None = None
    last: deque[Trajectory] = deque(maxlen=STRIP_TRAJECTORIES - 1)
    bad: list[int] = []
    first_error = ""
    unsigned = 0
    try:
        fh = path.open(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        data.problems.append(f"{path.name} is unreadable ({exc.strerror})")
        return
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                traj, sealed = parse_trajectory_line(line, where=f"{path.name}:{lineno}")
            except ProvenanceError as exc:
                bad.append(lineno)
                first_error = first_error or str(exc)
                continue
            unsigned += not sealed
            data.n_trajectories += 1
            data.by_version[traj.policy_version] += 1
            for span in traj.spans:
                data.tokens_by_span[span.type.value] += span.end - span.start
            data.stop_reasons[traj.stop_reason.value] += 1
            data.tool_calls["total"] += traj.tool_calls.total
            data.tool_calls["parse_errors"] += traj.tool_calls.parse_errors
            data.tool_calls["failed"] += traj.tool_calls.failed
            if traj.verifier.success:
                data.successes += 1
            else:
                key = _normalise_reason(traj.verifier.reason)
                data.failures[key] += 1
                data.failure_examples.setdefault(key, traj.verifier.reason[:200])
            if first is None:
                first = traj
            else:
                last.append(traj)
    if bad:
        data.problems.append(
            f"{path.name}: {len(bad)} bad line(s) skipped (line {_lines(bad)}); "
            f"first: {first_error[:200]}"
        )
        data.tampered.append(
            f"{first_error}" + (f" ({len(bad) - 1} more bad line(s))" if len(bad) > 1 else "")
        )
    if unsigned:
        data.problems.append(unsigned_warning(path.name, unsigned))
    data.strip = [t for t in ([first] if first else []) + list(last)]


# -- token text and teacher targets for the divergence strip ---------------------------


def _load_token_text(data: ReportData) -> None:
    ids = {tok for traj in data.strip for tok in traj.tokens}
    for alts in data.targets.values():
        for entry in alts.values():
            ids.update(int(i) for i in entry.get("top_ids", []))
    tok_dir = data.manifest.get("tokenizer_dir")
    if not tok_dir:
        data.token_text_note = "no tokenizer_dir in the manifest: tokens are shown as ids"
        return
    tok_file = Path(str(tok_dir)) / "tokenizer.json"
    try:
        from tokenizers import Tokenizer  # optional (the train extra): ids are shown without it

        tokenizer = Tokenizer.from_file(str(tok_file))
    except ImportError:
        data.token_text_note = "the 'tokenizers' package is not installed: tokens are shown as ids"
        return
    except Exception as exc:  # a tokenizer file can fail in many ways; ids still work
        data.token_text_note = f"cannot load {tok_file.name} ({type(exc).__name__}): ids shown"
        return
    for tok in ids:
        try:
            text = tokenizer.decode([tok], skip_special_tokens=False)
        except Exception:  # an id outside the vocabulary
            text = ""
        if not text or "\ufffd" in text:  # a byte-level piece of a multi-byte character
            text = tokenizer.id_to_token(tok) or f"#{tok}"
        data.token_text[tok] = text
    data.token_text_note = "token text decoded with the run's tokenizer"


def _load_targets(data: ReportData) -> None:
    """Per-position teacher targets for the strip trajectories, from the targets cache."""
    data.targets, data.targets_note = load_strip_targets(
        data.run_dir, data.manifest, data.resolved, data.strip
    )


# -- entry points ------------------------------------------------------------------------


def load_run(run_dir: str | Path) -> ReportData:
    """Parse a run directory into :class:`ReportData`; never raises on bad files."""
    run_dir = Path(run_dir)
    data = ReportData(run_dir=run_dir)
    if not run_dir.is_dir():
        raise MiniverlError(
            f"run directory {run_dir} does not exist; pass a folder under runs/ "
            "(list them with `ls runs/`)"
        )
    data.recipe_text = _read_text(run_dir / "recipe.yaml", data, "the submitted recipe")
    data.resolved_text = _read_text(run_dir / "recipe.resolved.yaml", data, "the resolved recipe")
    data.resolved = _read_yaml(data.resolved_text or data.recipe_text, data, "recipe")
    data.manifest = _read_manifest(run_dir / "manifest.json", data)
    data.status = _read_json(run_dir / "status.json", data, "the run status")
    data.events = _read_jsonl(run_dir / "events.jsonl", data, "the timeline")
    data.metrics = _read_jsonl(run_dir / "metrics.jsonl", data, "the learning curves")
    _read_evals(data)
    _read_trajectories(data)
    _load_targets(data)
    _load_token_text(data)
    return data
