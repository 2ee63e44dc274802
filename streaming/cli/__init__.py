"""alaya-flash: real-time generative G-buffer renderer (command line).

Run `alaya-flash COMMAND --help` for each command's options.
"""
from __future__ import annotations

import argparse
import importlib
import logging
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
    "render": "render",
    "bench": "bench",
}

log = logging.getLogger("alaya_flash")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Option defaults in --help, and command docstrings shown as written (examples keep their lines)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else (logging.WARNING if args.quiet else logging.INFO),
        format="%(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args._run(args) or 0)
    except AlayaError as err:
        if args.debug:
            raise
        print(f"alaya-flash: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("alaya-flash: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
