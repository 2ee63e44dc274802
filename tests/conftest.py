"""Test setup: import `alaya_flash` from this checkout, whatever is installed.

The repository root is the package, so we register it under its import name before any test
module imports it. Tests then exercise the tree they live in (worktrees, clean clones).
"""
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Test tensors are tiny: one thread avoids OpenMP oversubscription, which made tiny-model tests
# 10-20x slower on the shared 2-core machine (measured: 1.3 s vs 25 s for the 10k-frame stream).
os.environ.setdefault("OMP_NUM_THREADS", "1")

if "alaya_flash" not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        "alaya_flash", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["alaya_flash"] = module
    spec.loader.exec_module(module)
