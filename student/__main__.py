"""The student process: ``python -m miniverl.student RECIPE [--teacher ENDPOINT]
[--run-id ID] [--resume] [--offline] [--control] [--no-progress]
[--curve-secret-key FILE --curve-server-key FILE] [--admin-token FILE] [--logger NAME]``.

The same entry as ``miniverl train``; ``miniverl up`` starts it with ``--control`` so the
run answers ``STATUS``, ``RETARGET`` and ``STOP`` on ``ipc://<run>/control.sock``.
Expected failures print one line and exit 1; an interrupt exits 130.
"""

from __future__ import annotations

import argparse
import sys

from miniverl.common.errors import MiniverlError
from miniverl.common.os_errors import os_error_line
from miniverl.protocol.endpoints import curve_key_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m miniverl.student")
    parser.add_argument("recipe")
    parser.add_argument("--teacher", action="append", default=None,
                        help="teacher endpoint, or NAME=ENDPOINT for each of several teachers")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--control", action="store_true", help="bind the control socket")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--curve-secret-key", default=None, help="student CURVE secret key file")
    parser.add_argument("--curve-server-key", default=None, help="teacher CURVE public key file")
    parser.add_argument("--admin-token", default=None, help="teacher admin token file (swap)")
    parser.add_argument("--logger", action="append", default=None,
                        help="add an experiment tracker to run.loggers (repeatable)")
    args = parser.parse_args(argv)

    # start-up: --help and argument errors answer before torch and the trainer load.
    from miniverl.student.api import graceful_stop, summary_lines, train_from_file

    stop = graceful_stop()
    try:
        result = train_from_file(
            args.recipe, teacher=args.teacher, run_id=args.run_id, resume=args.resume,
            offline=args.offline, output_dir=args.output_dir,
            show_progress=not args.no_progress, control=args.control, stop_event=stop,
            teacher_curve=curve_key_files(args.curve_secret_key, args.curve_server_key),
            teacher_admin_token=args.admin_token, loggers=args.logger,
        )
    except MiniverlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a missing path, a full disk: one line, not a traceback
        line = os_error_line(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: checkpoint written; continue with --resume", file=sys.stderr)
        return 130
    for line in summary_lines(result):
        print(line)
    return 130 if result.status == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())
