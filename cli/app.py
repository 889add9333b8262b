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

import typer

app = typer.Typer(
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
