"""alaya-flash: real-time generative G-buffer renderer (command line).

Run `alaya-flash COMMAND --help` for each command's options.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys

from ...model_zoo.errors import AlayaError

# Subcommand name -> module under streaming/cli/commands/. Add a line to add a command.
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "eval": "eval",
    "gbuffers": "gbuffers",
    "model": "model",
    "train": "train",
    "serve": "serve",
    "world": "world",
    "run": "run",
    "batch": "batch",
    "render": "render",
    "bench": "bench",
}

log = logging.getLogger("alaya_flash")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Option defaults in --help, and command docstrings shown as written (examples keep their lines)."""


class UsageError(Exception):
    """A bad command line: argparse's message, printed as one line by main (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line (no usage block): `alaya-flash COMMAND --help` has the rest
        raise UsageError(f"{self.prog}: error: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="alaya-flash", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks and debug logs")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or status lines")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f".commands.{module_name}", __package__)
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__ or module.HELP,
            formatter_class=_HelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `alaya-flash` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        print(err, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.debug else (logging.WARNING if args.quiet else logging.INFO),
        format="%(message)s",
        stream=sys.stderr,
    )
    if hasattr(args, "no_pipeline"):  # a command that renders here (args.add_cpu_arguments)
        from ..engine.cpu import configure

        configure(args.threads, pipeline=not args.no_pipeline)
    previous = _stop_on_signals()
    code = 1  # until the command returns
    try:
        try:
            code = int(args._run(args) or 0)
            return code
        except Exception as err:
            if _received:  # the signal's exception was turned into another on its way (e.g. mid-import)
                raise Stopped(_received[-1]) from err
            raise
    except AlayaError as err:
        if args.debug:
            raise
        print(f"alaya-flash: error: {err}", file=sys.stderr)
        return 2
    except Stopped as stop:
        print(f"alaya-flash: stopped by {stop.name}; nothing partial was left", file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt:
        print("alaya-flash: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `alaya-flash ... | head`: the reader left; say nothing more
        _silence_stdout()
        return 0
    except OSError as err:  # the disk or the OS refused (full disk, no permission, file too large)
        if args.debug:
            raise
        where = f"{err.filename}: " if err.filename else ""
        print(f"alaya-flash: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    finally:
        if code != 0:  # whatever the reason, no half-written output stays behind
            from ..files.sinks import abort_unfinished

            abort_unfinished()
        _restore_signals(previous)


_received: list[int] = []  # stop signals seen by this run


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so every writer aborts and removes its temporary files."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.name = signum, signal.Signals(signum).name


def _stop_on_signals() -> dict:
    """Handle SIGTERM and SIGHUP like SIGINT (only in the main thread, where Python runs handlers)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum, _frame):
        _received.append(signum)
        raise Stopped(signum)

    _received.clear()

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, stop)
    return previous


def _restore_signals(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so Python's exit flush does not fail again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
