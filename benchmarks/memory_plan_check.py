"""The memory plan against the CPU's measured peak: one student update, two architectures.

    python benchmarks/memory_plan_check.py [--output benchmarks/results/memory_plan_check.json]

For a Qwen3-0.6B-shaped and a SmolLM2-135M-shaped model built from config (4 layers,
the real vocabularies 151,936 and 49,152, random weights, float32, LoRA r 16 on every
projection), each with and without gradient checkpointing, one child process per case
runs two SFT updates (``student/train/updates.py sft_step``; the second has AdamW's
moments, as every later update does) and reports its peak resident memory (``VmHWM``)
above what it held before the model was built. ``common/memory_plan.py`` predicts the
same update from the shape and the settings alone; the record holds both and their ratio
(the suite asserts each within 15%: ``tests/common/test_memory_plan.py``). It measures
the CPU; a GPU's bf16 activations are predicted by the same census at 2 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "memory_plan_check.json"

ARCHS = {
    "qwen3": {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 4,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True},
    "smollm2": {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 4,
                "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True},
}
# An update of EPISODES episodes of TOKENS tokens, ANSWER of them the model's own.
# (The answers fill one loss chunk: the plan counts a full chunk.)
EPISODES, TOKENS, ANSWER, CHUNK, RANK = 4, 256, 64, 256, 16


def vm_hwm_kib() -> int:
    """Peak resident memory of this process (``VmHWM``: it starts afresh at exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def predicted(arch: str, checkpointing: bool) -> int:
    from miniverl.common.memory_plan import LORA_TARGETS, ModelShape, StudentSettings, student_plan

    settings = StudentSettings(
        dtype_bytes=4, quantization="none", lora_r=RANK, lora_targets=LORA_TARGETS,
        update_episodes=EPISODES, episode_tokens=TOKENS, grad_accum=1, micro_batch_tokens=None,
        gradient_checkpointing=checkpointing, chunk_size=CHUNK, fp32_head=True, rollout_batch=1)
    return student_plan(ModelShape.from_config(ARCHS[arch]), settings)["update"].peak


def measure(arch: str, checkpointing: bool) -> int:
    """Bytes above the process's footing at the peak of two updates (run in a child)."""
    from types import SimpleNamespace

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from miniverl.common.memory_plan import LORA_TARGETS
    from miniverl.common.recipe_sections import LossConfig, TrainConfig
    from miniverl.common.trajectory import Span, SpanType, Trajectory
    from miniverl.student.train.policy import Policy
    from miniverl.student.train.updates import sft_step

    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = dict(ARCHS[arch])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    trajs = [Trajectory(
        id=f"t{i}", tokens=torch.randint(0, config.vocab_size, (TOKENS,)).tolist(),
        tokenizer_fp="fp", environment="calculator", task_id=f"k{i}", policy_version=0,
        spans=[Span(type=SpanType.USER, start=0, end=TOKENS - ANSWER),
               Span(type=SpanType.ASSISTANT_FINAL, start=TOKENS - ANSWER, end=TOKENS)])
        for i in range(EPISODES)]
    footing = vm_hwm_kib()
    model = AutoModelForCausalLM.from_config(config)
    model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=32, lora_dropout=0.0,
                                             target_modules=list(LORA_TARGETS),
                                             task_type="CAUSAL_LM"))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    policy = Policy(model=model, tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=0),
                    tokenizer_fp="fp", model_dir=Path("."), device=torch.device("cpu"),
                    vocab_size=config.vocab_size, lora=True)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    train = TrainConfig(grad_accum=1)
    for _ in range(2):
        sft_step(policy, optimizer, scheduler, trajs, loss=LossConfig(chunk_size=CHUNK),
                 train=train)
    return (vm_hwm_kib() - footing) * 1024


def cases() -> list[tuple[str, bool]]:
    return [(arch, ckpt) for arch in ARCHS for ckpt in (False, True)]


def run_case(arch: str, checkpointing: bool) -> dict:
    """One case in its own process: measured and predicted bytes and their ratio."""
    # glibc keeps freed blocks below its (growing) mmap threshold in the heap, where the
    # resident peak counts them again: a fixed threshold hands every tensor back when
    # freed, so the peak is the live bytes the plan predicts (as CUDA's allocated bytes).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", arch]
        + (["--checkpointing"] if checkpointing else []),
        capture_output=True, text=True, check=True, env=env)
    measured = int(done.stdout.strip().splitlines()[-1])
    plan = predicted(arch, checkpointing)
    return {"arch": arch, "gradient_checkpointing": checkpointing,
            "measured_bytes": measured, "predicted_bytes": plan,
            "predicted_over_measured": round(plan / measured, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=OUT)
    p.add_argument("--child", choices=sorted(ARCHS), help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(measure(args.child, args.checkpointing))
        return 0
    rows = [run_case(arch, ckpt) for arch, ckpt in cases()]
    record = {"benchmark": "memory_plan_check", "device": "cpu", "dtype": "float32",
              "layers": 4, "episodes": EPISODES, "tokens": TOKENS, "answer_tokens": ANSWER,
              "chunk_size": CHUNK, "lora_r": RANK, "cases": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
