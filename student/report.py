"""Read a run directory and turn it into a report: one offline HTML file and a markdown summary.

``build_report(run_dir)`` reads ``recipe.yaml``, ``recipe.resolved.yaml``,
``manifest.json``, ``status.json``, ``events.jsonl``, ``metrics.jsonl``,
``trajectories.jsonl``, ``eval/*.json`` and (when readable) the targets cache, and
writes ``report.html`` (see :mod:`miniverl.student.report_html`). Every file may be
missing or partly corrupted: the reader records what it could not use in
``ReportData.problems`` and the report shows that list; it never raises on a bad run
directory.

This module is torch-free (it works on the core install) and never changes the run
directory except for the report files it is asked to write. It does not compute
student log-probabilities: the per-token divergence comes from what the targets
cache recorded.

Run it with ``miniverl report RUN [--out FILE] [--markdown FILE]``.
"""

from __future__ import annotations

import json
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from miniverl.common.errors import MiniverlError, ProvenanceError
from miniverl.common.trajectory import MODEL_SPANS, SpanType, Trajectory, trajectory_from_json

STRIP_TRAJECTORIES = 4
TERMINAL_EVENTS = ("run_completed", "run_failed", "run_interrupted")


@dataclass
class ReportData:
    """Everything the report shows, already parsed; ``problems`` lists what was unusable."""

    run_dir: Path
    problems: list[str] = field(default_factory=list)
    recipe_text: str | None = None
    resolved_text: str | None = None
    resolved: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    n_trajectories: int = 0
    tokens_by_span: Counter = field(default_factory=Counter)
    stop_reasons: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    failure_examples: dict[str, str] = field(default_factory=dict)
    successes: int = 0
    tool_calls: Counter = field(default_factory=Counter)
    by_version: Counter = field(default_factory=Counter)
    strip: list[Trajectory] = field(default_factory=list)
    token_text: dict[int, str] = field(default_factory=dict)
    token_text_note: str = ""
    targets: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    targets_note: str = ""

    # -- derived facts used by both renderers --------------------------------------

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.run_dir.name)

    @property
    def mode(self) -> str:
        for row in self.metrics:
            if row.get("mode"):
                return str(row["mode"])
        run = self.resolved.get("run") if isinstance(self.resolved.get("run"), dict) else {}
        return str(run.get("mode") or self.manifest.get("mode") or "unknown")

    @property
    def on_policy(self) -> str:
        flags = [row.get("on_policy") for row in self.metrics if "on_policy" in row]
        if flags:
            if all(flag is True for flag in flags):
                return "yes (every update trained on its own version's rollouts)"
            off = sum(1 for flag in flags if flag is not True)
            return f"no ({off} of {len(flags)} updates off-policy)"
        if self.mode == "opd":
            return "claimed by mode opd (no per-step record)"
        return "no (mode is off-policy by design)" if self.mode != "unknown" else "unknown"

    @property
    def steps(self) -> int:
        return len([row for row in self.metrics if "step" in row])

    @property
    def versions(self) -> tuple[Any, Any]:
        seen = [
            row["version"]
            for row in self.metrics + self.evals
            if isinstance(row.get("version"), int) and not isinstance(row.get("version"), bool)
        ]
        first = min(seen) if seen else self.manifest.get("start_version")
        last = max(seen) if seen else self.manifest.get("final_version")
        if isinstance(self.manifest.get("final_version"), int):
            last = self.manifest["final_version"]
        return first, last

    def wall_clock_s(self) -> float | None:
        stamps = [_parse_ts(e.get("ts")) for e in self.events]
        stamps = [s for s in stamps if s is not None]
        if len(stamps) < 2:
            stamps += [s for s in (_parse_ts(r.get("ts")) for r in self.metrics) if s]
        if len(stamps) < 2:
            return None
        return (max(stamps) - min(stamps)).total_seconds()

    def success_before_after(self) -> tuple[dict | None, dict | None]:
        if not self.evals:
            return None, None
        splits = Counter(e.get("split", "eval") for e in self.evals)
        split = splits.most_common(1)[0][0]
        rows = sorted(
            (e for e in self.evals if e.get("split", "eval") == split),
            key=lambda e: e.get("version") if isinstance(e.get("version"), int) else -1,
        )
        return rows[0], (rows[-1] if len(rows) > 1 else None)

    def teacher_identities(self) -> list[str]:
        names: list[str] = []
        for row in self.metrics:
            ident = teacher_label(row.get("teacher"))
            if ident and ident not in names:
                names.append(ident)
        for entry in self.manifest.get("teachers") or []:
            ident = teacher_label(entry) if isinstance(entry, dict) else ""
            if ident and ident not in names:
                names.append(ident)
        for event in self.events:
            for key in ("teacher", "new"):
                ident = (
                    teacher_label(event.get(key))
                    if event.get("event", "").startswith("teacher")
                    else ""
                )
                if ident and ident not in names:
                    names.append(ident)
        return names

    def teacher_events(self) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if str(e.get("event", "")).startswith("teacher")
            or e.get("event") in TERMINAL_EVENTS
            or e.get("event") == "run_started"
        ]

    def stale_dropped(self) -> int:
        return int(cumulative_total(self.metrics, "stale_dropped"))

    def time_split(self) -> dict[str, float]:
        keys = {
            "rollout": "time_rollout_s",
            "waiting for the teacher": "time_teacher_wait_s",
            "update": "time_update_s",
        }
        return {
            label: float(sum(_num(row.get(key)) or 0.0 for row in self.metrics))
            for label, key in keys.items()
        }

    def throughput(self) -> dict[str, float | None]:
        rates = [_num(row.get("positions_per_s")) for row in self.metrics]
        rates = [r for r in rates if r is not None]
        key = (
            "positions_scored"
            if any("positions_scored" in r for r in self.metrics)
            else "positions"
        )
        return {
            "positions_scored": float(sum(_num(r.get(key)) or 0 for r in self.metrics)),
            "positions_per_s": sum(rates) / len(rates) if rates else None,
            "bytes_sent": cumulative_total(self.metrics, "bytes_sent"),
            "bytes_received": cumulative_total(self.metrics, "bytes_received"),
        }


def cumulative_total(rows: list[dict[str, Any]], key: str) -> float:
    """Total of a client counter logged cumulatively per step; a drop means it restarted.

    ``stale_dropped`` and the byte counters in ``metrics.jsonl`` are the teacher client's
    running totals, so summing the rows would count every step again.
    """
    total = previous = 0.0
    for row in rows:
        value = _num(row.get(key))
        if value is None:
            continue
        total += value - previous if value >= previous else value
        previous = value
    return total


def teacher_label(ident: Any) -> str:
    """A short human label for a teacher identity (dict or string)."""
    if isinstance(ident, dict):
        name = ident.get("name") or ident.get("model") or "teacher"
        parts = [str(name)]
        if ident.get("instance"):
            parts.append(f"instance {str(ident['instance'])[:8]}")
        if ident.get("gen") is not None:
            parts.append(f"gen {ident['gen']}")
        return " · ".join(parts)
    return str(ident) if ident else ""


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None  # NaN is not a number to sum


def _parse_ts(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.astimezone()


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
    for lineno, line in enumerate(text.splitlines(), start=1):
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


def _read_yaml(text: str | None, data: ReportData, name: str) -> dict[str, Any]:
    if not text:
        return {}
    import yaml

    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        data.problems.append(f"{name} is not valid YAML ({str(exc).splitlines()[0]})")
        return {}
    return obj if isinstance(obj, dict) else {}


def _read_evals(data: ReportData) -> None:
    rows: dict[tuple[Any, Any], dict[str, Any]] = {}
    for event in data.events:
        if event.get("event") == "eval" and _num(event.get("success")) is not None:
            rows[(event.get("version"), event.get("split", "eval"))] = dict(event)
    eval_dir = data.run_dir / "eval"
    files = sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else []
    for path in files:
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data.problems.append(f"eval/{path.name} is not valid JSON and was skipped")
            continue
        if not isinstance(obj, dict) or _num(obj.get("success")) is None:
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
    try:
        fh = path.open(encoding="utf-8", errors="replace")
    except OSError as exc:
        data.problems.append(f"{path.name} is unreadable ({exc.strerror})")
        return
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                traj = trajectory_from_json(line, where=f"{path.name}:{lineno}")
            except ProvenanceError as exc:
                bad.append(lineno)
                first_error = first_error or str(exc)
                continue
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
        from tokenizers import Tokenizer

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
    from miniverl.student import report_targets

    data.targets, data.targets_note = report_targets.load_strip_targets(
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
    data.manifest = _read_json(run_dir / "manifest.json", data, "the manifest")
    data.status = _read_json(run_dir / "status.json", data, "the run status")
    data.events = _read_jsonl(run_dir / "events.jsonl", data, "the timeline")
    data.metrics = _read_jsonl(run_dir / "metrics.jsonl", data, "the learning curves")
    _read_evals(data)
    _read_trajectories(data)
    _load_targets(data)
    _load_token_text(data)
    return data


def build_report(
    run_dir: str | Path, out: str | Path | None = None, markdown: str | Path | None = None
) -> Path:
    """Write the run's HTML report (default ``<run>/report.html``) and return its path.

    ``markdown`` also writes a markdown summary. Missing or corrupted inputs are listed in
    the report instead of failing; only an absent run directory or an unwritable output
    raises :class:`MiniverlError`.
    """
    from miniverl.student.report_html import render_html

    data = load_run(run_dir)
    out_path = Path(out) if out else data.run_dir / "report.html"
    _write(out_path, render_html(data))
    if markdown:
        _write(Path(markdown), render_markdown(data))
    return out_path


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise MiniverlError(
            f"cannot write {path} ({exc.strerror}); choose a writable path with --out"
        ) from exc


# -- markdown ----------------------------------------------------------------------------


def fmt_success(row: dict | None) -> str:
    if not row:
        return "n/a"
    return f"{float(row['success']):.1%} (v{row.get('version', '?')}, n={row.get('n', '?')})"


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def summary_rows(data: ReportData) -> list[tuple[str, str]]:
    """The summary as (label, value) pairs, shared by the HTML and markdown output."""
    before, after = data.success_before_after()
    first, last = data.versions
    status = data.status.get("status", "unknown")
    if data.status.get("reason"):
        status += f" ({data.status['reason']})"
    return [
        ("run", data.run_id),
        ("status", str(status)),
        ("mode", data.mode),
        ("on-policy", data.on_policy),
        (
            "parameter versions",
            f"{first if first is not None else '?'} → {last if last is not None else '?'}",
        ),
        ("optimizer steps", str(data.steps)),
        ("wall clock", fmt_seconds(data.wall_clock_s())),
        ("success before → after", f"{fmt_success(before)} → {fmt_success(after)}"),
        ("teachers", "; ".join(data.teacher_identities()) or "none recorded"),
        ("stale replies dropped", str(data.stale_dropped())),
        ("trajectories", str(data.n_trajectories)),
    ]


def provenance_rows(data: ReportData) -> list[tuple[str, str, int, float]]:
    total = sum(data.tokens_by_span.values()) or 1
    return [
        (
            span.value,
            "in loss" if span in MODEL_SPANS else "context",
            data.tokens_by_span.get(span.value, 0),
            data.tokens_by_span.get(span.value, 0) / total,
        )
        for span in SpanType
    ]


def render_markdown(data: ReportData) -> str:
    """A short markdown summary of the run (the HTML report has the full picture)."""
    lines = [f"# Run report: {data.run_id}", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {_md(v)} |" for k, v in summary_rows(data)]
    split = data.time_split()
    total = sum(split.values())
    lines += ["", "## Where the time went", ""]
    for label, seconds in split.items():
        share = f" ({seconds / total:.0%})" if total else ""
        lines.append(f"- {label}: {fmt_seconds(seconds)}{share}")
    tp = data.throughput()
    rate = tp["positions_per_s"]
    lines.append(
        f"- positions scored: {tp['positions_scored']:.0f}"
        f" ({'n/a' if rate is None else f'{rate:.1f}'} /s); bytes sent "
        f"{fmt_bytes(tp['bytes_sent'])}, received {fmt_bytes(tp['bytes_received'])}"
    )
    lines += [
        "",
        "## Token provenance",
        "",
        "| span | role | tokens | share |",
        "| --- | --- | ---: | ---: |",
    ]
    lines += [f"| {s} | {r} | {n} | {f:.1%} |" for s, r, n, f in provenance_rows(data)]
    if data.evals:
        lines += [
            "",
            "## Evaluations",
            "",
            "| version | split | success | n |",
            "| ---: | --- | ---: | ---: |",
        ]
        lines += [
            f"| {e.get('version', '?')} | {_md(str(e.get('split', 'eval')))} | "
            f"{float(e['success']):.1%} | {e.get('n', '?')} |"
            for e in data.evals
        ]
    if data.stop_reasons:
        lines += ["", "## Stop reasons", ""]
        lines += [f"- {_md(k)}: {v}" for k, v in data.stop_reasons.most_common()]
    if data.failures:
        lines += ["", "## Verifier failures", ""]
        lines += [f"- {_md(k)}: {v}" for k, v in data.failures.most_common(10)]
    if data.problems:
        lines += ["", "## Missing or unreadable inputs", ""]
        lines += [f"- {_md(p)}" for p in data.problems]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
