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
from .. import stops
from ..stops import Stopped

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
    "shade": "shade",
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
        from ..render.cpu import configure

        configure(args.threads, lanes=not args.no_pipeline)
    if hasattr(args, "backend"):  # every model this process loads runs there (nodes, pipelines: "auto")
        from ...model_zoo import runtime

        runtime.configure(args.backend)
    previous: dict = {}
    code = 1  # until the command returns
    try:
        try:
            _stop_on_signals(previous)  # inside: a signal held by an inherited mask arrives here
            result = int(args._run(args) or 0)
            stops.raise_if_stopped()  # the signal's exception was swallowed on its way: still a stop
            code = result
            return code
        except Exception as err:
            if stops.received:  # the signal's exception was turned into another on its way (e.g. mid-import)
                raise Stopped(stops.received[-1]) from err
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


def _stop_on_signals(previous: dict) -> None:
    """Handle SIGTERM and SIGHUP like SIGINT (only in the main thread, where Python runs handlers);
    what it replaces goes into `previous` as it goes, for _restore_signals."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, _frame):
        stops.received.append(signum)
        raise Stopped(signum)

    stops.received.clear()

    ours = {signal.SIGTERM, signal.SIGHUP}
    previous["handlers"] = {sig: signal.signal(sig, stop) for sig in ours}
    # A parent may start us with these signals blocked (the mask is inherited through exec): the kernel
    # would then hold them until exit and the command would finish as if never asked to stop
    previous["blocked"] = signal.pthread_sigmask(signal.SIG_BLOCK, []) & ours
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ours)


def _restore_signals(previous: dict) -> None:
    stops.received.clear()  # this command's stop: an in-process caller's next command starts afresh
    for sig, handler in previous.get("handlers", {}).items():
        signal.signal(sig, handler)
    if previous.get("blocked"):  # an in-process caller gets its mask back
        signal.pthread_sigmask(signal.SIG_BLOCK, previous["blocked"])


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so Python's exit flush does not fail again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
