"""Entry point of the teacher process: ``python -m miniverl.teacher_server``.

    python -m miniverl.teacher_server --model DIR|ORG/NAME [--revision SHA] [--adapter DIR]
        [--adapters NAME=DIR ...]    # several adapters over one base, served by name
        [--bind tcp://127.0.0.1:5555] [--device auto] [--dtype auto] [--offline]
        [--log FILE] [--threads N] [--scorer NAME [--scorer-option KEY=VALUE ...]]
        [--curve-secret-key FILE --curve-authorized-dir DIR [--curve-admin-dir DIR]]
    python -m miniverl.teacher_server --recipe recipe.yaml [--bind ipc://runs/x/teacher.sock]
        [--prepared-dir DIR]    # the recipe's prepared teacher (teacher.prepare)
    python -m miniverl.teacher_server --model DIR --gate recipe.yaml

With ``--recipe`` (or ``--gate``) and that recipe's ``teacher.min_success``, a ``RELOAD``
onto a teacher the recipe's competence gate refuses is refused before it serves
(``common/qualification.py``). A recipe with ``teacher.prepare`` needs
``--prepared-dir``: this process serves and never trains, so ``miniverl teacher serve
--recipe`` prepares the teacher (or reuses the cached one) and passes it here.

Binds first, then loads the model on the worker thread (``PING`` answers ``LOADING``
meanwhile), then serves ``mvl-score/1`` until ``SHUTDOWN`` or SIGTERM (drain). Exit
codes: 0 after a shutdown, 1 when the arguments, the bind or the model load fail (one
``error:`` line on stderr and a ``load_failed`` log line). ``miniverl teacher serve``
and ``miniverl up`` run exactly this. This module only wires arguments to the library.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from miniverl.common.errors import ConfigError, MiniverlError
from miniverl.common.os_errors import os_error_line
from miniverl.common.qualification import require_qualified
from miniverl.common.recipe import load_recipe
from miniverl.common.runtime import THREAD_ENV_VARS, cuda_process_env
from miniverl.protocol.endpoints import DEFAULT_TCP_ENDPOINT, admin_token_path
from miniverl.protocol.limits import Limits
from miniverl.teacher_server.jsonlog import JsonLog
from miniverl.teacher_server.loader import (
    TeacherSpec,
    parse_adapters,
    recipe_teacher,
    spec_from_recipe,
)
from miniverl.teacher_server.openai_http import openai_config, run_with_openai
from miniverl.teacher_server.prefix_cache import PREFIX_CACHE_TOKENS
from miniverl.teacher_server.scorers import DEFAULT_SCORER, make_loader, parse_options
from miniverl.teacher_server.server import TeacherServer, run_server
from miniverl.teacher_server.server_state import ServerConfig

# The server's integer options: flag, default, help.
SIZES = (
    ("--threads", None, "CPU threads (default: recipe or 1)."),
    ("--exact-max-vocab", 262144, "Largest vocabulary served with kind=exact."),
    ("--batch-tokens", 16384, "Coalesce queued requests up to this many tokens per forward pass."),
    ("--prefix-cache-tokens", PREFIX_CACHE_TOKENS,
     "Tokens of shared prompt prefixes (system blocks) kept between requests; 0 keeps none."),
    ("--max-inflight", 64, "Open requests per client."),
    ("--max-tokens", None, "Packed tokens per SCORE (default: the model's context length). "
     "No sequence may exceed the context either way."),
    ("--heartbeat-ms", 1000, "Advertised PING interval."),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m miniverl.teacher_server",
        description="Serve a frozen teacher over mvl-score/1 (ZeroMQ ROUTER).",
    )
    src = p.add_argument_group("teacher (one of --model or --recipe)")
    src.add_argument("--model", help="Local HF model directory or hub id ORG/NAME.")
    src.add_argument("--revision", help="40-hex commit pinning a hub id.")
    src.add_argument("--adapter", help="PEFT adapter directory merged into the teacher.")
    src.add_argument("--adapter-revision", help="40-hex commit pinning a hub adapter id.")
    src.add_argument(
        "--adapters", action="append", default=None, metavar="NAME=DIR",
        help="Serve this PEFT adapter (a directory, or ORG/NAME@<40-hex>) under NAME, over "
        "the one base model, beside the other --adapters (repeatable; at most 64; not with "
        "--adapter). A client names the adapter it scores with in HELLO and SCORE.",
    )
    src.add_argument("--recipe", help="Take the teacher section of this recipe.")
    src.add_argument(
        "--recipe-teacher", metavar="NAME",
        help="With --recipe: serve its teacher NAME of teachers: (several teachers; "
        "docs/several-teachers.md).",
    )
    src.add_argument(
        "--prepared-dir",
        help="With --recipe: serve this prepared teacher (made by the recipe's "
        "teacher.prepare) instead of teacher.model.",
    )
    src.add_argument(
        "--gate",
        metavar="RECIPE",
        help="Refuse a RELOAD onto a teacher this recipe's teacher.min_success refuses "
        "(implied by --recipe).",
    )
    src.add_argument(
        "--scorer",
        default=None,
        help="Scorer: causal_lm (default) or a miniverl.scorers entry point.",
    )
    src.add_argument(
        "--scorer-option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="Option for the scorer (repeatable).",
    )
    p.add_argument(
        "--bind", default=None, help=f"Endpoint to bind (default {DEFAULT_TCP_ENDPOINT})."
    )
    p.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N (default auto).")
    p.add_argument("--dtype", default=None, help="auto, float32, bfloat16, float16 (default auto).")
    p.add_argument("--offline", action="store_true", help="Never touch the network.")
    p.add_argument("--log", default=None, help="JSON-lines log file (default stderr).")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    for flag, default, text in SIZES:
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument(
        "--wait-for-model",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="Bind now and wait up to SECONDS for --model DIR to appear (answering PING "
        "with LOADING), e.g. while `miniverl up` still prepares the teacher.",
    )
    p.add_argument(
        "--openai", metavar="HOST:PORT",
        help="Also answer OpenAI-compatible GET /v1/models and POST /v1/completions "
        "(prompt_logprobs) here (teacher_server/openai_http.py; the openai extra).",
    )
    p.add_argument(
        "--openai-token-file", metavar="FILE",
        help="Bearer token the --openai endpoint requires (needed off loopback).",
    )
    p.add_argument("--curve-secret-key", help="Server CURVE secret certificate file.")
    p.add_argument("--curve-authorized-dir", help="Directory of authorized client public keys.")
    p.add_argument(
        "--curve-admin-dir",
        help="Directory of admin public keys: the clients that may RELOAD, PARK, WAKE, SHUTDOWN.",
    )
    return p


def serve(args: argparse.Namespace) -> int:
    """Build the server from parsed arguments and run it; returns the exit code."""
    if bool(args.model) == bool(args.recipe):
        raise ConfigError("pass exactly one of --model DIR|ID or --recipe FILE")
    threads = args.threads
    scorer = args.scorer or DEFAULT_SCORER
    scorer_options = parse_options(args.scorer_option)
    if args.prepared_dir and not args.recipe:
        raise ConfigError("--prepared-dir goes with --recipe (the recipe it was prepared "
                          "for); to serve any model directory use --model DIR")
    # Validate now: a bad recipe or a bad --adapters fails before binding.
    adapters = parse_adapters(args.adapters)
    if adapters and args.adapter:
        raise ConfigError(f"--adapter {args.adapter} and --adapters "
                          f"{' '.join(args.adapters)}: --adapter merges one adapter into the "
                          "weights, --adapters serves several by name; pass one of them")
    recipe = load_recipe(args.recipe) if args.recipe else None
    # Before CUDA's first use here: the allocator setting (a parked teacher's memory is
    # whole again for the student) and, for a deterministic recipe, cuBLAS's workspace.
    cuda_process_env(deterministic=recipe is not None and recipe.run.deterministic)
    if args.recipe_teacher and recipe is None:
        raise ConfigError(f"--recipe-teacher {args.recipe_teacher} goes with --recipe (the "
                          "recipe whose teachers: names it)")
    if recipe is not None and args.recipe_teacher:
        # Serve that teacher as the recipe's one teacher section; the rest is unchanged.
        section = recipe_teacher(recipe, args.recipe, args.recipe_teacher)
        recipe = recipe.model_copy(update={"teacher": section, "teachers": None})
    named = adapters or (recipe.teacher.adapters if recipe and recipe.teacher else None)
    if named and args.openai is not None:
        raise ConfigError(f"--openai {args.openai} and --adapters: the OpenAI endpoint's "
                          "requests name no adapter, and a teacher serving --adapters scores "
                          "only requests that name one; serve the OpenAI endpoint from a "
                          "teacher with one model (--adapter DIR merges one)")
    gate_recipe = load_recipe(args.gate) if args.gate else recipe
    gate = _gate(gate_recipe) if gate_recipe is not None else None
    if recipe is not None:
        if recipe.teacher is None:
            raise ConfigError(f"recipe {args.recipe!r} has no teacher section; add one")
        _check_prepared(args.recipe, recipe.teacher.prepare, args.prepared_dir)
        if adapters and recipe.teacher.adapter and not args.prepared_dir:
            raise ConfigError(f"--adapters with recipe {args.recipe!r}, whose teacher.adapter "
                              f"is {recipe.teacher.adapter}: one adapter merged and several "
                              "served by name do not go together; drop one of them")
        threads = threads or recipe.runtime.cpu_threads
        bind = args.bind or recipe.teacher.endpoint or DEFAULT_TCP_ENDPOINT
        if args.scorer is None:
            scorer = recipe.teacher.scorer
            scorer_options = {**recipe.teacher.scorer_options, **scorer_options}

        def spec() -> TeacherSpec:
            base = spec_from_recipe(args.recipe, offline=args.offline,
                                    teacher_name=args.recipe_teacher)
            fields = {**base.__dict__, "device": args.device or base.device,
                      "dtype": args.dtype or base.dtype}
            if args.prepared_dir:
                # What `up` serves for a prepared teacher: the directory as a plain model
                # (the preparation merged any adapter), named by the directory.
                fields.update(model=str(Path(args.prepared_dir).resolve()), revision=None,
                              adapter=None, adapter_revision=None, name=None)
            return TeacherSpec(**{**fields, "adapters": adapters or base.adapters})
    else:
        bind = args.bind or DEFAULT_TCP_ENDPOINT
        spec = TeacherSpec(
            model=args.model,
            revision=args.revision,
            adapter=args.adapter,
            adapter_revision=args.adapter_revision,
            device=args.device or "auto",
            dtype=args.dtype or "auto",
            offline=args.offline,
            adapters=adapters,
        )
    if args.wait_for_model > 0:
        if not args.model:
            raise ConfigError("--wait-for-model needs --model DIR (the directory to wait for)")
        spec = _waiting_spec(spec, args.model, args.wait_for_model)
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1 (got {args.max_tokens}); leave it "
                          "out to use the model's context length")
    threads = threads or 1
    if threads < 1:
        raise ConfigError(f"--threads must be >= 1 (got {threads})")
    # The environment is set before torch is imported (on the worker thread, after the
    # bind), so OpenMP starts with this many threads; make_loader also calls
    # torch.set_num_threads there.
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(threads)
    log = JsonLog(args.log, level=args.log_level)
    config = ServerConfig(
        endpoint=bind,
        limits=Limits(max_inflight=args.max_inflight, max_exact_vocab=args.exact_max_vocab,
                      **({"max_tokens": args.max_tokens} if args.max_tokens else {})),
        heartbeat_ms=args.heartbeat_ms,
        batch_tokens=args.batch_tokens,
        curve_secret_key=args.curve_secret_key,
        curve_authorized_dir=args.curve_authorized_dir,
        curve_admin_dir=args.curve_admin_dir,
        gate=gate,
        # Without CURVE admin messages carry a token written at start: beside an ipc
        # socket, else beside --log, else in a per-user directory (the log names it).
        admin_token_file=(
            str(admin_token_path(bind, args.log))
            if args.log and not bind.startswith("ipc://") else None
        ),
    )
    if args.prefix_cache_tokens < 0:
        raise ConfigError(
            f"--prefix-cache-tokens must be >= 0 (got {args.prefix_cache_tokens}); pass 0 "
            "to keep no prefix between requests"
        )
    openai = None
    if args.openai is not None:
        openai = openai_config(args.openai, args.openai_token_file)
    elif args.openai_token_file is not None:
        raise ConfigError("--openai-token-file goes with --openai HOST:PORT")
    loader = make_loader(spec, exact_max_vocab=args.exact_max_vocab, threads=threads,
                         scorer=scorer, scorer_options=scorer_options,
                         prefix_cache_tokens=args.prefix_cache_tokens)
    try:
        server = TeacherServer(config, loader, log=log)
        if openai is not None:
            return run_with_openai(server, openai)
        return run_server(server)
    finally:
        log.close()


def _gate(recipe: Any) -> Callable[[dict[str, Any]], Any] | None:
    """The recipe's competence gate as ``ServerConfig.gate``; None without min_success
    or min_recovery."""
    teacher = recipe.teacher
    if teacher is None or (teacher.min_success is None and teacher.min_recovery is None):
        return None
    return functools.partial(require_qualified, recipe)


def _check_prepared(recipe_path: str, prepare: str | None, prepared_dir: str | None) -> None:
    """A recipe that prepares its teacher is served only with the prepared directory."""
    if prepare and not prepared_dir:
        raise ConfigError(
            f"recipe {recipe_path!r} sets teacher.prepare ({prepare}): its teacher is the "
            "prepared one, which this process does not train; run `miniverl teacher serve "
            f"--recipe {recipe_path}` (prepares it, or reuses the cached one, then serves it)"
        )
    if prepared_dir and not prepare:
        raise ConfigError(
            f"--prepared-dir: recipe {recipe_path!r} has no teacher.prepare; leave "
            "--prepared-dir out, or serve the directory with --model DIR"
        )
    if prepared_dir and not (Path(prepared_dir) / "config.json").is_file():
        raise ConfigError(
            f"--prepared-dir {prepared_dir}: not a model directory (no config.json); "
            f"`miniverl teacher serve --recipe {recipe_path}` prepares the teacher"
        )


def _waiting_spec(spec, model_dir: str, timeout_s: float):
    """A spec factory that first imports the heavy libraries, then waits for the model.

    Runs on the loader's worker thread after the bind: the imports overlap whatever is
    still producing the directory, and PING answers LOADING meanwhile.
    """

    def wait():
        # transformers imports a model's code on first use: 4 s for Qwen3 here, on the
        # critical path once the directory appears. Toy models, and the teachers
        # prepared from them, are Qwen3; other architectures load theirs as usual.
        import torch  # noqa: F401
        import transformers.models.qwen3.modeling_qwen3  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

        deadline = time.monotonic() + timeout_s
        while not (Path(model_dir) / "config.json").is_file():
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"--model {model_dir} did not appear within --wait-for-model {timeout_s:g} s"
                )
            time.sleep(0.1)
        return spec() if callable(spec) else spec

    return wait


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = serve(args)
    except MiniverlError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        code = 1
    except OSError as exc:  # a missing --log folder, a full disk: one line, not a traceback
        line = os_error_line(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # The worker thread may still be inside a load or a forward pass after an abort;
    # the process is done, so do not wait for it.
    os._exit(code)


if __name__ == "__main__":
    main()
