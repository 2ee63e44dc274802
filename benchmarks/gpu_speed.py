"""Every full-size GPU figure in one run (docs/benchmarks.md, "Full-size architecture"): built, warmed and
measured within about ten minutes on one GPU, printed as one table.

    python benchmarks/gpu_speed.py                          # all rows, 832x448, 48 frames
    python benchmarks/gpu_speed.py --rows kv release --frames 96 --json out.json

Rows (each an `alaya-flash bench --device cuda --precision bf16 --format png --json` run, random
weights: speed does not depend on their values):
  kv        the Flash architecture with the KV-cache sampler: 1.3B Wan DiT (alayarenderer-teacher
            config), G-buffer encoder at hidden 128, taew2_1, no refiner
  sessions  the same, two streams at once over one copy of the weights (--sessions 2)
  release   the AlayaRenderer-Flash release's structure: diffusers' Helios backbone at 1.3B with the
            compressed-history sampler, its grouped encoder and taew2_1 (--dit helios-flash-1.3b)
  default   the embedded default model at 256x256, for scale
Each row reports steady FPS, first-frame latency after the bench's warm-up, p50/p99 latency of a
runner tick (12 frames), ms per frame of the DiT's stage and peak GPU memory; the header says the
date, GPU, driver and torch version. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--device", "cuda", "--precision", "bf16", "--format", "png", "--json"]
ROWS = {
    "kv": ["--dit", "alayarenderer-teacher", "--encoder", "gbuffer-encoder", "--decoder", "taew2_1", "--refiner", "none"],
    "sessions": ["--dit", "alayarenderer-teacher", "--encoder", "gbuffer-encoder", "--decoder", "taew2_1",
                 "--refiner", "none", "--sessions", "2"],
    "release": ["--dit", "helios-flash-1.3b"],
    "default": ["--model", str(ROOT / "model_zoo" / "default"), "--size", "256"],
}


def header() -> str:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script measures the GPU figures (the CPU's: benchmarks/cpu_speed.py)")
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    return (f"{datetime.date.today()}, {torch.cuda.get_device_name(0)}, driver {driver}, torch {torch.__version__}, "
            f"bf16, random weights")


def bench(args: list[str]) -> dict:
    code = "import sys; from alaya_flash.streaming.cli import main; sys.exit(main())"
    out = subprocess.run([sys.executable, "-c", code, "--quiet", "bench", *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def line(name: str, r: dict) -> str:
    if "error" in r:
        return f"| {name} | failed: {r['error']} |||||||"
    f = r["flash"]
    lat = f.get("chunk_latency_ms", {})
    row = (f"| {name} | {r['size'][0]}x{r['size'][1]} | {f['fps_steady']} | {f['first_frame_latency_s']} s | "
           f"{lat.get('p50', '-')} / {lat.get('p99', '-')} | {f['ms_per_frame'].get('sample', '-')} | "
           f"{r.get('peak_gpu_mib', '-')} MiB |")
    s = r.get("sessions")
    if s:
        row += (f" {s['count']} sessions: {s['fps_steady']} FPS each, "
                f"{s.get('gpu_mib_per_session_beyond_weights', '-')} MiB per session beyond the weights |")
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--size", default="832x448", help="frame size of the full-size rows")
    p.add_argument("--frames", type=int, default=48)
    p.add_argument("--json", type=Path, help="also write every bench result here")
    a = p.parse_args(argv)
    print(header())
    print("| row | size | steady FPS | first frame | tick p50 / p99 ms | sample ms/frame | peak GPU | |")
    print("|---|---|---|---|---|---|---|---|")
    results = {}
    for name in a.rows:
        extra = ROWS[name]
        size = [] if "--size" in extra else ["--size", a.size]
        results[name] = bench([*COMMON, "--frames", str(a.frames), *size, *extra])
        print(line(name, results[name]), flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
