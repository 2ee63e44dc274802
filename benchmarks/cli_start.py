"""How long `alaya-flash` takes to start: each command in a fresh process, its wall and CPU seconds
(user + system, the process and its children), median of --repeats runs.

    .venv/bin/python benchmarks/cli_start.py [--repeats 5]

The commands: `--help` (parses only), `gbuffers info` on the bundled sample (reads a clip), a one-frame
32x32 render of the sample with a prompt (imports torch and transformers, loads the shipped model and
MiniLM: what a render pays before its first frame; the prompt store off), the same render with its
prompt in the prompt store (stored by an untimed run first: no transformers, no MiniLM;
model_zoo/prompt_store.py), and loading the shipped model alone.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this checkout as `alaya_flash` (tests/conftest.py registers it), then the command line
CLI = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
       "from alaya_flash.streaming.cli import main; sys.exit(main())"]
LOAD = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
        "from alaya_flash.model_zoo.folders import load_flash; load_flash()"]


def commands(out: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (command, environment it adds)."""
    sample = str(ROOT / "samples" / "courtyard")
    render = CLI + ["--quiet", "render", sample, "--prompt", "a street", "--frames", "1", "--size", "32",
                    "--out", str(out / "one.mp4"), "--overwrite"]
    return {
        "--help": (CLI + ["--help"], {}),
        "gbuffers info": (CLI + ["gbuffers", "info", sample], {}),
        "render, 1 frame": (render, {"ALAYA_FLASH_PROMPT_STORE": "off"}),
        "render, prompt stored": (render, {"ALAYA_FLASH_PROMPT_STORE": str(out / "prompts")}),
        "load the shipped model": (LOAD, {}),
    }


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of cmd in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cmds = commands(Path(tmp))
        timed(*cmds["render, prompt stored"])  # stores the prompt
        runs = {name: [] for name in cmds}
        for _ in range(args.repeats):  # interleaved: a busy moment of the machine touches every command alike
            for name, (cmd, env) in cmds.items():
                runs[name].append(timed(cmd, env))
    print(f"{'command':<24} {'wall s':>7} {'CPU s':>7}   (median of {args.repeats})")
    for name, times in runs.items():
        print(f"{name:<24} {statistics.median(w for w, _ in times):7.2f} {statistics.median(c for _, c in times):7.2f}")


if __name__ == "__main__":
    main()
