"""Peak resident memory of loading a published-size teacher: the 1.3B DiT (bf16) + the Wan2.1 VAE.

    .venv/bin/python benchmarks/published_memory.py                  # writes ~3.1 GB to a temp dir
    .venv/bin/python benchmarks/published_memory.py --dir /big/tmp --keep
    .venv/bin/python benchmarks/published_memory.py --legs lazy-bf16,eager-bf16

The files are written first, with random weights, as the releases lay them out: the AlayaRenderer
`model.safetensors` (Wan-native, bf16, 825 tensors), ComfyUI's `wan_2.1_vae.safetensors` (bf16)
and, for the fp8 leg, a ComfyUI-style scaled-fp8 copy of the DiT. Each leg then runs in a fresh
process and reports its peak RSS (VmHWM, file-backed pages included), its RSS before loading (the
interpreter, torch and this package) and the bytes of the loaded weights:

  lazy-bf16    published.load_teacher_files(dtype=bf16): meta-device modules, one tensor at a time
  lazy-fp32    the same, cast to float32 (the default on CPUs without fast bf16)
  lazy-fp8     the scaled-fp8 DiT dequantized to bf16, + the VAE
  eager-bf16   the usual way: safetensors.torch.load_file, modules built on the CPU, load_state_dict
  umt5         umT5-XXL fp16 (~11 GB) through model_zoo.umt5.load_umt5, when that exists

Free disk and available memory are checked first; a leg that would not fit is skipped, saying so.
Prints figures only; no assertions (the figures go to docs/benchmarks.md and docs/model.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import import_package, rss_mib

GIB = 1 << 30
DIT_BYTES, VAE_BYTES, UMT5_BYTES = 2_838_976_640, 253_785_062, 11_400_000_000  # bf16 / bf16 / fp16, approximate
LEGS = ("lazy-bf16", "lazy-fp32", "lazy-fp8", "eager-bf16", "umt5")


def peak_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def random_like_published(module, dtype):
    """Random weights of a module's shapes (std 0.02), tensor by tensor, in dtype."""
    import torch

    g = torch.Generator().manual_seed(0)
    return {k: torch.empty(v.shape, dtype=dtype).normal_(0.0, 0.02, generator=g) for k, v in module.state_dict().items()}


def write_files(folder: Path, fp8: bool) -> dict[str, Path]:
    import torch

    from alaya_flash.model_zoo import loading, registry

    out = {"dit": folder / "model.safetensors", "vae": folder / "wan_2.1_vae.safetensors", "dit-fp8": folder / "teacher_fp8_scaled.safetensors"}
    if not out["dit"].exists():
        t = time.perf_counter()
        loading.save_safetensors(random_like_published(registry.build("alayarenderer-teacher", device="meta"), torch.bfloat16), out["dit"])
        print(f"wrote {out['dit']} ({out['dit'].stat().st_size / GIB:.2f} GiB) in {time.perf_counter() - t:.0f} s")
    if not out["vae"].exists():
        loading.save_safetensors(random_like_published(registry.build("wan2.1-vae", device="meta"), torch.bfloat16), out["vae"])
        print(f"wrote {out['vae']} ({out['vae'].stat().st_size / GIB:.2f} GiB)")
    if fp8 and not out["dit-fp8"].exists():
        state = loading.read_state_dict(out["dit"])
        q = {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
        for k, v in state.items():
            if k.endswith(".weight") and v.ndim >= 2:
                scale = v.abs().max().float() / 448.0
                q[k] = (v.float() / scale).to(torch.float8_e4m3fn)
                q[k[: -len(".weight")] + ".scale_weight"] = scale.reshape(())
            else:
                q[k] = v
        del state
        loading.save_safetensors(q, out["dit-fp8"])
        print(f"wrote {out['dit-fp8']} ({out['dit-fp8'].stat().st_size / GIB:.2f} GiB)")
    return out


UMT5_FILE = "umt5_xxl_fp16.safetensors"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def umt5_sized_tokenizer(pieces: int = 256_384) -> bytes:
    """A sentencepiece model proto with umT5's piece count (a small trained model + filler pieces),
    so a random-weight umT5-XXL file carries a tokenizer that pairs with its 256,384-row embedding."""
    import io
    import random
    import struct

    import sentencepiece

    rng = random.Random(0)
    words = ["red", "car", "street", "night", "light", "tree", "house", "rain", "sun", "road"]
    corpus = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(300)]
    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=buf, model_type="unigram", vocab_size=400, hard_vocab_limit=False,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, byte_fallback=True, character_coverage=1.0, num_threads=1, minloglevel=2)
    proto = buf.getvalue()
    have = sentencepiece.SentencePieceProcessor(model_proto=proto).get_piece_size()
    extra = bytearray()
    for i in range(pieces - have):  # ModelProto.pieces (field 1): {piece (1), score (2), type (3) = NORMAL}
        text = f"\u2581zq{i}".encode()
        body = b"\x0a" + _varint(len(text)) + text + b"\x15" + struct.pack("<f", -30.0) + b"\x18\x01"
        extra += b"\x0a" + _varint(len(body)) + body
    return proto + bytes(extra)


def write_umt5(folder: Path) -> None:
    """umT5-XXL in ComfyUI's text_encoders/ form: fp16, transformers' names, the tokenizer as `spiece_model`."""
    import torch

    from alaya_flash.model_zoo import loading, registry

    path = folder / UMT5_FILE
    if path.exists():
        return
    t = time.perf_counter()
    module = registry.build("umt5-xxl", device="meta")
    state = random_like_published(module, torch.float16)
    state.pop("encoder.embed_tokens.weight", None)  # tied to shared.weight; ComfyUI's file does not repeat it
    state["spiece_model"] = torch.frombuffer(bytearray(umt5_sized_tokenizer()), dtype=torch.uint8)
    loading.save_safetensors(state, path)
    print(f"wrote {path} ({path.stat().st_size / GIB:.2f} GiB) in {time.perf_counter() - t:.0f} s")


def run_leg(leg: str, folder: Path) -> dict:
    """In this (fresh) process: load once, report figures."""
    import_package()
    import torch

    from alaya_flash.model_zoo import published

    files = {"dit": folder / "model.safetensors", "vae": folder / "wan_2.1_vae.safetensors", "dit-fp8": folder / "teacher_fp8_scaled.safetensors"}
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    before = rss_mib()
    t = time.perf_counter()
    if leg in ("lazy-bf16", "lazy-fp32", "lazy-fp8"):
        dtype = torch.float32 if leg == "lazy-fp32" else torch.bfloat16
        model = published.load_teacher_files(files["dit-fp8" if leg == "lazy-fp8" else "dit"], files["vae"], dtype=dtype,
                                             text_encoder="umt5-xxl")
        nets = [model.dit, model.vae]
    elif leg == "eager-bf16":
        from safetensors.torch import load_file

        from alaya_flash.model_zoo import registry

        nets = []
        for name, path in (("alayarenderer-teacher", files["dit"]), ("wan2.1-vae", files["vae"])):
            module = registry.build(name, dtype=torch.bfloat16)  # allocated (and initialised) on the CPU
            module.load_state_dict(load_file(str(path)))
            nets.append(module)
    elif leg == "umt5":
        from alaya_flash.model_zoo.umt5 import load_umt5  # noqa: F401 (absent until that module exists)

        encoder = load_umt5(folder / UMT5_FILE, dtype=torch.float16)
        nets = [encoder.model]
    else:
        raise SystemExit(f"unknown leg {leg}")
    seconds = time.perf_counter() - t
    peak_load = peak_mib()
    with torch.no_grad():  # read every weight once: weights left mapped from the file (not copied) count from here
        for n in nets:
            for p in n.parameters():
                p.sum()
    weights = sum(p.numel() * p.element_size() for n in nets for p in n.parameters()) / (1 << 20)
    return {"leg": leg, "before_mib": before, "peak_load_mib": peak_load, "peak_mib": peak_mib(), "after_mib": rss_mib(),
            "weights_mib": weights, "seconds": seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the files (reused by the next run with the same --dir)")
    p.add_argument("--legs", default="lazy-bf16,lazy-fp32,lazy-fp8,eager-bf16,umt5", help=f"comma-separated, of {', '.join(LEGS)}")
    p.add_argument("--leg", help=argparse.SUPPRESS)  # internal: run one leg in this process
    args = p.parse_args(argv)
    if args.leg in ("write", "write-fp8"):
        import_package()
        write_files(args.dir, args.leg == "write-fp8")
        return 0
    if args.leg == "write-umt5":
        import_package()
        write_umt5(args.dir)
        return 0
    if args.leg:
        print(json.dumps(run_leg(args.leg, args.dir)))
        return 0

    legs = [leg.strip() for leg in args.legs.split(",") if leg.strip()]
    import_package()
    if "umt5" in legs:
        try:
            from alaya_flash.model_zoo.umt5 import load_umt5  # noqa: F401
        except ImportError:
            print("umT5-XXL: figure missing (this checkout has no model_zoo.umt5.load_umt5)")
            legs.remove("umt5")
    tmp = None
    folder = args.dir
    if folder is None:
        tmp = tempfile.mkdtemp(prefix="published_memory_", dir=os.environ.get("TMPDIR", "/tmp"))
        folder = Path(tmp)
    folder.mkdir(parents=True, exist_ok=True)
    need = DIT_BYTES + VAE_BYTES + (DIT_BYTES // 2 if "lazy-fp8" in legs else 0) + (UMT5_BYTES if "umt5" in legs else 0)
    free = shutil.disk_usage(folder).free
    avail = mem_available()
    print(f"machine: {os.cpu_count()} CPUs, MemAvailable {avail / GIB:.1f} GiB, free disk at {folder}: {free / GIB:.1f} GiB; "
          f"files need {need / GIB:.1f} GiB")
    existing = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    if free + existing < need * 1.05:
        print("not enough free disk for the files: nothing measured")
        return 1
    if avail < 2 * (DIT_BYTES + VAE_BYTES) + GIB:
        print("not enough available memory to write the files and run the eager leg: nothing measured")
        return 1
    try:
        print(f"writing random-weight files to {folder} ...")
        # written by a child process, so this process's memory stays small
        subprocess.run([sys.executable, __file__, "--leg", "write-fp8" if "lazy-fp8" in legs else "write", "--dir", str(folder)], check=True)
        if "umt5" in legs:
            if mem_available() < UMT5_BYTES + 3 * GIB:
                print(f"umT5-XXL: figure missing (writing its file needs ~{UMT5_BYTES / GIB:.0f} GiB of memory; "
                      f"MemAvailable {mem_available() / GIB:.1f} GiB)")
                legs.remove("umt5")
            else:
                subprocess.run([sys.executable, __file__, "--leg", "write-umt5", "--dir", str(folder)], check=True)
        print(f"{'leg':<11} {'weights MiB':>11} {'RSS before':>10} {'peak (load)':>11} {'peak':>6} {'peak - before':>13} "
              f"{'RSS after':>9} {'seconds':>7}   (MiB; peak: after reading every weight once)")
        for leg in legs:
            if leg == "eager-bf16" and mem_available() < 2 * (DIT_BYTES + VAE_BYTES) + GIB:
                print(f"{leg:<11} skipped: MemAvailable {mem_available() / GIB:.1f} GiB is too little")
                continue
            res = subprocess.run([sys.executable, __file__, "--leg", leg, "--dir", str(folder)], capture_output=True, text=True)
            if res.returncode:
                print(f"{leg:<11} failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
                continue
            r = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"{leg:<11} {r['weights_mib']:>11.0f} {r['before_mib']:>10.0f} {r['peak_load_mib']:>11.0f} {r['peak_mib']:>6.0f} "
                  f"{r['peak_mib'] - r['before_mib']:>13.0f} {r['after_mib']:>9.0f} {r['seconds']:>7.1f}")
    finally:
        if tmp and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
