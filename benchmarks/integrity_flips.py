"""Single-byte flips in a run's files: how many does the reader refuse?

Runs a short toy ``offline_kd`` run (a real teacher process started the way ``up``
starts one, ``miniverl train --teacher``), which leaves all four kinds of file a run
trusts: a checkpoint, a targets-cache shard, ``trajectories.jsonl`` and
``manifest.json``. Then, for a seeded sample of byte positions in each (every byte of
files under ``--positions`` bytes), it replaces the byte with ``byte ^ m`` (``m`` a
seeded value in 1..255), runs the reader the commands use, and restores the byte:

* checkpoint: ``student.checkpoint.load`` (what resume and ``eval`` call: it reads the
  sealed ``state.json`` and checks every file's sha256 before touching a model);
* shard: ``TargetsCache.get`` of every entry (what training and the report read),
  and ``TargetsCache.validate`` (``miniverl cache validate``);
* trajectories.jsonl: ``common.trajectory.read_trajectories`` (``inspect``, resume,
  ``eval``), plus the report's loader on a subsample;
* manifest.json: ``common.manifest.read_manifest`` (resume, ``eval``), plus the
  report's loader on a subsample.

A flip is *detected* when the reader raises ``ProvenanceError`` (the report: when it
lists the file as tampered, which makes ``miniverl report`` exit 1). A flip the reader
accepts is checked for semantic identity (same parsed JSON, same tensors): such a flip
changes nothing anything reads, and is counted apart with the reason. The rate is
detected / (flips - semantically identical) and must be 100%.

Run:  python benchmarks/integrity_flips.py [--positions 2000] [--seed 0]
Writes ``integrity_flips.json`` in ``--output-dir`` (default ``runs/benchmarks/integrity_flips/``; the committed ``benchmarks/results/integrity_flips.json`` with ``--update-committed``).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from miniverl.student.benchmark.outputs import add_output_options, script_output_file
from miniverl.student.teacher_process import start_teacher, stop_teacher
from miniverl.testing.toy_recipe import recipe_dict

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "integrity_flips.json"
REPORT_SUBSAMPLE = 150


def recipe(output_dir: Path) -> dict[str, Any]:
    """A few-second offline_kd recipe: fixed set scored once, three updates (the tests' toy
    recipe, ``miniverl.testing.toy_recipe``, serial and with patient timeouts)."""
    runtime = {"cpu_threads": 1, "heartbeat_ms": 200, "request_timeout_s": 60,
               "unavailable_timeout_s": 120}
    return recipe_dict("offline_kd", output_dir, pipelining=False,
                       sections={"run": {"name": "flips"}, "runtime": runtime})


def make_run(work: Path) -> Path:
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(work / "runs"), sort_keys=False))
    endpoint = f"ipc://{work}/teacher.sock"
    teacher = start_teacher(["--recipe", str(path), "--threads", "1", "--log",
                             str(work / "teacher.log")],
                            endpoint=endpoint, log=work / "teacher.out", timeout_s=120)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "miniverl.cli.app", "train", str(path), "--run-id", "run",
             "--teacher", endpoint], capture_output=True, text=True, cwd=work)
    finally:
        stop_teacher(teacher, timeout_s=60)
    if proc.returncode != 0:
        raise SystemExit(f"integrity_flips: the toy run failed:\n{proc.stderr[-2000:]}")
    return work / "runs" / "run"


# -- semantic identity: does the flipped file still say the same thing? -------------------


def _json_lines(data: bytes) -> list[Any] | None:
    try:
        text = data.decode("utf-8")
        # The reader iterates a text file: universal newlines, so "\r" ends a line too.
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        return [json.loads(line) for line in lines if line.strip()]
    except ValueError:
        return None


def _json(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        return None


def _tensors(data: bytes) -> dict[str, np.ndarray] | None:
    from safetensors.numpy import load

    try:
        return load(data)
    except Exception:  # a damaged header raises several types
        return None


def _same_tensors(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray] | None) -> bool:
    return (a is not None and b is not None and a.keys() == b.keys()
            and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                    and a[k].tobytes() == b[k].tobytes() for k in a))


def same_meaning(name: str, original: bytes, flipped: bytes) -> bool:
    if name.endswith(".jsonl"):
        before = _json_lines(original)
        return before is not None and before == _json_lines(flipped)
    if name.endswith(".json"):
        before = _json(original)
        return before is not None and before == _json(flipped)
    if name.endswith(".safetensors"):
        return _same_tensors(_tensors(original), _tensors(flipped))
    return original == flipped


# -- the flip loop ---------------------------------------------------------------------------


def flip_file(path: Path, positions: np.ndarray, masks: np.ndarray,
              reader: Callable[[], None]) -> dict[str, Any]:
    """Flip each position of ``path`` in turn, run ``reader``, restore; tally."""
    from miniverl.common.errors import ProvenanceError

    original = path.read_bytes()
    detected = identical = 0
    missed: list[dict[str, Any]] = []
    identical_examples: list[dict[str, Any]] = []
    try:
        for pos, mask in zip(positions.tolist(), masks.tolist(), strict=True):
            data = bytearray(original)
            data[pos] ^= mask
            path.write_bytes(bytes(data))
            try:
                reader()
            except ProvenanceError:
                detected += 1
                continue
            where = {"file": path.name, "offset": pos, "byte": f"{original[pos]:#04x}",
                     "flipped": f"{original[pos] ^ mask:#04x}"}
            if same_meaning(path.name, original, bytes(data)):
                identical += 1
                if len(identical_examples) < 5:
                    identical_examples.append(where)
            else:
                missed.append(where)
    finally:
        path.write_bytes(original)
    return {"flips": len(positions), "detected": detected, "semantically_identical": identical,
            "missed": missed, "identical_examples": identical_examples}


def sample(size: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    positions = np.arange(size) if size <= n else np.sort(rng.choice(size, n, replace=False))
    masks = rng.integers(1, 256, size=len(positions))
    return positions, masks


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out = {"flips": 0, "detected": 0, "semantically_identical": 0, "missed": [],
           "identical_examples": []}
    for part in parts:
        for key in ("flips", "detected", "semantically_identical"):
            out[key] += part[key]
        out["missed"] += part["missed"]
        out["identical_examples"] += part["identical_examples"][: 5 - len(out["identical_examples"])]
    meaningful = out["flips"] - out["semantically_identical"]
    out["detection_rate"] = out["detected"] / meaningful if meaningful else 1.0
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=2000,
                        help="Flips per file type (every byte of smaller files).")
    parser.add_argument("--seed", type=int, default=0)
    add_output_options(parser, OUT)
    args = parser.parse_args()
    args.out = script_output_file(args, OUT, ROOT)

    from miniverl.common.manifest import load_manifest
    from miniverl.common.trajectory import read_trajectories
    from miniverl.student import checkpoint
    from miniverl.student.report.load import load_run
    from miniverl.student.targets_cache import TargetsCache

    rng = np.random.default_rng(args.seed)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mvl-flips-") as tmp:
        run = make_run(Path(tmp))
        print(f"toy offline_kd run in {time.perf_counter() - started:.1f} s: {run}")

        # checkpoint: every file of the newest step, flips spread in proportion to size
        # (at least 200 per file, so the small JSON files are well covered).
        ckpt = checkpoint.latest(run / "checkpoints")
        files = sorted(p for p in ckpt.iterdir() if p.is_file())
        total = sum(p.stat().st_size for p in files)
        parts = []
        for file in files:
            size = file.stat().st_size
            n = max(200, round(args.positions * size / total))
            pos, masks = sample(size, n, rng)
            parts.append(flip_file(file, pos, masks,
                                   lambda: checkpoint.load(ckpt, None, None, None,
                                                           restore_rng=False)))
        results["checkpoint"] = {**merge(parts), "files": [p.name for p in files],
                                 "bytes": total, "reader": "student.checkpoint.load"}

        # targets-cache shard: what training reads (get), then what `cache validate` says.
        cache_dir = run / "targets"
        shard = sorted((cache_dir / "shards").glob("*.safetensors"))[0]
        pos, masks = sample(shard.stat().st_size, args.positions, rng)

        def read_shard() -> None:
            cache = TargetsCache(cache_dir)
            keys = cache.keys()
            for key in keys:
                cache.get(key)

        def validate_shard() -> None:
            from miniverl.common.errors import ProvenanceError

            problems = TargetsCache(cache_dir).validate()
            if problems:
                raise ProvenanceError(problems[0])

        by_get = flip_file(shard, pos, masks, read_shard)
        by_validate = flip_file(shard, pos, masks, validate_shard)
        results["targets_shard"] = {
            **merge([by_validate]), "bytes": shard.stat().st_size,
            "reader": "TargetsCache.validate (miniverl cache validate)",
            "by_get": merge([by_get]) | {"reader": "TargetsCache.get (training, report)"},
        }

        # trajectories.jsonl and manifest.json: the library reader on every flip, the
        # report's loader on a subsample (it reads the whole run directory each time).
        def report_reader(name: str) -> Callable[[], None]:
            def read() -> None:
                from miniverl.common.errors import ProvenanceError

                data = load_run(run)
                if any(name in t for t in data.tampered):
                    raise ProvenanceError(data.tampered[0])

            return read

        for kind, name, reader in (
            ("trajectories", "trajectories.jsonl",
             lambda: read_trajectories(run / "trajectories.jsonl")),
            ("manifest", "manifest.json", lambda: load_manifest(run / "manifest.json")),
        ):
            path = run / name
            pos, masks = sample(path.stat().st_size, args.positions, rng)
            sub = np.sort(rng.choice(len(pos), min(REPORT_SUBSAMPLE, len(pos)), replace=False))
            results[kind] = {
                **merge([flip_file(path, pos, masks, reader)]), "bytes": path.stat().st_size,
                "reader": "read_trajectories" if kind == "trajectories" else "read_manifest",
                "by_report": merge([flip_file(path, pos[sub], masks[sub], report_reader(name))])
                | {"reader": "student.report.load.load_run (miniverl report)"},
            }

    print(f"\n{'file type':<16}{'reader':<28}{'bytes':>8}{'flips':>7}{'detected':>10}"
          f"{'identical':>11}{'rate':>9}")
    ok = True
    rows = []
    for kind, r in results.items():
        rows.append((kind, r["reader"].split(" ")[0].split(".")[-1], r["bytes"], r))
        for sub in ("by_get", "by_report"):
            if sub in r:
                reader = r[sub]["reader"].split(" ")[0].split(".")[-1]
                rows.append(("", reader, r["bytes"], r[sub]))
    for kind, reader, size, r in rows:
        print(f"{kind:<16}{reader:<28}{size:>8}{r['flips']:>7}{r['detected']:>10}"
              f"{r['semantically_identical']:>11}{r['detection_rate']:>9.2%}")
        ok &= r["detection_rate"] == 1.0
    record = {"benchmark": "integrity_flips", "seed": args.seed, "positions": args.positions,
              "python": platform.python_version(), "machine": platform.machine(),
              "wall_s": round(time.perf_counter() - started, 1), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
