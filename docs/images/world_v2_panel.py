"""Make docs/images/world-v2-panel.jpg: world v2's channels, sun visibility and path-traced truth.

    .venv/bin/python docs/images/world_v2_panel.py

One row per scene kind (street / walk, courtyard / orbit, interior / walk; the sun on the left):
albedo (sRGB-encoded for display), camera-space normal, sun visibility, then the truth under
eight presets, each labelled. 128x128, 64 spp, max_depth 4.
"""
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from alaya_flash.streaming.gbuffer import frame_to_teacher
from alaya_flash.streaming.world.traced import TracedConfig, TracedWorld

SIZE, SPP = 128, 64
PRESETS = ("bright_sunny", "sunset_dramatic", "overcast", "rainy_wet", "foggy", "night_lamps", "cyberpunk_neon",
           "moonlit_night")
OUT = Path(__file__).with_name("world-v2-panel.jpg")


def main() -> None:
    rows = []
    for kind, camera, seed in (("street", "walk", 2), ("courtyard", "orbit", 4), ("interior", "walk", 6)):
        world = TracedWorld(TracedConfig(seed=seed, scene=kind, camera=camera, width=SIZE, height=SIZE,
                                         presets=PRESETS, spp=SPP, sun="left"))
        frame, _ = world.frame(8)
        teacher = frame_to_teacher(frame)
        vis = (np.repeat(frame.extras["sun_visibility"][..., None], 3, -1) * 255).astype(np.uint8)
        tiles = [("albedo", teacher[0]), ("normal", teacher[3]), ("sun visibility", vis)]
        tiles += [(p, frame.extras[f"rgb_{p}"]) for p in PRESETS]
        images = []
        for label, tile in tiles:
            im = Image.fromarray(tile)
            ImageDraw.Draw(im).text((3, 2), label if label != "albedo" else f"{kind}: albedo", fill=(255, 255, 0))
            images.append(np.asarray(im))
        rows.append(np.concatenate(images, 1))
    Image.fromarray(np.concatenate(rows, 0)).save(OUT, quality=88)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
