"""Procedural albedo textures for world v2: seeded numpy images, linear RGB, tileable.

A texture is a function of (pattern, two colours, seed) baked into a square bitmap that repeats
every `Material.tile` metres. The path tracer and the G-buffer pass read the same bitmap through
the same renderer lookup (render.py), so the albedo the G-buffer shows is the one the light hits.

Patterns: "brick" (running bond with mortar), "plaster" (blotchy render), "asphalt" (fine grain
with light chips), "tiles" (square stones with grout), "wood" (planks with grain). Colours are
linear; every pattern keeps its values within [0, 1].
"""
from __future__ import annotations

import numpy as np

from ....model_zoo.errors import AlayaError

PATTERNS = ("brick", "plaster", "asphalt", "tiles", "wood")
SIZE = 256  # pixels per side of every bitmap


def _value_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Tileable smooth noise in [0, 1]: a random cells x cells grid, bilinearly upsampled with wrap."""
    grid = rng.random((cells, cells))
    x = np.arange(size) * cells / size
    i0 = np.floor(x).astype(int)
    f = x - i0
    f = f * f * (3 - 2 * f)  # smoothstep between lattice points
    i1 = (i0 + 1) % cells
    rows = grid[i0] * (1 - f)[:, None] + grid[i1] * f[:, None]
    return rows[:, i0] * (1 - f)[None, :] + rows[:, i1] * f[None, :]


def _fbm(rng, size: int, octaves=(4, 8, 16, 32)) -> np.ndarray:
    out = sum(_value_noise(rng, size, c) / (k + 1) for k, c in enumerate(octaves))
    out -= out.min()
    return out / max(out.max(), 1e-9)


def _mix(a, b, t) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a + (b - a) * np.asarray(t)[..., None]


def make_texture(pattern: str, color, color2, seed: int, size: int = SIZE) -> np.ndarray:
    """(size, size, 3) float32 linear RGB in [0, 1]; the same arguments give the same bitmap."""
    if pattern not in PATTERNS:
        raise AlayaError(f"texture pattern {pattern!r} is unknown; choose one of {', '.join(PATTERNS)}")
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size  # v down the bitmap, u across
    noise = _fbm(rng, size)
    if pattern == "brick":
        rows = 16  # courses per tile: the 2 m tile gives 12.5 cm courses
        r = np.floor(y * rows).astype(int)
        u = x * 8 + 0.5 * (r % 2)  # 8 bricks per course, alternate courses offset by half a brick
        b = np.floor(u).astype(int) % 8
        shade = rng.uniform(0.75, 1.2, size=(rows, 8))[r, b]
        mortar = (np.abs(y * rows - np.rint(y * rows)) < 0.09) | (np.abs(u - np.rint(u)) < 0.04)
        img = _mix(np.asarray(color) * shade[..., None] * (0.85 + 0.3 * noise)[..., None], color2, mortar)
    elif pattern == "plaster":
        img = _mix(color, color2, 0.35 * noise) * (0.92 + 0.16 * _value_noise(rng, size, 64))[..., None]
    elif pattern == "asphalt":
        grain = rng.random((size, size))
        chips = grain > 0.985
        img = np.asarray(color) * (0.8 + 0.25 * noise + 0.15 * grain)[..., None]
        img = _mix(img, color2, chips * 0.7)
    elif pattern == "tiles":
        n = 4  # 4 x 4 stones per tile
        i, j = np.floor(y * n).astype(int), np.floor(x * n).astype(int)
        shade = rng.uniform(0.8, 1.15, size=(n, n))[i, j]
        grout = (np.abs(y * n - np.rint(y * n)) < 0.03) | (np.abs(x * n - np.rint(x * n)) < 0.03)
        img = _mix(np.asarray(color) * (shade * (0.85 + 0.25 * noise))[..., None], color2, grout)
    else:  # wood: planks along u, grain stripes inside each plank
        planks = 8
        p = np.floor(y * planks).astype(int)
        offset = rng.random(planks)[p]
        grain = 0.5 + 0.5 * np.sin((x * 40 + offset * 13 + 3 * noise) * 2 * np.pi)
        shade = rng.uniform(0.8, 1.15, size=planks)[p]
        seam = np.abs(y * planks - np.rint(y * planks)) < 0.04
        img = _mix(np.asarray(color) * shade[..., None], color2, 0.45 * grain)
        img = img * np.where(seam, 0.45, 1.0)[..., None]
    return np.ascontiguousarray(np.clip(img, 0.0, 1.0), dtype=np.float32)
