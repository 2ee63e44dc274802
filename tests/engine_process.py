"""An external engine for tests/test_live_ingest.py: the physics world in its own process, talking to a
live server only through `alaya_flash.client`.

    python tests/engine_process.py URL FRAMES [--move-from N] [--prompt-before N TEXT] [--seed S]

Steps a PlayableWorld (64x64, 30 fps), sends each frame's float passes (the client's float form),
receives every rendered frame and prints one JSON line: the frame numbers, a SHA-256 digest of
each rendered image, the player's positions, whether `import alaya_flash.client` imported torch,
and the session's hello. --move-from N holds "forward" from frame N on; --prompt-before N TEXT
sends a prompt change just before frame N.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402,F401  (this checkout as alaya_flash)

from alaya_flash.client import Client  # noqa: E402

CLIENT_IMPORTED_TORCH = "torch" in sys.modules


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("frames", type=int)
    p.add_argument("--move-from", type=int, default=None)
    p.add_argument("--prompt-before", nargs=2, default=None, metavar=("N", "TEXT"))
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    from alaya_flash.streaming.world.play import Controls, PlayableWorld
    from alaya_flash.streaming.world.world import WorldConfig

    game = PlayableWorld(WorldConfig(seed=args.seed, width=64, height=64, fps=30.0, presets=()))
    prompt_at = int(args.prompt_before[0]) if args.prompt_before else None
    digests, numbers, players = [], [], []
    try:
        with Client(args.url, timeout=120) as client:
            hello = client.hello
            for n in range(args.frames):
                moving = args.move_from is not None and n >= args.move_from
                frame = game.step(Controls(move=(0.0, 1.0) if moving else (0.0, 0.0)))
                players.append([round(float(v), 4) for v in game.player_position])
                if n == prompt_at:
                    client.set_prompt(args.prompt_before[1])
                client.send(n, frame, depth_near=game.info.depth_near)
                for got in client.poll():
                    numbers.append(got.number)
                    digests.append(hashlib.sha256(got.image.tobytes()).hexdigest()[:16])
            while len(numbers) < args.frames and not client.errors:  # FRAMES: whole chunks (1 + 4k)
                got = client.receive(timeout=120)
                numbers.append(got.number)
                digests.append(hashlib.sha256(got.image.tobytes()).hexdigest()[:16])
            errors = list(client.errors)
    finally:
        game.close()
    print(json.dumps({"numbers": numbers, "digests": digests, "players": players, "hello": hello,
                      "errors": errors, "client_imported_torch": CLIENT_IMPORTED_TORCH}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
