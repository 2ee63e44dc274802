"""AlayaRenderer's prompt styles: keep a caption's content, swap its lighting for a named style.

AlayaRenderer's captions read "CONTENT; the scene is LIGHTING, creating a MOOD atmosphere." Its
inference script restyles a clip by keeping CONTENT and putting a style hint where the lighting
was; the hints are its `styles.json` (ShandaAI/AlayaRenderer,
game_editing/examples/wanvideo/model_inference/styles.json), quoted below as data. "original" keeps
the caption as it is.

Where the lighting part starts, as that script finds it (first rule that applies):

1. "; the scene is|feels|appears ..." (the first such clause), else the same after a comma:
   everything from there on is replaced;
2. else the first ", creating a(n) WORD" / "; creating ...": everything from there on is
   replaced, and a trailing ", under|with|lit by|illuminated by|in ..." clause before it too;
3. else the hint is appended to the whole caption (its final full stops dropped).

The result is "CONTENT; HINT".
"""
from __future__ import annotations

import re

from .errors import AlayaError

ORIGINAL = "original"
STYLES: dict[str, str | None] = {  # name -> the lighting part that replaces the caption's (None: the caption as it is)
    ORIGINAL: None,
    "bright_sunny": "the scene is bathed in bright, warm golden sunlight under a clear blue sky, creating a serene and "
                    "radiant atmosphere.",
    "snowy_winter": "the scene is set in a frozen, snow-covered environment under cold, pale winter light with falling "
                    "snowflakes, creating a silent and ethereal winter wonderland atmosphere.",
    "sunset_dramatic": "the scene is bathed in dramatic sunset light under a deep orange and crimson sky, with long "
                       "shadows and volumetric god rays, creating an epic and cinematic atmosphere.",
    "cyberpunk_neon": "the scene is illuminated by vibrant pink and blue neon lights with glowing holographic particles "
                      "and electric haze, creating a futuristic cyberpunk atmosphere.",
    "underwater": "the scene is submerged deep underwater under soft, filtered aquamarine light, with shimmering "
                  "caustics and drifting bubbles, creating a mysterious and tranquil deep-sea atmosphere.",
    "autumn_warm": "the scene is filled with vibrant autumn foliage and golden and crimson fallen leaves under warm amber "
                   "afternoon light, creating a cozy and nostalgic autumn atmosphere.",
    "moonlit_night": "the scene is set under a brilliant full moon, bathed in cool silver moonlight with fireflies "
                     "dancing in the darkness and stars visible overhead, creating a mystical and enchanting nighttime "
                     "atmosphere.",
}  # fmt: skip

_SCENE_AFTER = {sep: re.compile(sep + r"\s*the\s+scene\s+(?:is|feels|appears)\s+") for sep in (";", ",")}
_CREATING = re.compile(r"[,;]\s*creating\s+an?\s+\w+")
_LIGHTING = re.compile(r"[,;]\s*(?:under|with|lit by|illuminated by|in)\s+.*$", re.IGNORECASE)


def check_style(name: str) -> str:
    if name not in STYLES:
        raise AlayaError(f"style {name!r} is not one of AlayaRenderer's: {', '.join(STYLES)}")
    return name


def content_of(caption: str) -> str | None:
    """The content part of a caption (before its lighting part), or None when no lighting part is found."""
    for sep in (";", ","):  # a semicolon clause first, wherever it is
        found = _SCENE_AFTER[sep].search(caption)
        if found:
            return caption[: found.start()]
    found = _CREATING.search(caption)
    if found:
        content = caption[: found.start()]
        lighting = _LIGHTING.search(content)
        return content[: lighting.start()] if lighting else content
    return None


def styled(caption: str, style: str) -> str:
    """The caption with its lighting part replaced by the named style's (module docstring)."""
    hint = STYLES[check_style(style)]
    if hint is None:
        return caption
    content = content_of(caption)
    if content is None:
        content = caption.rstrip(".")
    return f"{content}; {hint}"
