"""Inspect networks and weight files.

  alaya-flash model spec CONFIG      one 'name shape' line per parameter (sorted, meta device)
  alaya-flash model identify PATH    what a weight file, shard index or folder holds (published forms:
                                     Wan-native, sharded, ComfyUI, fp8-scaled, diffusers; our model
                                     folders): component, config, form, dtype, what is missing;
                                     exit 0 identified, 1 not, 2 unreadable
  alaya-flash model list             the named configs of every family
  alaya-flash model convert SRC DST --tokenizer spiece.model
                                     Wan 2.1's umT5 encoder .pth -> safetensors (ComfyUI's form, the
                                     tokenizer embedded); the only command that opens a pickle, with
                                     torch.load(weights_only=True, mmap=True)
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..args import out_path

HELP = "print a config's parameter spec, identify a weight file, list configs, convert a Wan umT5 .pth"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    spec = sub.add_parser("spec", help="one 'name shape' line per parameter of a named config, sorted by name")
    spec.add_argument("config", help="a named config (see `alaya-flash model list`)")
    ident = sub.add_parser("identify", help="name what a weight file or folder holds, from keys and shapes (exit 0 identified, 1 not, 2 unreadable)")
    ident.add_argument("file", type=Path, metavar="FILE_OR_DIR",
                       help="a .safetensors file, a .safetensors.index.json, a diffusers/Wan/ComfyUI folder, or a model folder")
    sub.add_parser("list", help="list the named configs of every family")
    conv = sub.add_parser("convert", help="Wan 2.1's umT5 encoder .pth -> a .safetensors the loaders read (tokenizer embedded)")
    conv.add_argument("src", type=Path, help="Wan's models_t5_umt5-xxl-enc-bf16.pth (opened tensors-only, memory-mapped)")
    conv.add_argument("dst", type=out_path, help="the .safetensors to write (ComfyUI's text_encoders/ form)")
    conv.add_argument("--tokenizer", type=Path, default=None,
                      help="umT5's sentencepiece model: spiece.model, or the folder holding it (Wan's google/umt5-xxl)")


def run(args: argparse.Namespace) -> int:
    from ....model_zoo import registry

    if args.action == "spec":
        from ....model_zoo.loading import spec_lines

        print("\n".join(spec_lines(registry.build(args.config, device="meta"))))
        return 0
    if args.action == "convert":
        from ....model_zoo.umt5 import convert_wan_checkpoint

        print(convert_wan_checkpoint(args.src, args.dst, args.tokenizer))
        return 0
    if args.action == "list":
        for name, (family, cfg) in sorted(registry.all_configs().items()):
            print(f"{name}\t{family}\t{cfg}")
        return 0
    from ....model_zoo.identify import identify_path

    report = identify_path(args.file)
    print(report.describe())
    return report.status
