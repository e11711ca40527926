"""The `spatialfed` command line (SPEC §6).

One module per command: its NAME and one-line HELP, `register(subparsers)` and `run(args)`, a thin handler over the
library; the options several commands share live in `spatialfed.cli.args`. A command module imports the library only
inside its functions, so `spatialfed --help` and `--version` load none of it and `main` builds the full parser of
the invoked command alone. `main` turns the errors a user can cause into one line on stderr.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import sys
import warnings

from spatialfed.cli import cluster_script, compare, demo, fit, ingest, pilot_clip, predict, simulate
from spatialfed.cli import map as map_command  # the module of `spatialfed map`, not the builtin
from spatialfed.errors import SpatialFedError, command_line

#: the commands in the order `spatialfed --help` lists them
COMMANDS = (simulate, ingest, fit, predict, map_command, compare, demo, cluster_script, pilot_clip)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every command registered; with `only`, the other commands get their name and help
    but no options (enough for `--help` and for a usage error naming the choices)."""
    from spatialfed.version import __version__

    parser = argparse.ArgumentParser(prog="spatialfed", description="Federated low-rank spatial Gaussian processes.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for command in COMMANDS:
        if only is None or command.NAME == only:
            command.register(subparsers)
        else:
            subparsers.add_parser(command.NAME, help=command.HELP)
    return parser


def main(argv=None) -> int:
    """Entry point of the `spatialfed` console script; returns the exit status (0 ok, 1 error, 2 usage, 130 Ctrl-C,
    143 SIGTERM, 129 SIGHUP: api.signals).

    Errors a user can cause (SpatialFedError, ValueError, OSError) and Ctrl-C print one line on stderr, never a
    traceback; anything else is a bug and keeps its traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    _skip_exit_collection()
    # the command is the first word (the top-level options take no value)
    parser = build_parser(only=next((word for word in argv if not word.startswith("-")), ""))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from spatialfed.api import signals

    signals.stop_as_interrupt(tracker=False)  # SIGTERM, SIGHUP (walltime, a closed terminal) stop as Ctrl-C
    try:
        with command_line(), warnings.catch_warnings():  # advice names flags; a warning is one line
            warnings.showwarning = _warning_line(args.command)
            args.handler(args)
    except KeyboardInterrupt as exc:  # its message, if any, says how to continue (fit: the resume command)
        signum = signals.received()
        how = "interrupted" if signum is None else f"stopped by {signals.name(signum)}"
        detail = "" if isinstance(exc, signals.Terminated) else _one_line(exc) if str(exc) else ""  # says `how`
        print(f"spatialfed {args.command}: {how}{'; ' + detail if detail else ''}", file=sys.stderr)
        return 130 if signum is None else signals.exit_status(signum)
    except (SpatialFedError, ValueError, OSError) as exc:
        print(f"spatialfed {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    return 0


def _skip_exit_collection() -> None:
    """Freeze the garbage collector's objects as the interpreter exits (the last exit handler): its final pass over
    the ~210,000 objects NumPy, SciPy, pandas, Zarr, scikit-learn and Bokeh create costs ~0.6 CPU s per command
    (measured on the Meuse ingest and fit), and every file spatialfed writes is closed by then (one atomic writer)."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def _warning_line(command: str):
    """A `warnings.showwarning` printing "spatialfed COMMAND: warning: MESSAGE" on one line (no category, no source
    line)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"spatialfed {command}: warning: {_one_line(message)}", file=sys.stderr if file is None else file)

    return show


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (an OSError without a message names its type and file)."""
    text = " ".join(str(exc).split())
    if not text:
        text = type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text = f"{text}: {exc.filename}"
    return text


if __name__ == "__main__":
    sys.exit(main())
