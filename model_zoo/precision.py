"""Which floating-point dtype runs fastest here: bf16 where the hardware has it, else float32.

bf16 is faster than float32 on CPUs with AMX / AVX512-BF16 (docs/benchmarks.md has the measured
ratios), but several times slower than float32 on CPUs without them (PyTorch then emulates bf16 matmuls): measured on an
AVX2-only AMD EPYC, a 1024x384x1536 linear took ~300 ms in bf16 against ~35 ms in float32.
So the default is chosen from the CPU's flags, never assumed.
"""
from __future__ import annotations

import functools

import torch

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """True when /proc/cpuinfo lists AMX-BF16 or AVX512-BF16 (Linux; False elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return any(flag in flags for flag in BF16_CPU_FLAGS)
    except OSError:
        pass
    return False


def preferred_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bf16 on CUDA with bf16 support and on CPUs with AMX/AVX512-BF16; float32 otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    return torch.float32


def choose_device(choice: str = "auto") -> torch.device:
    """'auto': CUDA when present, else the CPU; any other choice as given."""
    if choice != "auto":
        return torch.device(choice)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def choose_dtype(choice: str, device: torch.device) -> torch.dtype:
    """'bf16' / 'fp32' as given; 'auto': bf16 on CUDA and on CPUs with fast bf16 (AMX), else float32."""
    if choice == "bf16":
        return torch.bfloat16
    if choice == "fp32":
        return torch.float32
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
