"""Memory of one teacher process serving two adapters against two teacher processes.

    python benchmarks/adapters_memory.py [--hidden 1024] [--layers 8] [--rank 8]
        [--update-committed | --output-dir DIR]

Several specialists that share a base model can be served two ways
(docs/several-teachers.md): one ``teacher serve --adapters a=DIR --adapters b=DIR``
process holding the base once, or one process per specialist, each merging its adapter
(``--adapter DIR``). This measures both on the CPU with the same toy base (``--hidden``
wide, ``--layers`` deep; float32) and two LoRA adapters of rank ``--rank`` on every
attention and MLP projection:

- each process's resident set size (RSS, from ``/proc`` through psutil) once it answers
  READY and again after it scored one request per adapter it serves (one 256-token
  episode, every position, top-16 targets), summed over the processes of each arm;
- the parameter bytes each arm holds (the base once plus the adapters, against the base
  twice; merged adapters add no parameters).

A process's RSS includes the Python interpreter, torch and its allocator (several
hundred MiB before any weight), so the saving of one process over two is that runtime
once plus the base's weights once. Each arm's processes are started, measured and
stopped before the other arm starts. Prints a table and writes
``runs/benchmarks/adapters_memory.json`` (``--update-committed``:
``benchmarks/results/adapters_memory.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("calc", "nav")
FLOAT32_BYTES = 4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir: Path, dest: Path, *, seed: int, rank: int) -> Path:
    """A LoRA adapter of the toy base with a non-zero B (a zero B would be a no-op)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from miniverl.common.modeling import load_causal_lm

    torch.manual_seed(seed)
    model = get_peft_model(load_causal_lm(base_dir, dtype="float32", device="cpu"),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02)
    model.save_pretrained(dest)
    return dest


def parameter_bytes(path: Path) -> int:
    """Bytes of a directory's float32 weights (the toy base and the adapters are saved in
    float32), counted from the safetensors headers by ``opd_cycle.parameter_count``."""
    from opd_cycle import parameter_count

    return FLOAT32_BYTES * parameter_count(path)


def rss(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_info().rss


def score_once(endpoint: str, adapter: str | None, vocab: int, fingerprint: str) -> None:
    """One SCORE of a 256-token episode, every position, top-16."""
    import numpy as np

    from miniverl.protocol.sync_client import SyncTeacherClient

    client = SyncTeacherClient(endpoint, tokenizer_fp=fingerprint, vocab_size=vocab,
                               client_name="adapters-memory", request_timeout_s=120,
                               **({"adapter": adapter} if adapter else {}))
    try:
        client.connect(120)
        client.set_version(0)
        client.bind()
        tokens = np.random.default_rng(0).integers(0, vocab, 256).astype(np.int32)
        rid = client.submit(tokens, np.array([0, 256], np.int32),
                            np.arange(0, 255, dtype=np.int32), kind="topk", k=16)
        client.wait([rid])
    finally:
        client.close()


def measure_arm(name: str, launches: list[tuple[list[str], list[str | None]]], work: Path,
                vocab: int, fingerprint: str) -> dict[str, Any]:
    """Start every process of an arm, measure RSS at READY and after scoring, stop them."""
    from miniverl.student.teacher_process import start_teacher, stop_teacher

    procs = []
    try:
        for i, (args, _) in enumerate(launches):
            endpoint = f"ipc://{work}/{name}-{i}.sock"
            procs.append((start_teacher([*args, "--threads", "1"], endpoint=endpoint,
                                        log=work / f"{name}-{i}.log", timeout_s=600),
                          endpoint))
        ready = [rss(proc.pid) for proc, _ in procs]
        for (_proc, endpoint), (_, adapters) in zip(procs, launches, strict=True):
            for adapter in adapters:
                score_once(endpoint, adapter, vocab, fingerprint)
        time.sleep(0.5)
        scored = [rss(proc.pid) for proc, _ in procs]
    finally:
        for proc, _ in procs:
            stop_teacher(proc)
    return {"processes": len(procs), "rss_ready_bytes": ready, "rss_scored_bytes": scored,
            "rss_ready_total_bytes": sum(ready), "rss_scored_total_bytes": sum(scored),
            "rss_ready_total_mib": round(sum(ready) / 2**20, 1),
            "rss_scored_total_mib": round(sum(scored) / 2**20, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--update-committed", action="store_true")
    ap.add_argument("--output-dir", type=Path, default=None,
                    help="where the record goes (default runs/benchmarks)")
    args = ap.parse_args(argv)
    from miniverl.common.modeling import load_tokenizer
    from miniverl.common.recipe_models import ToySpec
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.toy import toy_model_dir

    spec = ToySpec(hidden=args.hidden, layers=args.layers, heads=8, kv_heads=4,
                        intermediate=2 * args.hidden, seed=0)
    base = toy_model_dir(spec)
    tokenizer = load_tokenizer(base)
    vocab, fingerprint = len(tokenizer), fingerprint_tokenizer(tokenizer)
    with tempfile.TemporaryDirectory(prefix="mvam", dir="/tmp") as tmp:
        work = Path(tmp)
        adapters = {n: make_adapter(base, work / n, seed=i + 1, rank=args.rank)
                    for i, n in enumerate(NAMES)}
        one = measure_arm("one", [(["--model", str(base),
                                    *[x for n in NAMES for x in ("--adapters",
                                                                 f"{n}={adapters[n]}")]],
                                   list(NAMES))], work, vocab, fingerprint)
        two = measure_arm("two", [(["--model", str(base), "--adapter", str(adapters[n])],
                                   [None]) for n in NAMES], work, vocab, fingerprint)
        adapter_bytes = {n: parameter_bytes(adapters[n]) for n in NAMES}
    base_bytes = parameter_bytes(base)
    record = {
        "what": "resident memory of one teacher process serving two LoRA adapters by name "
                "against two teacher processes each merging one; CPU, float32",
        "command": "python benchmarks/adapters_memory.py " + " ".join(argv or sys.argv[1:]),
        "base": {"hidden": args.hidden, "layers": args.layers, "parameter_bytes": base_bytes,
                 "parameter_mib": round(base_bytes / 2**20, 1)},
        "adapters": {"rank": args.rank, "targets": TARGETS, "parameter_bytes": adapter_bytes},
        "one_process_two_adapters": {**one, "parameter_bytes":
                                     base_bytes + sum(adapter_bytes.values())},
        "two_processes": {**two, "parameter_bytes": 2 * base_bytes},
        "ratio_rss_scored": two["rss_scored_total_bytes"] / one["rss_scored_total_bytes"],
        "saved_rss_scored_bytes": two["rss_scored_total_bytes"] - one["rss_scored_total_bytes"],
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    mib = 2**20
    print(f"base {base_bytes / mib:.0f} MiB of parameters; adapters "
          f"{sum(adapter_bytes.values()) / mib:.1f} MiB")
    print("| arm | processes | RSS at READY (MiB) | RSS after scoring (MiB) | parameters (MiB) |")
    print("| --- | --- | --- | --- | --- |")
    for label, arm in (("one process, two adapters", record["one_process_two_adapters"]),
                       ("two processes, one merged adapter each", record["two_processes"])):
        print(f"| {label} | {arm['processes']} | {arm['rss_ready_total_bytes'] / mib:.0f} | "
              f"{arm['rss_scored_total_bytes'] / mib:.0f} | {arm['parameter_bytes'] / mib:.0f} |")
    print(f"two processes hold {record['ratio_rss_scored']:.2f}x the memory of one "
          f"({record['saved_rss_scored_bytes'] / mib:.0f} MiB more after scoring)")
    out = (ROOT / "benchmarks" / "results" if args.update_committed
           else args.output_dir or ROOT / "runs" / "benchmarks")
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapters_memory.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out / 'adapters_memory.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
