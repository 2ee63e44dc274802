"""Inspect networks and weight files.

  alaya-flash model spec CONFIG      one 'name shape' line per parameter (sorted, meta device)
  alaya-flash model identify FILE    which known config a .safetensors file is, from keys and shapes
  alaya-flash model list             the named configs of every family
"""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = "print a config's parameter spec, identify a weight file, list configs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    spec = sub.add_parser("spec", help="one 'name shape' line per parameter of a named config, sorted by name")
    spec.add_argument("config", help="a named config (see `alaya-flash model list`)")
    ident = sub.add_parser("identify", help="name the known config of a .safetensors file from its keys and shapes")
    ident.add_argument("file", type=Path, help="a .safetensors weight file")
    sub.add_parser("list", help="list the named configs of every family")


def run(args: argparse.Namespace) -> int:
    from ....model_zoo import registry

    if args.action == "spec":
        from ....model_zoo.loading import spec_lines

        print("\n".join(spec_lines(registry.build(args.config, device="meta"))))
        return 0
    if args.action == "list":
        for name, (family, cfg) in sorted(registry.all_configs().items()):
            print(f"{name}\t{family}\t{cfg}")
        return 0
    from ....model_zoo.identify import identify

    result = identify(args.file)
    print(result.describe())
    return 0 if result.matches else 1
