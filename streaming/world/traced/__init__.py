"""World v2: streets, courtyards and interiors with path-traced ground truth (Mitsuba 3) and exact G-buffers.

scene.py (seeded scene descriptions: plain dataclasses) -> paths.py (walk, drive, orbit cameras)
-> gbuffers.py (exact numpy ray caster: the canonical passes) and render.py (Mitsuba 3: path-traced
truth and sun visibility from the same description) -> presets.py (lighting presets, the sun-side
convention, captions) -> source.py (TracedSource: a G-buffer stream with truth) and clip.py (the
`alaya-flash world --renderer pathtrace` folder). Mitsuba loads only when truth is rendered.
docs/world.md ("World v2") is the prose version.
"""
from .clip import write_traced_clip
from .gbuffers import GBufferCaster
from .presets import SIDES, TRACED_PRESETS, TracedPreset, caption, get_traced_preset
from .scene import KINDS, SceneDesc, make_scene
from .source import TracedConfig, TracedSource, TracedWorld

__all__ = ["write_traced_clip", "GBufferCaster", "SIDES", "TRACED_PRESETS", "TracedPreset", "caption",
           "get_traced_preset", "KINDS", "SceneDesc", "make_scene", "TracedConfig", "TracedSource", "TracedWorld"]
