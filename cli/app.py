"""The typer application and the entry point ``miniverl``.

Commands are grouped in sibling modules (``cli/<group>.py``), each exposing
``register(app)``. ``main()`` turns every :class:`MiniverlError` into one line on
stderr and exit code 1; a traceback reaches the user only for a real bug.
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


def main() -> None:
    from miniverl.common.errors import MiniverlError

    try:
        # In non-standalone mode click returns a command's `typer.Exit` code instead
        # of exiting; without this, `raise typer.Exit(1)` would exit 0.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except MiniverlError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        # typer >= 0.16 vendors click as `typer._click`, so match by shape, not class:
        # an `import click` isinstance check would let usage errors escape as tracebacks.
        if callable(getattr(exc, "show", None)) and hasattr(exc, "exit_code"):
            exc.show()
            sys.exit(exc.exit_code if exc.exit_code else 2)
        if type(exc).__name__ == "Abort":
            typer.echo("aborted", err=True)
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
