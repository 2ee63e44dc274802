"""Make docs/images/world-panel.png: one physics-world frame's channels and its ground truth.

    .venv/bin/python docs/images/world_panel.py

Row 1: the G-buffer channels (albedo sRGB-encoded for display, depth in the teacher's 8-bit
inverse encoding, camera-space normal, metallic, roughness, object id in random colours).
Row 2: ground truth under six lighting presets (shadows off: a pure function of row 1).
Row 3: sun visibility and ground truth with shadows on, for two suns; two more presets.
"""
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from alaya_flash.streaming.gbuffer import frame_to_teacher
from alaya_flash.streaming.world import World, WorldConfig, shade

SIZE = 224
OUT = Path(__file__).with_name("world-panel.png")


def main() -> None:
    world = World(WorldConfig(seed=3, width=SIZE, height=SIZE, num_objects=24, camera="orbit", presets=()))
    for _ in range(14):  # about a second in: objects landing and rolling
        world.advance()
    frame, cam = world.frame()
    teacher = frame_to_teacher(frame)
    ids = frame.extras["object_id"]
    palette = np.random.default_rng(0).integers(40, 255, size=(ids.max() + 1, 3), dtype=np.uint8)
    palette[0] = 0
    tiles = [(teacher[0], "albedo"), (teacher[1], "depth"), (teacher[3], "normal"), (teacher[2], "metallic"),
             (teacher[4], "roughness"), (palette[ids], "object id")]
    for name in ("bright_sunny", "overcast", "sunset_dramatic", "moonlit_night", "cyberpunk_neon", "snowy_winter"):
        tiles.append((shade(frame.passes(), cam, name), name))
    sunny, sunset = (World(WorldConfig(seed=3, width=SIZE, height=SIZE, num_objects=24, presets=(p,), shadows=True))
                     for p in ("bright_sunny", "sunset_dramatic"))
    for w, name in ((sunny, "bright_sunny"), (sunset, "sunset_dramatic")):
        for _ in range(14):
            w.advance()
        f, _ = w.frame()
        vis = (f.extras["sun_visibility"] * 255).astype(np.uint8)
        tiles += [(np.repeat(vis[..., None], 3, -1), f"sun visibility ({name})"), (f.extras["rgb"], f"{name} + shadows")]
    for name in ("autumn_warm", "underwater"):
        tiles.append((shade(frame.passes(), cam, name), name))

    cols = 6
    rows = (len(tiles) + cols - 1) // cols
    grid = Image.new("RGB", (cols * SIZE, rows * SIZE))
    draw = ImageDraw.Draw(grid)
    for k, (img, label) in enumerate(tiles):
        r, c = divmod(k, cols)
        grid.paste(Image.fromarray(img), (c * SIZE, r * SIZE))
        draw.text((c * SIZE + 5, r * SIZE + 4), label, fill=(0, 0, 0))
        draw.text((c * SIZE + 4, r * SIZE + 3), label, fill=(255, 255, 255))
    grid.save(OUT, optimize=True)
    print(f"wrote {OUT} ({grid.width}x{grid.height})")


if __name__ == "__main__":
    main()
