"""``miniverl inspect FILE.jsonl|RUN_DIR``: check trajectories and show where tokens came from.

Given a run directory it picks the run's trajectories files and says which:
``trajectories.jsonl`` (the episodes trained on) and the newest
``eval/<split>-v<version>.trajectories.jsonl`` of each split (the last held-out
evaluation), each summarised on its own; older eval files are counted, not read.

Every trajectory is re-validated on read (spans tile the sequence, the stored loss
mask equals the mask derived from the spans); the first bad line stops the command
with ``file:line`` and exit 1. Then it prints the provenance table (tokens per span
type and whether they are in the loss), stop reasons, verifier success and tool-call
statistics; ``--json`` prints the same as JSON. ``--trajectory N`` shows one
trajectory span by span, coloured by type: token ids, or text when ``--tokenizer DIR``
points at a directory with ``tokenizer.json`` (decoded with the ``tokenizers``
library), plus the chat messages stored with it.

Torch-free: works on the core install. It does not modify or rescore anything.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
from collections import Counter
from pathlib import Path
from typing import Any

import typer

SPAN_STYLES = {
    "system": "dim",
    "user": "blue",
    "tool_result": "yellow",
    "assistant_text": "magenta",
    "assistant_tool_call": "cyan",
    "assistant_final": "green",
}


def _eval_file_key(path: Path) -> tuple[str, int, str]:
    """``eval-v12.trajectories.jsonl`` sorts by split, then version as a number."""
    stem = path.name.removesuffix(".trajectories.jsonl")
    split, _, version = stem.rpartition("-v")
    return (split, int(version), stem) if version.isdigit() else (stem, -1, stem)


def pick_run_files(run_dir: Path) -> dict[str, list[Path]]:
    """A run directory's trajectories files: ``{"training": [...], "eval": [...],
    "not_read": [...]}``; ``eval`` holds the newest file of each split."""
    from miniverl.common.errors import ConfigError

    evals = sorted((run_dir / "eval").glob("*.trajectories.jsonl"), key=_eval_file_key)
    newest = {_eval_file_key(p)[0]: p for p in evals}  # sorted: the last one per split wins
    picked = {
        "training": [p for p in [run_dir / "trajectories.jsonl"] if p.is_file()],
        "eval": sorted(newest.values(), key=_eval_file_key),
        "not_read": [p for p in evals if p not in newest.values()],
    }
    if not picked["training"] and not picked["eval"]:
        raise ConfigError(
            f"{str(run_dir)!r} is a directory without trajectories files (trajectories.jsonl, "
            "eval/*.trajectories.jsonl); pass a run directory that has sampled, or a .jsonl file"
        )
    return picked


def picked_line(run_dir: Path, picked: dict[str, list[Path]]) -> str:
    """What ``inspect RUN_DIR`` read, in one line."""
    parts = []
    if picked["training"]:
        parts.append("trajectories.jsonl (the episodes trained on)")
    for path in picked["eval"]:
        parts.append(f"eval/{path.name} (the last held-out evaluation)")
    line = f"run {run_dir}: picked " + " and ".join(parts)
    if picked["not_read"]:
        line += (f"; {len(picked['not_read'])} earlier eval file(s) not read (pass one to "
                 "inspect it)")
    return line


def summarize_file(path: Path) -> dict[str, Any]:
    """Validate every trajectory in ``path`` and aggregate provenance statistics."""
    from miniverl.common.errors import ConfigError
    from miniverl.common.trajectory import SpanType, iter_trajectories

    if not path.is_file():
        raise ConfigError(
            f"trajectories file {str(path)!r} does not exist; pass a .jsonl file or a run "
            "directory"
        )
    tokens = Counter({t.value: 0 for t in SpanType})
    spans = Counter({t.value: 0 for t in SpanType})
    stops: Counter = Counter()
    sources: Counter = Counter()
    envs: Counter = Counter()
    by_name: Counter = Counter()
    calls = {"total": 0, "parse_errors": 0, "failed": 0}
    versions: set[int] = set()
    fps: set[str] = set()
    n = successes = 0
    for traj in iter_trajectories(path):
        n += 1
        for span in traj.spans:
            tokens[span.type.value] += span.end - span.start
            spans[span.type.value] += 1
        stops[traj.stop_reason.value] += 1
        sources[traj.source] += 1
        envs[traj.environment] += 1
        successes += traj.verifier.success
        versions.add(traj.policy_version)
        fps.add(traj.tokenizer_fp)
        calls["total"] += traj.tool_calls.total
        calls["parse_errors"] += traj.tool_calls.parse_errors
        calls["failed"] += traj.tool_calls.failed
        by_name.update(traj.tool_calls.by_name)
    if n == 0:
        raise ConfigError(
            f"trajectories file {str(path)!r} holds no trajectories (it is empty); pass the "
            "trajectories.jsonl of a run that has sampled"
        )
    total_tokens = sum(tokens.values())
    return {
        "file": str(path),
        "trajectories": n,
        "valid": True,
        "tokens": total_tokens,
        "provenance": [
            {
                "span_type": t.value,
                "tokens": tokens[t.value],
                "spans": spans[t.value],
                "share": tokens[t.value] / total_tokens if total_tokens else 0.0,
                "in_loss": t.trainable,
            }
            for t in SpanType
        ],
        "loss_tokens": sum(tokens[t.value] for t in SpanType if t.trainable),
        "stop_reasons": dict(stops.most_common()),
        "success": successes / n if n else 0.0,
        "sources": dict(sources),
        "environments": dict(envs),
        "policy_versions": sorted(versions),
        "tokenizer_fps": sorted(fps),
        "tool_calls": {**calls, "by_name": dict(by_name.most_common())},
    }


def _print_summary(info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    n = info["trajectories"]
    console.print(
        f"[bold]{info['file']}[/bold]: {n} trajectories, {info['tokens']} tokens, "
        f"all masks re-derived from spans [green]OK[/green]"
    )
    versions = info["policy_versions"]
    if versions:
        console.print(
            f"policy versions {versions[0]}..{versions[-1]}, sources {info['sources']}, "
            f"environments {info['environments']}, success {info['success']:.1%}"
        )
    prov = Table(title="provenance by span type")
    for col, justify in (("span type", "left"), ("tokens", "right"), ("spans", "right"),
                         ("share", "right"), ("in loss", "center")):
        prov.add_column(col, justify=justify)
    for row in info["provenance"]:
        style = SPAN_STYLES.get(row["span_type"], "")
        prov.add_row(
            f"[{style}]{row['span_type']}[/{style}]",
            str(row["tokens"]),
            str(row["spans"]),
            f"{row['share']:.1%}",
            "yes" if row["in_loss"] else "no",
        )
    prov.add_row("[bold]in loss[/bold]", str(info["loss_tokens"]), "", "", "")
    console.print(prov)
    stops = Table(title="stop reasons")
    stops.add_column("reason")
    stops.add_column("episodes", justify="right")
    stops.add_column("share", justify="right")
    for reason, count in info["stop_reasons"].items():
        stops.add_row(reason, str(count), f"{count / n:.1%}" if n else "-")
    console.print(stops)
    calls = info["tool_calls"]
    tools = Table(title="tool calls")
    tools.add_column("tool")
    tools.add_column("calls", justify="right")
    for name, count in calls["by_name"].items():
        tools.add_row(name, str(count))
    tools.add_row("[bold]total[/bold]", str(calls["total"]))
    tools.add_row("parse errors", str(calls["parse_errors"]))
    tools.add_row("failed (error results)", str(calls["failed"]))
    if n:
        tools.add_row("per episode", f"{calls['total'] / n:.2f}")
    console.print(tools)


def _decoder(tokenizer_dir: Path | None):
    if tokenizer_dir is None:
        return None
    from miniverl.common.errors import ConfigError, require

    tokenizers = require("tokenizers", "train")
    file = tokenizer_dir / "tokenizer.json"
    if not file.is_file():
        raise ConfigError(
            f"--tokenizer {str(tokenizer_dir)!r} has no tokenizer.json; pass a Hugging Face "
            "model or tokenizer directory"
        )
    tok = tokenizers.Tokenizer.from_file(str(file))
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def show_trajectory(path: Path, index: int, tokenizer_dir: Path | None, as_json: bool) -> None:
    """Print trajectory ``index`` of ``path`` span by span."""
    import json

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from miniverl.common.errors import ConfigError
    from miniverl.common.trajectory import iter_trajectories

    if not path.is_file():
        raise ConfigError(f"trajectories file {str(path)!r} does not exist; pass a .jsonl file")
    traj, count = None, 0
    for i, t in enumerate(iter_trajectories(path)):  # validates every line, not just N
        count += 1
        if i == index:
            traj = t
    if traj is None:
        raise ConfigError(
            f"--trajectory {index} is out of range: {path} has {count} trajectories; "
            f"pick 0..{max(count - 1, 0)}"
        )
    decode = _decoder(tokenizer_dir)
    if as_json:
        record = traj.model_dump(mode="json")
        if decode is not None:
            record["span_text"] = [decode(traj.tokens[s.start : s.end]) for s in traj.spans]
        typer.echo(json.dumps(record, indent=2, ensure_ascii=False))
        return
    console = Console()
    console.print(
        f"[bold]{traj.id}[/bold]  env {traj.environment}  task {traj.task_id} "
        f"({traj.split}, {traj.difficulty})  version {traj.policy_version}  seed {traj.seed}  "
        f"source {traj.source}"
    )
    verdict = "[green]success[/green]" if traj.verifier.success else "[red]fail[/red]"
    console.print(
        f"stop {traj.stop_reason.value}  verifier {verdict} ({traj.verifier.reason})  "
        f"tool calls {traj.tool_calls.total} (parse errors {traj.tool_calls.parse_errors}, "
        f"failed {traj.tool_calls.failed})  tokenizer {traj.tokenizer_fp}"
    )
    legend = Text("legend: ")
    for name, style in SPAN_STYLES.items():
        legend.append(name, style=style)
        legend.append("  ")
    console.print(legend)
    for span in traj.spans:
        ids = traj.tokens[span.start : span.end]
        style = SPAN_STYLES.get(span.type.value, "")
        loss = "loss" if span.type.trainable else "ctx"
        head = Text(f"[{span.start}:{span.end}) {span.type.value} ({loss})", style=f"bold {style}")
        console.print(head)
        body = decode(ids) if decode is not None else " ".join(map(str, ids))
        console.print(Text(body, style=style))
    if traj.messages:
        table = Table(title="messages")
        table.add_column("#", justify="right")
        table.add_column("role")
        table.add_column("content")
        for i, msg in enumerate(traj.messages):
            content = str(msg.get("content", ""))
            if msg.get("tool_calls"):
                content += "\n" + json.dumps(msg["tool_calls"], ensure_ascii=False)
            table.add_row(str(i), str(msg.get("role", "?")), content)
        console.print(table)


def _inspect_run(run_dir: Path, trajectory: int | None, tokenizer: Path | None,
                 as_json: bool) -> None:
    """``inspect RUN_DIR``: the picked files, each summarised; ``--trajectory N`` reads
    the training file (the newest eval file when there is none) and names it on stderr."""
    import json

    picked = pick_run_files(run_dir)
    if trajectory is not None:
        chosen = (picked["training"] or picked["eval"][-1:])[0]
        typer.echo(f"run {run_dir}: picked {chosen.relative_to(run_dir)}", err=True)
        show_trajectory(chosen, trajectory, tokenizer, as_json)
        return
    summaries = [summarize_file(p) for p in picked["training"] + picked["eval"]]
    if as_json:
        listed = {name: [str(p) for p in paths] for name, paths in picked.items()}
        typer.echo(json.dumps({"run": str(run_dir), "picked": listed, "files": summaries},
                              indent=2))
        return
    typer.echo(picked_line(run_dir, picked))
    for info in summaries:
        _print_summary(info)


def register(app: typer.Typer) -> None:
    """Add ``inspect`` to ``app``."""

    @app.command("inspect")
    def inspect_cmd(
        file: Path = typer.Argument(
            ..., help="A trajectories .jsonl file, or a run directory (its files are picked)."
        ),
        trajectory: int | None = typer.Option(
            None, "--trajectory", "-n", min=0, help="Show trajectory N (0-based) span by span."
        ),
        tokenizer: Path | None = typer.Option(
            None, "--tokenizer", help="Tokenizer directory (tokenizer.json) to show text."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    ) -> None:
        """Validate trajectories and show token provenance, stop reasons, tool calls."""
        import json

        if file.is_dir():
            _inspect_run(file, trajectory, tokenizer, as_json)
            return
        if trajectory is not None:
            show_trajectory(file, trajectory, tokenizer, as_json)
            return
        info = summarize_file(file)
        if as_json:
            typer.echo(json.dumps(info, indent=2))
        else:
            _print_summary(info)
