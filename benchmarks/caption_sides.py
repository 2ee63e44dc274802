"""How far apart the prompt encoder puts world v2 captions that differ only in the sun's side, against
captions that differ in the preset or the scene kind (mean Euclidean distance of the unit MiniLM
contexts the DiT reads; for a context of several tokens, the largest distance at one position). The
caption is the only input that names the side (docs/world.md), so a small distance is a small signal
for the model to learn cast shadows from.

    .venv/bin/python benchmarks/caption_sides.py            # the sentence embedding (all-minilm-l6-v2)
    .venv/bin/python benchmarks/caption_sides.py --tokens   # with its word tokens (all-minilm-l6-v2+tokens)

Prints JSON: the mean distance between sides, presets and scene kinds, and per pair of sides.
"""
from __future__ import annotations

import itertools
import json
import statistics
import sys

from alaya_flash.model_zoo.text_encoder import CONTEXT_TOKENS, TextEncoder
from alaya_flash.streaming.world.traced.presets import SIDES, TRACED_PRESETS, caption
from alaya_flash.streaming.world.traced.scene import CONTENT


def distances(text) -> dict:
    """text: prompts -> (B, L, D) contexts (a TextEncoder)."""
    sunlit = [name for name, p in TRACED_PRESETS.items() if p.light is not None]  # captions naming a side
    kinds, sides = list(CONTENT), list(SIDES)
    keys = [(n, k, s) for n in sunlit for k in kinds for s in sides]
    emb = dict(zip(keys, text([caption(TRACED_PRESETS[n], k, s) for n, k, s in keys])))

    def mean(pairs) -> float:
        return statistics.mean(float((emb[a] - emb[b]).norm(dim=-1).max()) for a, b in pairs)

    report = {
        "sides": mean(((n, k, a), (n, k, b)) for n in sunlit for k in kinds for a, b in itertools.combinations(sides, 2)),
        "presets": mean(((a, k, s), (b, k, s)) for a, b in itertools.combinations(sunlit, 2) for k in kinds for s in sides),
        "scene_kinds": mean(((n, a, s), (n, b, s)) for n in sunlit for a, b in itertools.combinations(kinds, 2) for s in sides),
    }
    report["by_side_pair"] = {f"{a}-{b}": mean(((n, k, a), (n, k, b)) for n in sunlit for k in kinds)
                              for a, b in itertools.combinations(sides, 2)}
    return report


def main() -> int:
    print(json.dumps(distances(TextEncoder.load(tokens=CONTEXT_TOKENS if "--tokens" in sys.argv[1:] else 0)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
