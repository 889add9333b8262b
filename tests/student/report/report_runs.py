"""Hand-made run directories for the report tests, written as the contract says a trainer does.

``make_run(path)`` writes a complete, realistic OPD run (recipe, resolved recipe,
manifest, status, events with a teacher reload and a restart, metrics, trajectories,
eval summaries and a character-level tokenizer); tests then delete or corrupt files.
``make_pair(folder)`` writes two such runs that differ in recipe, loss and length (the
comparison page's tests). ``toy_sft_recipe(output_dir)`` is a recipe whose real run takes seconds on a CPU, for
the tests that train one (the report a trainer writes, a benchmark cell).
Not a test module: imported by tests in several folders.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from miniverl.common.hashing import seal
from miniverl.common.trajectory import (
    Span,
    SpanType,
    StopReason,
    ToolCallStats,
    Trajectory,
    VerifierResult,
    write_trajectories,
)
from tests.toy_kit import ONE_LAYER

ALPHABET = list('abcdefghijklmnopqrstuvwxyz0123456789 +-*/=(){}":,.<>_?\n') + [
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
]
VOCAB = {tok: i for i, tok in enumerate(ALPHABET)}


def write_tokenizer(folder: Path) -> Path:
    """A tiny character-level tokenizer.json (WordLevel over single characters)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def encode(text: str) -> list[int]:
    return [VOCAB[c] for c in text]


def make_trajectory(i: int, version: int, success: bool) -> Trajectory:
    parts = [
        (SpanType.SYSTEM, "<|im_start|>system\nyou are a calculator agent. use tools.<|im_end|>\n"),
        (
            SpanType.USER,
            f"<|im_start|>user\nwhat is {i}+{version}*3?<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            SpanType.ASSISTANT_TOOL_CALL,
            f'<tool_call>{{"name":"mul","arguments":{{"a":{version},"b":3}}}}</tool_call>',
        ),
        (
            SpanType.TOOL_RESULT,
            f"<|im_end|>\n<|im_start|>user\n{version * 3}<|im_end|>\n<|im_start|>assistant\n",
        ),
        (SpanType.ASSISTANT_TEXT, "so the sum is "),
        (SpanType.ASSISTANT_FINAL, f"{i + version * 3 + (0 if success else 1)}<|im_end|>"),
    ]
    tokens: list[int] = []
    spans: list[Span] = []
    for kind, text in parts:
        ids = []
        rest = text
        while rest:
            special = next((s for s in ALPHABET[-4:] if rest.startswith(s)), None)
            piece = special or rest[0]
            ids.append(VOCAB[piece])
            rest = rest[len(piece) :]
        spans.append(Span(type=kind, start=len(tokens), end=len(tokens) + len(ids)))
        tokens += ids
    return Trajectory(
        id=f"traj-{version}-{i}",
        tokens=tokens,
        spans=spans,
        policy_version=version,
        tokenizer_fp="sha256:" + "0" * 64,
        environment="calculator",
        task_id=f"train-{i}",
        stop_reason=StopReason.FINAL_ANSWER if i % 3 else StopReason.MAX_TURNS,
        tool_calls=ToolCallStats(total=1, parse_errors=0, failed=0, by_name={"mul": 1}),
        verifier=VerifierResult(
            success=success,
            score=1.0 if success else 0.0,
            reason="" if success else f"expected {i + version * 3}, got {i + version * 3 + 1}",
        ),
        seed=i,
    )


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_targets(path: Path, trajs: list[Trajectory], k: int = 4) -> None:
    """Teacher top-k targets for ``trajs`` in a real targets cache (positions included)."""
    import numpy as np

    from miniverl.student.targets_cache import TargetsCache
    from miniverl.student.targets_entries import CacheIdentity, EntryKey

    identity = CacheIdentity(
        tokenizer_fp="sha256:" + "0" * 64,
        vocab_size=len(VOCAB),
        kind="topk",
        k=k,
        objective="bucketed_topk_tail",
        temperature=1.0,
    )
    cache = TargetsCache(path, identity)
    rng = np.random.default_rng(0)
    items = []
    for traj in trajs:
        pos_P = traj.target_positions().astype(np.int32)
        n = len(pos_P)
        ids_PK = rng.integers(0, len(VOCAB), size=(n, k)).astype(np.int32)
        lps_PK = np.sort(np.log(rng.dirichlet(np.ones(k + 1), size=n)[:, :k]), axis=1)[:, ::-1]
        target_P = np.where(rng.random(n) < 0.8, lps_PK[:, 0], lps_PK[:, -1] - 2.0)
        arrays = {
            "ids": ids_PK,
            "logprobs": np.ascontiguousarray(lps_PK, dtype=np.float32),
            "tail_logmass": np.full(n, -3.0, dtype=np.float32),
            "target_logprobs": target_P.astype(np.float32),
            "positions": pos_P,
        }
        key = EntryKey(traj.id, traj.policy_version, "toy-teacher", "a1b2c3d4e5f6", 0)
        items.append((key, arrays))
    cache.put_many(items)


def make_run(
    path: Path, steps: int = 12, with_tokenizer: bool = True, with_targets: bool = False
) -> Path:
    """Write a complete OPD run directory at ``path`` and return it."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "eval").mkdir(exist_ok=True)
    (path / "logs").mkdir(exist_ok=True)
    recipe = (
        "schema_version: 1\nrun:\n  name: toy-opd\n  mode: opd\n  seed: 0\n"
        "loss:\n  objective: bucketed_topk_tail\n  top_k: 8\ntrain:\n  cycles: 12\n"
    )
    (path / "recipe.yaml").write_text(recipe, encoding="utf-8")
    (path / "recipe.resolved.yaml").write_text(recipe + "eval:\n  split: eval\n", encoding="utf-8")
    manifest = {
        "run_id": path.name,
        "mode": "opd",
        "on_policy": True,
        "recipe_digest": "sha256:" + "ab" * 32,
        "python": "3.11.9",
        "os": "Linux 6.1.0",
        "packages": {"miniverl": "0.1.0", "torch": "2.13.0", "bitsandbytes": None},
        "hardware": {"machine": "x86_64", "processor": None, "cpu_count": 2, "gpus": []},
        "models": {
            "student": {"source": "toy", "id": None, "revision": None, "toy": {"hidden": 64}},
            "teacher": {"source": "toy", "id": None, "revision": None, "toy": {"hidden": 128}},
        },
        "teachers": [
            {
                "from_version": 0,
                "to_version": None,
                "how": "connect",
                "name": "toy-teacher",
                "instance": "a1b2c3d4e5f6",
                "gen": 0,
            }
        ],
        "seeds": {"run": 0, "split": 0},
    }
    if with_tokenizer:
        manifest["tokenizer_dir"] = str(write_tokenizer(path / "tokenizer"))
    (path / "manifest.json").write_text(json.dumps(seal(manifest), indent=2), encoding="utf-8")
    (path / "status.json").write_text(
        json.dumps(
            {"status": "completed", "updated_at": "2025-01-01T00:10:00+00:00", "reason": None}
        ),
        encoding="utf-8",
    )
    teacher_a = {"name": "toy-teacher", "instance": "a1b2c3d4e5f6", "gen": 0}
    teacher_b = {"name": "toy-teacher", "instance": "a1b2c3d4e5f6", "gen": 1}
    teacher_c = {"name": "toy-teacher", "instance": "ffee00112233", "gen": 0}
    metrics, events = (
        [],
        [
            {"ts": "2025-01-01T00:00:00+00:00", "event": "run_started", "mode": "opd"},
            {"ts": "2025-01-01T00:00:02+00:00", "event": "teacher_connected", "teacher": teacher_a},
            {
                "ts": "2025-01-01T00:00:03+00:00",
                "event": "eval",
                "version": 0,
                "split": "eval",
                "success": 0.05,
                "n": 20,
                "by_difficulty": {"easy": 0.05},
            },
        ],
    )
    for step in range(steps):
        teacher = teacher_a if step < 4 else teacher_b if step < 8 else teacher_c
        metrics.append(
            {
                "ts": f"2025-01-01T00:{step // 2 + 1:02d}:{(step % 2) * 30:02d}+00:00",
                "step": step,
                "version": step + 1,
                "mode": "opd",
                "on_policy": True,
                "loss": 2.0 * math.exp(-step / 5) + 0.1,
                "divergence": 1.5 * math.exp(-step / 4),
                "positions": 180 + step,
                "tokens": 900,
                "teacher": teacher,
                "stale_dropped": 2 if step >= 8 else 0,
                "time_rollout_s": 3.0,
                "time_teacher_wait_s": 0.8 + 0.05 * step,
                "time_update_s": 1.2,
                "positions_per_s": 220.0 + step,
                "bytes_sent": 4000 * (step + 1),  # client counters are cumulative
                "bytes_received": 12000 * (step + 1),
                "lr": 1e-4,
                "grad_norm": 0.5,
                "train_success": min(1.0, 0.1 + step * 0.06),
            }
        )
        if step == 3:
            events.append(
                {
                    "ts": "2025-01-01T00:03:00+00:00",
                    "event": "teacher_changed",
                    "how": "reload",
                    "old": teacher_a,
                    "new": teacher_b,
                    "version": 5,
                }
            )
        if step == 7:
            events.append(
                {
                    "ts": "2025-01-01T00:05:00+00:00",
                    "event": "teacher_restarted",
                    "old": teacher_b,
                    "new": teacher_c,
                    "version": 9,
                }
            )
            events.append(
                {
                    "ts": "2025-01-01T00:05:01+00:00",
                    "event": "teacher_changed",
                    "how": "restart",
                    "old": teacher_b,
                    "new": teacher_c,
                    "version": 9,
                }
            )
        if step % 6 == 5:
            events.append(
                {
                    "ts": "2025-01-01T00:06:00+00:00",
                    "event": "eval",
                    "version": step + 1,
                    "split": "eval",
                    "success": 0.05 + 0.3 * (step + 1) / steps,
                    "n": 20,
                    "by_difficulty": {"easy": 0.5},
                }
            )
    events.append({"ts": "2025-01-01T00:10:00+00:00", "event": "run_completed", "version": steps})
    _jsonl(path / "metrics.jsonl", metrics)
    _jsonl(path / "events.jsonl", events)
    trajs = [
        make_trajectory(i, v, success=(i + v) % 3 == 0)
        for v in range(0, steps, 3)
        for i in range(4)
    ]
    write_trajectories(path / "trajectories.jsonl", trajs)
    if with_targets:
        write_targets(path / "targets", trajs)
    (path / "eval" / f"v{steps:06d}.json").write_text(
        json.dumps(
            {
                "version": steps,
                "split": "eval",
                "success": 0.45,
                "n": 20,
                "by_difficulty": {"easy": 0.45},
                "stop_reasons": {"final_answer": 17, "max_turns": 3},
            }
        ),
        encoding="utf-8",
    )
    return path


def toy_sft_recipe(output_dir: Path) -> dict:
    """A two-step SFT recipe on a one-layer toy student: a real run in seconds on a CPU."""
    return {
        "run": {"name": "report-sft", "mode": "sft", "output_dir": str(output_dir)},
        "student": {"model": {"toy": dict(ONE_LAYER)}, "device": "cpu", "dtype": "float32"},
        "environment": {"train_tasks": 8, "eval_tasks": 2, "test_tasks": 2},
        "rollout": {
            "max_turns": 2,
            "max_new_tokens_per_turn": 16,
            "max_total_tokens": 512,
            "batch_size": 2,
        },
        "train": {"cycles": 2, "rollouts_per_cycle": 2, "lr": 1e-3},
    }


def make_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two OPD runs: B has another top_k and learning rate, a higher loss, 8 steps."""
    a = make_run(tmp_path / "run-a")
    b = make_run(tmp_path / "run-b", steps=8)
    for name in ("recipe.yaml", "recipe.resolved.yaml"):
        text = (b / name).read_text().replace("top_k: 8", "top_k: 16")
        (b / name).write_text(text)
    resolved = (b / "recipe.resolved.yaml").read_text().replace("  cycles: 12\n",
                                                                 "  cycles: 12\n  lr: 0.001\n")
    (b / "recipe.resolved.yaml").write_text(resolved)
    rows = [json.loads(line) for line in (b / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row["loss"] = 3.0 * math.exp(-row["step"] / 5) + 0.3
    (b / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return a, b
