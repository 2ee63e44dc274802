"""Prompts per lighting preset: the preset's own caption plus paraphrases, split train / held-out.

The G-buffer fixes what is in the scene; the prompt picks the lighting and mood. Each preset of
streaming/world/shading.py has 5 wordings: the first 3 (its caption and two paraphrases) are
used in training, the last 2 are never seen in training and measure whether the text encoder
(MiniLM sentence embeddings) carries meaning rather than memorised strings.
"""
from __future__ import annotations

from ...streaming.world.shading import PRESETS

PARAPHRASES: dict[str, tuple[str, ...]] = {
    "bright_sunny": (
        "toys bouncing around a courtyard on a clear, sunny day at noon with sharp shadows",
        "a walled yard of colourful toys in strong midday sunshine, blue sky overhead",
        "cheerful bright daylight: hard sun from high above, vivid colours and crisp shade",
        "a sunlit courtyard under a cloudless sky, harsh noon light, bold colours",
    ),
    "overcast": (
        "toys rolling in a courtyard on a dull grey cloudy day, soft even light",
        "a muted scene under thick clouds, diffuse lighting without sharp shadows",
        "flat, shadowless light from a grey sky over a walled yard of toys",
        "an overcast afternoon, gentle soft light and subdued colours, calm mood",
    ),
    "sunset_dramatic": (
        "toys in a courtyard at dusk, a low orange sun casting long dramatic shadows",
        "golden hour at sunset with a purple and orange sky, cinematic warm light",
        "the sun setting on the horizon bathes the yard in deep gold and long shadows",
        "evening twilight, the sky glowing orange and violet, a dramatic low sun",
    ),
    "moonlit_night": (
        "toys in a courtyard at night under pale blue moonlight, dark and quiet",
        "a dark nighttime scene lit only by the cold glow of the moon",
        "midnight in a walled yard, faint bluish moonlight and deep shadows",
        "a mysterious moonlit night, dim cool light under a black sky",
    ),
    "cyberpunk_neon": (
        "toys on a night street glowing with pink and blue neon signs in purple fog",
        "futuristic neon lighting, magenta and cyan glow through a violet haze",
        "an electric cyberpunk night lit by bright neon tubes in hazy purple air",
        "a city alley at night drenched in hot pink and teal neon light",
    ),
    "snowy_winter": (
        "toys in a snowy courtyard on a cold winter day, pale sky and light mist",
        "a crisp wintry scene with cold bright sunlight and a hazy white sky",
        "frosty winter daylight, misty air and a pale, icy atmosphere",
        "a serene snowy morning, cool white light and soft fog over the yard",
    ),
    "autumn_warm": (
        "toys in a courtyard in warm amber autumn light late in the afternoon",
        "a cosy fall afternoon, golden-orange sunlight and warm tones",
        "late-day autumn sunshine giving everything a warm honey-coloured glow",
        "a nostalgic autumn scene bathed in soft amber afternoon sun",
    ),
    "underwater": (
        "toys on the sea floor, blue-green light filtering down through the water",
        "an underwater scene with teal light and murky aquatic haze",
        "submerged beneath the ocean surface, dreamy cyan-green light from above",
        "deep underwater, everything tinted blue and green by the surrounding water",
    ),
}

TRAIN_WORDINGS = 3  # the caption + PARAPHRASES[name][:2]


def prompts(preset: str, split: str) -> list[str]:
    """Wordings of a preset for split 'train' (3) or 'heldout' (2)."""
    every = [PRESETS[preset].prompt, *PARAPHRASES[preset]]
    if split == "train":
        return every[:TRAIN_WORDINGS]
    if split == "heldout":
        return every[TRAIN_WORDINGS:]
    raise ValueError(f"prompt split {split!r} is not 'train' or 'heldout'")
