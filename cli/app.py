"""The typer application and the entry point ``miniverl``.

Commands are grouped in sibling modules (``cli/<group>.py``), each exposing
``register(app)``. ``run()`` (behind ``main()``) turns every :class:`MiniverlError`,
and every OSError a user can fix (a missing path, a permission, a full disk), into one
line on stderr and exit code 1; a traceback reaches the user only for a real bug.
"""

from __future__ import annotations

# Imports inside functions are deliberate: `miniverl --help` stays fast and torch-free.
import importlib
import sys
from typing import Any

import typer
import typer.core


def _blank_flag_metavars(params: list[Any]) -> list[Any]:
    """An empty metavar on each flag of ``params`` (one it already has is kept)."""
    for param in params:
        is_flag = getattr(param, "is_flag", False) and not getattr(param, "count", False)
        if is_flag and param.metavar is None:
            param.metavar = ""
    return params


def _hide_flag_types(command: Any, ctx: Any) -> Any:
    """Give every flag of ``command`` (and of its subcommands) an empty metavar.

    Why: typer's rich help panel (typer 0.2x, which vendors click) writes
    ``param.display_type_rich()`` beside every option, flags included, and that answers
    ``<bool>`` for a flag, so ``miniverl --help`` showed ``--version <bool>`` although
    a flag takes no value. Its plain formatter skips flags; so do older typers (which
    skipped click's ``BOOLEAN`` metavar). A set metavar is what that column shows, and
    click never prints a flag's metavar elsewhere, so an empty one hides the type
    everywhere without changing parsing. ``get_params(ctx)`` includes the lazily made
    ``--help`` option.
    """
    _blank_flag_metavars(command.get_params(ctx))
    for sub in (getattr(command, "commands", None) or {}).values():
        _hide_flag_types(sub, ctx)
    return command


class _Group(typer.core.TyperGroup):
    """The root command group: help screens show no value type on flags (see above)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _blank_flag_metavars(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        return None if command is None else _hide_flag_types(command, ctx)


app = typer.Typer(
    cls=_Group,
    name="miniverl",
    help="A single-GPU lab for online post-training of tool-using language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module registers its commands; order is the order of `miniverl --help`.
COMMAND_MODULES = (
    "foundation",  # doctor, validate, schema
    "run_cmds",  # demo, up, train, eval, status, stop
    "teacher_cmds",  # teacher serve/status/reload/shutdown/use, qualify-teacher
    "data_cmds",  # inspect
    "cache_cmds",  # cache stats, cache validate
    "report_cmds",  # report, benchmark, export-benchmark
    "bridge_cmds",  # export-adapter, export-verl, convert-dataset, import-verl, bridge doctor
    "model_cmds",  # convert-gguf
)


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"miniverl {version('miniverl')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """A single-GPU lab for online post-training of tool-using language models."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"miniverl.cli.{_name}").register(app)


def run(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    Expected failures (a :class:`MiniverlError`, or an OSError a user can fix: a missing
    path, a permission, a full disk) print one ``error:`` line on stderr and return 1.
    """
    from miniverl.common.errors import MiniverlError
    from miniverl.common.os_errors import os_error_line

    try:
        # In non-standalone mode click returns a command's `typer.Exit` code instead
        # of exiting; without this, `raise typer.Exit(1)` would exit 0.
        code = app(args=argv, prog_name="miniverl", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except MiniverlError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 1
    except OSError as exc:
        line = os_error_line(exc)
        if line is None:
            raise
        typer.echo(f"error: {line}", err=True)
        return 1
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        # typer >= 0.16 vendors click as `typer._click`, so match by shape, not class:
        # an `import click` isinstance check would let usage errors escape as tracebacks.
        if callable(getattr(exc, "show", None)) and hasattr(exc, "exit_code"):
            exc.show()
            return exc.exit_code if exc.exit_code else 2
        if type(exc).__name__ == "Abort":
            typer.echo("aborted", err=True)
            return 130
        raise


def main() -> None:
    """The ``miniverl`` console script."""
    sys.exit(run())


if __name__ == "__main__":
    main()
