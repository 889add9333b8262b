"""``miniverl train``, ``miniverl eval`` (and the run-level commands of ``up``).

Each command is one library call; torch is imported inside the bodies only.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
from pathlib import Path

import typer

# Options `train` and `up` share (the run they start or resume).
RECIPE_ARG = typer.Argument(..., help="Recipe YAML.")
RUN_ID_OPT = typer.Option(None, "--run-id", help="Run id (default: name + time).")
RESUME_OPT = typer.Option(False, "--resume", help="Continue run --run-id.")
OUTPUT_DIR_OPT = typer.Option(None, "--output-dir", help="Override run.output_dir.")
CURVE_SECRET_OPT = typer.Option(
    None, "--curve-secret-key", help="Student CURVE secret key file (a remote CURVE teacher)."
)
CURVE_SERVER_OPT = typer.Option(
    None, "--curve-server-key", help="The teacher's CURVE public key file (server.key)."
)
LOGGER_OPT = typer.Option(
    None, "--logger",
    help="Add an experiment tracker to run.loggers: tensorboard, wandb, mlflow or trackio "
    "(repeatable; jsonl is always on).",
)
# Options `eval` and `status` share (a result printed as JSON instead of lines).
JSON_OPT = typer.Option(False, "--json", help="Print JSON.")


def cuda_warning(recipe) -> str | None:
    """One line when the recipe's student wants a CUDA device this machine lacks.

    A dry run loads nothing, so without this it printed a clean plan for a run that
    would stop at the model load. torch is imported only for a recipe that asks for
    CUDA (an optional heavy dependency).
    """
    import importlib.util

    device = recipe.student.device
    if not device.startswith("cuda"):
        return None
    fix = "run it on a machine with an NVIDIA GPU, or set student.device: cpu (or auto)"
    if importlib.util.find_spec("torch") is None:
        return f"warning: student.device is {device!r} but torch is not installed here; {fix}"
    import torch

    if not torch.cuda.is_available():
        return (f"warning: student.device is {device!r} but CUDA is not available on this "
                f"machine (torch.cuda.is_available() is False); {fix}")
    index = torch.device(device).index
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        return (f"warning: student.device is {device!r} but this machine has {count} CUDA "
                f"device(s); pick cuda:0..cuda:{count - 1}")
    return None


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    register_up(app)

    @app.command()
    def train(
        recipe: Path = RECIPE_ARG,
        teacher: list[str] = typer.Option(
            None, "--teacher", help="Teacher endpoint to attach to; NAME=ENDPOINT for each of "
            "several teachers (repeatable; docs/several-teachers.md)."),
        run_id: str = RUN_ID_OPT,
        resume: bool = RESUME_OPT,
        dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print the plan."),
        offline: bool = typer.Option(False, "--offline", help="Never touch the network."),
        output_dir: str = OUTPUT_DIR_OPT,
        curve_secret_key: str = CURVE_SECRET_OPT,
        curve_server_key: str = CURVE_SERVER_OPT,
        admin_token: str = typer.Option(
            None, "--admin-token", help="Teacher's admin token file (lets swap PARK/WAKE)."
        ),
        logger: list[str] = LOGGER_OPT,
    ) -> None:
        """Run the student process alone (opd, replay, offline_kd and dpo need --teacher)."""
        from miniverl.common.errors import ConfigError
        from miniverl.common.recipe import load_recipe
        from miniverl.protocol.endpoints import curve_key_files

        curve = curve_key_files(curve_secret_key, curve_server_key)

        from miniverl.common.teacher_routes import is_routed, teacher_flags
        from miniverl.student.trackers import with_loggers

        loaded = with_loggers(load_recipe(recipe), logger)  # an unknown --logger: one line
        routed = is_routed(loaded.teacher, loaded.teachers)
        plain, named = teacher_flags(teacher)
        if named and not routed:
            raise ConfigError(f"--teacher {next(iter(named))}=... names a teacher, and this "
                              "recipe has one teacher; pass --teacher ENDPOINT")
        if dry_run:
            from miniverl.cli.foundation import plan_lines

            for line in plan_lines(loaded):
                typer.echo(line)
            endpoint = plain or (loaded.teacher.endpoint if loaded.teacher else None)
            if loaded.needs_teacher and endpoint is None and not routed:
                typer.echo("teacher      none given: pass --teacher ENDPOINT or use `miniverl up`")
            warning = cuda_warning(loaded)
            if warning:
                typer.echo(warning, err=True)
            typer.echo("dry run: nothing was loaded")
            return
        if loaded.needs_teacher and not routed and not (plain or loaded.teacher.endpoint):
            raise ConfigError(
                f"mode {loaded.run.mode!r} needs a teacher: pass --teacher ENDPOINT (see "
                "`miniverl teacher serve`) or start both processes with `miniverl up`"
            )
        from miniverl.student.api import graceful_stop, summary_lines, train_from_file

        result = train_from_file(
            recipe, teacher=teacher, run_id=run_id, resume=resume, offline=offline,
            output_dir=output_dir, stop_event=graceful_stop(), teacher_curve=curve,
            teacher_admin_token=admin_token, loggers=logger,
        )
        for line in summary_lines(result):
            typer.echo(line)
        if result.status == "interrupted":
            raise typer.Exit(130)

    @app.command("eval")
    def eval_cmd(
        run: Path = typer.Option(..., "--run", help="Run directory."),
        split: str = typer.Option(None, "--split", help="eval or test (default: recipe's)."),
        checkpoint: str = typer.Option(None, "--checkpoint", help="Checkpoint dir."),
        as_json: bool = JSON_OPT,
    ) -> None:
        """Greedy success of a run's checkpoint on a held-out split."""
        from miniverl.common.errors import ConfigError
        from miniverl.student.api import eval_run, print_json

        if split not in (None, "eval", "test", "train"):
            raise ConfigError(f"--split {split!r} is not one of eval, test, train")
        summary = eval_run(run, split=split, checkpoint=checkpoint)
        if as_json:
            print_json(summary)
            return
        typer.echo(
            f"{summary['split']}: success {summary['success']:.1%} over {summary['n']} tasks "
            f"(version {summary['policy_version']})"
        )
        for diff, row in summary["by_difficulty"].items():
            typer.echo(f"  {diff:<8} {row['success']:.1%} of {int(row['n'])}")


def register_up(app: typer.Typer) -> None:
    """``demo``, ``up``, ``status``, ``stop``: the two-process run and its control socket."""

    @app.command()
    def demo(
        output: Path = typer.Option(Path("miniverl-demo"), "--output", help="Output folder."),
        fast: bool = typer.Option(
            False, "--fast",
            help="Machinery only (about 17 s on 2 CPU cores, benchmarks/results/"
                 "demo_learning.json): an incompetent teacher, no learning.",
        ),
        seed: int = typer.Option(
            None, "--seed", min=0, max=2**31 - 1, help="The student run's seed (default 1)."
        ),
    ) -> None:
        """A toy student learns the calculator tool from a prepared teacher by strict OPD."""
        from rich.console import Console

        from miniverl.cli.demo import demo as run_demo
        from miniverl.cli.demo import summary_lines

        console = Console(stderr=True)
        code, run_dir, summary, wall = run_demo(output, fast=fast, seed=seed, console=console)
        for line in summary_lines(run_dir, summary, wall):
            typer.echo(line)
        if code:
            raise typer.Exit(code)

    @app.command()
    def up(
        recipe: Path = RECIPE_ARG,
        teacher: str = typer.Option(None, "--teacher", help="Attach to this teacher endpoint."),
        run_id: str = RUN_ID_OPT,
        resume: bool = RESUME_OPT,
        output_dir: str = OUTPUT_DIR_OPT,
        quiet: bool = typer.Option(False, "--quiet", help="No child log lines, no progress."),
        curve_secret_key: str = CURVE_SECRET_OPT,
        curve_server_key: str = CURVE_SERVER_OPT,
        logger: list[str] = LOGGER_OPT,
    ) -> None:
        """Start the teacher and the student, keep them alive, stop them together."""
        from miniverl.cli.supervisor import up as run_up
        from miniverl.protocol.endpoints import curve_key_files

        code, run_dir = run_up(
            recipe, teacher=teacher, run_id=run_id, resume=resume, output_dir=output_dir,
            show_progress=not quiet, echo=not quiet,
            curve=curve_key_files(curve_secret_key, curve_server_key), loggers=logger,
        )
        typer.echo(f"run directory: {run_dir}")
        if code:
            raise typer.Exit(code)

    @app.command()
    def status(
        run: Path = typer.Argument(..., help="Run directory."),
        as_json: bool = JSON_OPT,
    ) -> None:
        """Progress of a running run (its control socket), or a finished run's summary."""
        import json

        from miniverl.common.errors import MiniverlError
        from miniverl.common.rundir import RunDir
        from miniverl.protocol.control_socket import (
            StatusRequest,
            control_endpoint,
            control_request,
            new_id,
        )

        handle = RunDir.open(run)
        try:
            reply = control_request(control_endpoint(run), StatusRequest(id=new_id())).model_dump()
            live = True
        except MiniverlError:
            from miniverl.cli.run_status import finished_summary

            reply = finished_summary(handle)
            live = False
        reply["live"] = live
        if as_json:
            typer.echo(json.dumps(reply, indent=2, default=str))
            return
        if not live:
            from miniverl.cli.run_status import finished_lines

            for line in finished_lines(reply):
                typer.echo(line)
            return
        teacher = reply.get("teacher") or {}
        typer.echo(
            f"{reply['run_id']}: {reply['status']}, {reply['mode']} "
            f"({'on-policy' if reply['on_policy'] else 'off-policy'}), step {reply['step']}, "
            f"version {reply['version']}, cycle {reply['cycle']}/{reply['cycles']}, "
            f"{reply['wall_s']:.0f} s"
        )
        by_teacher = reply.get("by_teacher") or {}
        if teacher and not by_teacher:
            typer.echo(f"teacher: {teacher.get('name')} instance {teacher.get('instance')} "
                       f"gen {teacher.get('gen')} at {reply.get('endpoint')}")
        from miniverl.student.report.summary import fmt_by_teacher

        for route, line in zip(by_teacher.values(), fmt_by_teacher(by_teacher), strict=True):
            who = route.get("teacher") or {}
            typer.echo(f"teacher {line} ({who.get('name')} instance "
                       f"{str(who.get('instance'))[:8]} gen {who.get('gen')} at "
                       f"{route.get('endpoint')})")
        counters = reply.get("counters") or {}
        typer.echo(f"stale replies dropped: {counters.get('stale_dropped', 0)}, bytes received: "
                   f"{counters.get('bytes_received', 0):,}")

    @app.command()
    def stop(
        run: Path = typer.Argument(..., help="Run directory."),
        no_checkpoint: bool = typer.Option(False, "--no-checkpoint", help="Skip the checkpoint."),
    ) -> None:
        """Ask a running student to checkpoint and stop at the next update boundary."""
        from miniverl.protocol.control_socket import (
            StopRequest,
            control_endpoint,
            control_request,
            new_id,
        )

        control_request(control_endpoint(run),
                        StopRequest(id=new_id(), checkpoint=not no_checkpoint))
        typer.echo(f"stop requested; `miniverl up --resume --run-id {Path(run).name}` continues")
